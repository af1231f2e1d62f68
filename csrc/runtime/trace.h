// Device-side trace for the profiler: while a session is active, each executor records one
// Record per work item (op name, device, stream, start/end time, the correlation id of the host
// op that enqueued it). Off by default; the work queue's per-item cost when off is one relaxed
// atomic load. Bounded: at most `capacity` records per session, later ones are counted as
// dropped. Sessions nest (a count); the buffer is cleared when the outermost session stops.
// No torch includes: csrc/aten/profiler.cpp turns records into kineto activities.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace openneuron::runtime::trace {

struct Record {
  const char* name = "";     // Work::name (static storage)
  uint64_t correlation = 0;  // host op's profiler correlation id; 0 = unknown
  uint64_t seq = 0;          // Work::seq
  int64_t enqueue_ns = 0;    // now_ns() when the host enqueued the item; 0 = unknown
  int64_t start_ns = 0;      // now_ns() when the executor started the item
  int64_t end_ns = 0;        // now_ns() when it returned
  int32_t host_thread = 0;   // system thread id of the enqueuing host thread
  int32_t device = -1;
  int32_t stream = -1;  // the HAL stream's number on its device (creation order)
};

// What the work queue notes when an item is enqueued during a session (launch_now()).
struct Launch {
  uint64_t ticket = 0;  // the queue ticket it was noted for (a stale slot has an older one)
  uint64_t correlation = 0;
  int64_t enqueue_ns = 0;
  int32_t host_thread = 0;
};

// Where a queue's records go: parsed once from the queue's name ("neuron<d>:s<n>"); other
// names get device -1 and a process-unique stream number.
struct QueueId {
  int32_t device = -1;
  int32_t stream = -1;
};
QueueId queue_id(const std::string& queue_name);

namespace detail {
extern std::atomic<bool> g_enabled;
}
// True while a session is active. The hot-path check.
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// The profiler's clock: CLOCK_REALTIME in nanoseconds (c10::getTime()'s clock, which the
// PyTorch profiler stamps host events with).
int64_t now_ns() noexcept;

constexpr size_t kDefaultCapacity = size_t{1} << 20;
// OPENNEURON_PROFILER_MAX_EVENTS if set to a positive integer, else kDefaultCapacity.
size_t capacity_from_env();

// Begins a session (nested: increments the count). The first session clears the buffer and
// sets its capacity (later nested starts keep it). Returns the session's start time.
int64_t session_start(size_t capacity = capacity_from_env());
// Ends a session: returns the records that started at or after `since_ns` (its start time),
// ordered by start time; when the outermost session ends, clears the buffer (memory released).
std::vector<Record> session_stop(int64_t since_ns);
// Active session count.
int sessions();

// Appends r if a session is active and the buffer has room (else counts it as dropped).
// thread-safe; called by executor threads.
void record(const Record& r) noexcept;
// Records held now, and records dropped (buffer full) since the outermost session began.
size_t size();
size_t dropped();

// The calling thread's current profiler correlation id (the innermost host op being
// profiled), captured when work is enqueued. A stack per thread.
void push_correlation(uint64_t id) noexcept;
void pop_correlation() noexcept;
uint64_t current_correlation() noexcept;
// The calling thread's correlation id, the time and its system thread id.
Launch launch_now() noexcept;

}  // namespace openneuron::runtime::trace
