// Streams as the layers above see them: cheap value handles (device, id) over HAL streams.
// Each device has a default stream (id 0) and pools of streams per priority, handed out
// round-robin like CUDA's; HAL streams behind them are created on first use. The calling
// thread's current stream is per device, the default stream until set.
#pragma once

#include <atomic>
#include <cstdint>

#include "hal.h"

namespace openneuron::runtime {

class Graph;  // graph.h

// Adaptive eager (csrc/aten/fusion) keeps recorded ops pending on the host. This hook runs first
// in every Stream/Event call that queues work, copies, or waits, so a pending group is always
// flushed (enqueued) before anything that could observe or reorder it. nullptr = no hook.
enum class FlushPoint : uint8_t {
  kEnqueue,
  kMemcpy,
  kStreamSync,
  kStreamQuery,
  kEventRecord,
  kEventWait,
  kEventQuery,
  kEventSync,
  kGraphCapture  // a graph capture begins or ends (graph.h)
};
using FlushHook = void (*)(FlushPoint);
void set_flush_hook(FlushHook hook);
namespace detail {
extern std::atomic<FlushHook> flush_hook;
}  // namespace detail
inline void run_flush_hook(FlushPoint p) {
  if (FlushHook h = detail::flush_hook.load(std::memory_order_acquire)) h(p);
}

constexpr int kStreamPoolSize = 32;      // streams per priority level per device
constexpr int kStreamPriorityHigh = -1;  // priorities are clamped to [kStreamPriorityHigh, 0]

class Stream {
 public:
  Stream() = default;  // device 0, default stream
  Stream(DeviceIndex device, int64_t id) : device_(device), id_(id) {}

  DeviceIndex device() const { return device_; }
  // 0 = default stream; otherwise a pool stream. Stable: stream_from_id(device, id) == *this.
  int64_t id() const { return id_; }
  int priority() const;
  // The HAL stream, created on first use. thread-safe.
  HalStream* hal_stream() const;

  // While a graph captures this stream (graph.h), enqueue and device-to-device memcpy record
  // into it; host copies, synchronize and query throw CaptureError.
  void enqueue(Work work) const;  // see Hal::stream_enqueue
  void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind) const;
  void synchronize() const;  // sync point
  bool query() const;

  bool operator==(const Stream& o) const { return device_ == o.device_ && id_ == o.id_; }
  bool operator!=(const Stream& o) const { return !(*this == o); }

 private:
  DeviceIndex device_ = 0;
  int64_t id_ = 0;
};

Stream stream_default(DeviceIndex d);
// Next stream of the pool for this priority (clamped), round-robin.
Stream stream_from_pool(DeviceIndex d, int priority = 0);
// Inverse of Stream::id(); throws DeviceError for an id that names no stream.
Stream stream_from_id(DeviceIndex d, int64_t id);
// The calling thread's current stream on d (the default stream until set).
Stream stream_current(DeviceIndex d);
void stream_set_current(const Stream& s);
// Whether any stream but the default one has been handed out on d (by the pool, by id, or
// made current). While false, every block of d was allocated and used on the default stream
// (adaptive eager relies on this to free a pending group's dead inputs early). thread-safe.
bool stream_non_default_used(DeviceIndex d);

// The graph capturing s's work, or nullptr. thread-safe, lock-free.
Graph* stream_capture_graph(const Stream& s);
// Starts (g) or ends (nullptr) s's capture; Graph's own. Throws CaptureError when s already
// captures into another graph.
void stream_set_capture_graph(const Stream& s, Graph* g);
// Whether any stream of d captures (a device-wide sync then throws CaptureError).
bool device_capturing(DeviceIndex d);

}  // namespace openneuron::runtime
