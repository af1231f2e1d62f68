// The shared-memory segment of a ShmComm (segment.h): layout arithmetic, POSIX shm
// create/open/map/unlink, futex sleep/wake and peer-process liveness. The protocol that uses
// them (join, steps, channels) is in shm_comm.cpp and p2p.cpp.
#include "segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "runtime/work_queue.h"
#include "shm_comm.h"

namespace openneuron::collectives::shm {
namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string errno_text(int err) { return std::string(std::strerror(err)); }

}  // namespace

void futex_wake_all(Futex& f) noexcept {
  f.word.fetch_add(1, std::memory_order_seq_cst);
  if (f.waiters.load(std::memory_order_seq_cst) == 0) return;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&f.word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

void futex_sleep(Futex& f, uint32_t seen, std::chrono::nanoseconds max) noexcept {
  if (max.count() <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(max.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(max.count() % 1000000000);
  // NOTE: not FUTEX_WAIT_PRIVATE: the word is shared with other processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&f.word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

Layout Layout::compute(int size, size_t slot_bytes, size_t channel_bytes) {
  const size_t n = static_cast<size_t>(size);
  Layout l;
  l.half = slot_bytes / 2 / 64 * 64;
  l.channel_bytes = round_up(channel_bytes, 64);
  l.ranks = round_up(sizeof(Control), kLine);
  l.a2a = l.ranks + n * sizeof(RankBlock);
  l.channels = round_up(l.a2a + 2 * n * 2 * n * sizeof(uint64_t), kLine);
  l.channel_stride = round_up(sizeof(Channel) + l.channel_bytes, kLine);
  l.slots = round_up(l.channels + n * n * l.channel_stride, 4096);
  l.total = l.slots + n * 2 * l.half;
  return l;
}

Mapping::~Mapping() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

Mapping segment_create(const std::string& name, size_t bytes, const std::string& who) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    throw CommError(who + " could not create the shared-memory segment " + name + ": " +
                    errno_text(err) +
                    (err == EEXIST ? " (another group uses this name, or a crashed run left it: "
                                     "remove /dev/shm" +
                                         name + ")"
                                   : " (check that /dev/shm is mounted and writable)"));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw CommError(who + " could not size the shared-memory segment " + name + " to " +
                    std::to_string(bytes) + " bytes: " + errno_text(err) +
                    " (is /dev/shm large enough? lower slot_bytes/channel_bytes)");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CommError(who + " could not map the shared-memory segment " + name + ": " +
                    errno_text(err));
  }
  // NOTE: the pages are zero-filled (ftruncate); constructing the control block starts the
  // atomics' lifetimes. The per-rank blocks, channels and tables are all-zero atomics too.
  new (base) Control();
  return Mapping(base, bytes);
}

Mapping segment_open(const std::string& name, size_t bytes, Clock::time_point deadline,
                     const std::string& who) {
  auto pause = std::chrono::microseconds(200);
  std::string missing = "rank 0 never created it";
  for (;;) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd >= 0) {
      struct stat st;
      const bool sized = fstat(fd, &st) == 0 && st.st_size != 0;
      if (sized && static_cast<size_t>(st.st_size) != bytes) {
        close(fd);
        throw CommError(who + ": the shared-memory segment " + name + " has " +
                        std::to_string(st.st_size) + " bytes where this rank expects " +
                        std::to_string(bytes) +
                        ": the ranks disagree on the world size, slot_bytes or channel_bytes");
      }
      if (sized) {
        void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        const int err = errno;
        close(fd);
        if (base == MAP_FAILED) {
          throw CommError(who + " could not map the shared-memory segment " + name + ": " +
                          errno_text(err));
        }
        Mapping m(base, bytes);
        auto* ctl = reinterpret_cast<Control*>(base);
        while (ctl->magic.load(std::memory_order_acquire) != kMagic) {
          if (Clock::now() > deadline) {
            missing = "rank 0 created it but never initialized it";
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        if (ctl->magic.load(std::memory_order_acquire) == kMagic) return m;
      } else {
        close(fd);
        missing = "rank 0 created it but never sized it";
      }
    } else if (errno != ENOENT) {
      const int err = errno;
      throw CommError(who + " could not open the shared-memory segment " + name + ": " +
                      errno_text(err));
    }
    if (Clock::now() > deadline) {
      throw CommError(who + " timed out waiting for the shared-memory segment " + name + " (" +
                      missing +
                      "): check that rank 0 of the group runs and joins with the same name");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

void segment_unlink(const std::string& name) noexcept { shm_unlink(name.c_str()); }

bool process_exited(pid_t pid) noexcept {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // NOTE: an exited child that its parent has not reaped yet still answers kill(pid, 0).
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return errno == ENOENT;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the state follows "pid (comm) "
  if (paren == nullptr || paren[1] == '\0') return false;
  const char state = paren[2];
  return state == 'Z' || state == 'X' || state == 'x';
}

bool Spinner::step() noexcept {
  constexpr unsigned kBusySpins = 256;
  if (i_ == 0) start_ = Clock::now();
  ++i_;
  if (i_ < kBusySpins) {
    runtime::cpu_relax();
    return true;
  }
  if ((i_ & 7) == 0 && Clock::now() - start_ > budget_) return false;
  sched_yield();
  return true;
}

}  // namespace openneuron::collectives::shm
