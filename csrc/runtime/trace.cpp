// The device trace buffer (trace.h): one mutex-guarded vector shared by every executor,
// touched only while a profiling session is active.
#include "trace.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>

#include "config.h"

namespace openneuron::runtime::trace {
namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

struct Buffer {
  std::mutex mu;
  int sessions = 0;
  size_t capacity = 0;
  size_t dropped = 0;
  std::vector<Record> records;
};

// NOTE: never destroyed: executor threads may record during static destruction at exit.
Buffer& buffer() {
  static auto* b = new Buffer;
  return *b;
}

constexpr int kMaxCorrelationDepth = 64;
struct CorrelationStack {
  uint64_t ids[kMaxCorrelationDepth] = {};
  int depth = 0;  // may exceed kMaxCorrelationDepth; deeper ids are not kept
};
thread_local CorrelationStack tl_correlation;
thread_local int32_t tl_thread_id = 0;

std::atomic<int32_t> g_other_queues{0};

}  // namespace

QueueId queue_id(const std::string& name) {
  QueueId id;
  int d = -1, s = -1, consumed = 0;
  if (std::sscanf(name.c_str(), "neuron%d:s%d%n", &d, &s, &consumed) == 2 &&
      static_cast<size_t>(consumed) == name.size() && d >= 0 && s >= 0) {
    id.device = d;
    id.stream = s;
  } else {
    id.stream = g_other_queues.fetch_add(1, std::memory_order_relaxed);
  }
  return id;
}

int64_t now_ns() noexcept {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

size_t capacity_from_env() {
  const size_t n = config_or_defaults().profiler_max_events;
  return n == 0 ? kDefaultCapacity : n;
}

int64_t session_start(size_t capacity) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lk(b.mu);
  if (b.sessions++ == 0) {
    b.records.clear();
    b.dropped = 0;
    b.capacity = capacity == 0 ? kDefaultCapacity : capacity;
    b.records.reserve(std::min<size_t>(b.capacity, 4096));
    detail::g_enabled.store(true, std::memory_order_seq_cst);
  }
  return now_ns();
}

std::vector<Record> session_stop(int64_t since_ns) {
  Buffer& b = buffer();
  std::vector<Record> out;
  {
    std::lock_guard<std::mutex> lk(b.mu);
    if (b.sessions == 0) return out;
    if (--b.sessions == 0) {
      detail::g_enabled.store(false, std::memory_order_seq_cst);
      out.swap(b.records);
      std::vector<Record>().swap(b.records);  // release the memory
    } else {
      out = b.records;
    }
  }
  if (since_ns != 0) {
    out.erase(std::remove_if(out.begin(), out.end(),
                             [&](const Record& r) { return r.start_ns < since_ns; }),
              out.end());
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Record& a, const Record& c) { return a.start_ns < c.start_ns; });
  return out;
}

int sessions() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lk(b.mu);
  return b.sessions;
}

void record(const Record& r) noexcept {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lk(b.mu);
  if (b.sessions == 0) return;
  if (b.records.size() >= b.capacity) {
    ++b.dropped;
    return;
  }
  try {
    b.records.push_back(r);
  } catch (const std::bad_alloc&) {
    ++b.dropped;
  }
}

size_t size() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lk(b.mu);
  return b.records.size();
}

size_t dropped() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lk(b.mu);
  return b.dropped;
}

void push_correlation(uint64_t id) noexcept {
  CorrelationStack& s = tl_correlation;
  if (s.depth < kMaxCorrelationDepth) s.ids[s.depth] = id;
  ++s.depth;
}

void pop_correlation() noexcept {
  CorrelationStack& s = tl_correlation;
  if (s.depth > 0) --s.depth;
}

uint64_t current_correlation() noexcept {
  const CorrelationStack& s = tl_correlation;
  if (s.depth == 0) return 0;
  return s.ids[std::min(s.depth, kMaxCorrelationDepth) - 1];
}

Launch launch_now() noexcept {
  Launch l;
  l.correlation = current_correlation();
  l.enqueue_ns = now_ns();
  if (tl_thread_id == 0) tl_thread_id = static_cast<int32_t>(syscall(SYS_gettid));
  l.host_thread = tl_thread_id;
  return l;
}

}  // namespace openneuron::runtime::trace
