// Internal to csrc/collectives: the shared-memory segment of one ShmComm — its layout (control
// block, per-rank blocks, all-to-all size table, per-pair channels, per-rank data slots), the
// POSIX shm create/open/unlink/map calls, and the futex wait/wake on words inside it. Knows
// nothing of the algorithms (shm_comm.cpp) or of messages (p2p.cpp).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace openneuron::collectives::shm {

using Clock = std::chrono::steady_clock;

// NOTE: 128, not 64: x86 prefetches cache lines in pairs, so words that different ranks write
// stay 128 bytes apart.
constexpr size_t kLine = 128;
constexpr uint64_t kMagic = 0x4f4e2d434f4c4c31;  // "ON-COLL1", set last by rank 0
constexpr size_t kAbortMessageBytes = 1024;

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
// The futex syscall takes the address of the 32-bit word inside the atomic.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

// A 32-bit word that waiters sleep on (FUTEX_WAIT, shared: the word is in a MAP_SHARED
// mapping) and that every rank which advances shared state bumps. `waiters` lets the advancing
// rank skip the FUTEX_WAKE syscall when nobody sleeps.
struct Futex {
  std::atomic<uint32_t> word;
  std::atomic<uint32_t> waiters;
};

// Bumps the word and wakes every sleeper. Call after publishing the state a waiter checks.
void futex_wake_all(Futex& f) noexcept;
// Sleeps while the word still equals `seen`, at most `max` (spurious returns are fine).
void futex_sleep(Futex& f, uint32_t seen, std::chrono::nanoseconds max) noexcept;

enum RankState : uint32_t { kAbsent = 0, kJoined = 1, kLeft = 2 };

// One rank's own words: written by that rank, read by all.
struct alignas(kLine) RankBlock {
  std::atomic<uint64_t> arrived;  // collective steps this rank has published its part of
  std::atomic<int32_t> pid;       // set at join
  std::atomic<uint32_t> state;    // RankState
  // The call descriptor of this rank's collective call `seq`, at [seq % 2]: seq, packed
  // (op, dtype, reduce op, root) and count. Two, so a rank that runs ahead into the next call
  // never overwrites the one its peers still compare.
  std::atomic<uint64_t> desc[2][3];
};

struct alignas(kLine) Control {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> size;
  std::atomic<uint64_t> slot_bytes;
  std::atomic<uint64_t> channel_bytes;
  std::atomic<uint32_t> joined;  // ranks that have attached
  alignas(kLine) Futex coll;     // the collectives' steps and the join
  // 0: no failure; 1: a rank is writing its message; 2: abort_rank and abort_message are set.
  alignas(kLine) std::atomic<uint32_t> abort_state;
  std::atomic<int32_t> abort_rank;
  char abort_message[kAbortMessageBytes];  // written before abort_state = 2 (release)
};

// A one-way ring from a sender to a receiver: head (bytes written) belongs to the sender, tail
// (bytes consumed) to the receiver; both only grow. The data follow the header.
struct alignas(kLine) Channel {
  alignas(kLine) std::atomic<uint64_t> head;
  alignas(kLine) std::atomic<uint64_t> tail;
  alignas(kLine) Futex futex;
};

// Where everything lies in the segment, from (size, slot_bytes, channel_bytes).
struct Layout {
  size_t ranks = 0;           // RankBlock[size]
  size_t a2a = 0;             // uint64 atomics [2 parities][size senders][2 (send, recv)][size]
  size_t channels = 0;        // (Channel + channel_bytes) [size * size], index sender*size+receiver
  size_t channel_stride = 0;  // bytes per channel, header included
  size_t slots = 0;           // data [size ranks][2 halves][half], page aligned
  size_t half = 0;            // bytes per slot half (slot_bytes / 2, a multiple of 64)
  size_t channel_bytes = 0;   // ring capacity
  size_t total = 0;
  static Layout compute(int size, size_t slot_bytes, size_t channel_bytes);
};

// A mapped segment. Movable, unmapped on destruction; never unlinks by itself.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept : base_(o.base_), bytes_(o.bytes_) { o.base_ = nullptr; }
  Mapping& operator=(Mapping&&) = delete;
  Mapping(const Mapping&) = delete;
  ~Mapping();
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// Rank 0: creates `name` (O_EXCL, owner-only) of `bytes` bytes, maps it and constructs the
// control block (magic last). Throws CommError (message prefixed with `who`).
Mapping segment_create(const std::string& name, size_t bytes, const std::string& who);
// Other ranks: opens `name` once rank 0 has created and sized it, maps it and waits for the
// magic, until `deadline`. Throws CommError naming what was not there.
Mapping segment_open(const std::string& name, size_t bytes, Clock::time_point deadline,
                     const std::string& who);
void segment_unlink(const std::string& name) noexcept;  // ENOENT is fine

// Whether the process `pid` has exited (gone, or a zombie not yet reaped). Never throws.
bool process_exited(pid_t pid) noexcept;

// Spins politely: a few hundred pauses, then yields. Returns false after ~`budget`.
class Spinner {
 public:
  explicit Spinner(std::chrono::microseconds budget) : budget_(budget) {}
  bool step() noexcept;

 private:
  std::chrono::microseconds budget_;
  unsigned i_ = 0;
  Clock::time_point start_{};
};

}  // namespace openneuron::collectives::shm
