// The hardware abstraction layer: the one interface between OpenNeuron and a device.
// Everything above csrc/runtime talks to the device only through the runtime API
// (device.h, stream.h, event.h, caching_allocator.h), which sits on this class.
// The software NeuronCore (software_core.cpp) is the built-in implementation; a hardware
// runtime would be a second one. No torch headers here or in any implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "work_fn.h"

namespace openneuron::runtime {

using DeviceIndex = int;

struct DeviceProps {
  std::string name;           // e.g. "NeuronCore-v3 (software)"
  uint64_t total_memory = 0;  // capacity in bytes
  int cores = 0;              // host cores backing the device's compute
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

// A unit of work on a stream. On the software device it is a host callable run by the stream's
// executor thread; on hardware it would be a loaded program. The callable may be destroyed
// well after it ran (when its queue slot is reused), so it must not own device memory or
// anything whose release a sync point should observe: device buffers are kept valid by stream
// order instead (caching_allocator.h).
struct Work {
  WorkFn fn;
  const char* name = "";  // op name; must have static storage duration
  uint32_t origin = 0;    // id in the origin table (origin.h); 0 = unknown
  uint64_t seq = 0;       // per-device sequence number, set by the HAL at enqueue
  // Whether fn may run again with the same effect, as a graph replay runs it (graph.h): it
  // reads no state it consumes and takes no per-launch value (a random seed, a message).
  bool replayable = false;
};

struct HalStream;  // opaque, owned by the HAL
struct HalEvent;   // opaque, owned by the HAL

class Hal {
 public:
  virtual ~Hal() = default;

  // Number of devices; must not throw (0 when the configuration is invalid).
  virtual int device_count() const noexcept = 0;
  // Name, capacity and cores of device d; must not throw (empty props for a bad index).
  virtual DeviceProps device_props(DeviceIndex d) const noexcept = 0;
  // Free and total raw device memory in bytes (free = capacity - bytes held by mem_alloc).
  virtual void memory_info(DeviceIndex d, uint64_t* free, uint64_t* total) = 0;

  // Raw device memory, 64-byte aligned (at least). Returns nullptr when the device's capacity
  // would be exceeded; never throws for that. The caching allocator sits above. thread-safe.
  virtual void* mem_alloc(DeviceIndex d, uint64_t bytes) = 0;
  // Returns memory from mem_alloc. The caller guarantees no queued work still uses it.
  virtual void mem_free(DeviceIndex d, void* ptr) = 0;

  // Copies bytes, ordered after earlier work on s; returns at once (asynchronous). The caller
  // keeps src and dst valid until the copy has run (e.g. by recording an event).
  virtual void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, HalStream* s) = 0;

  // In-order work queues. priority: 0 = normal, negative = higher (as in CUDA).
  virtual HalStream* stream_create(DeviceIndex d, int priority) = 0;
  // Waits for the stream's work, then releases it.
  virtual void stream_destroy(HalStream* s) = 0;
  // Blocks until all work enqueued so far on s has run. Sync point: throws AsyncError if work
  // on s's device failed since the last sync point.
  virtual void stream_sync(HalStream* s) = 0;
  // True when all work enqueued so far on s has run. Does not throw async errors.
  virtual bool stream_query(HalStream* s) = 0;
  // Enqueues work; returns at once unless NEURON_LAUNCH_BLOCKING=1 (then it waits for the work
  // and throws its error, if any). Blocks while the stream already holds kMaxQueuedWork items.
  virtual void stream_enqueue(HalStream* s, Work work) = 0;
  virtual DeviceIndex stream_device(HalStream* s) const = 0;

  // Events. flags: kEventTiming records a timestamp when the event is reached.
  virtual HalEvent* event_create(unsigned flags) = 0;
  virtual void event_destroy(HalEvent* e) = 0;
  // Marks the point in s's queue reached by all work enqueued so far.
  virtual void event_record(HalEvent* e, HalStream* s) = 0;
  // Work enqueued on s after this call waits until e's latest record has been reached.
  // A never-recorded event is already complete.
  virtual void stream_wait_event(HalStream* s, HalEvent* e) = 0;
  // Blocks until e's latest record has been reached. Sync point (throws AsyncError).
  virtual void event_sync(HalEvent* e) = 0;
  virtual bool event_query(HalEvent* e) = 0;
  // Milliseconds between two reached, timing-enabled records; throws Error otherwise.
  virtual float event_elapsed_ms(HalEvent* start, HalEvent* end) = 0;
};

constexpr unsigned kEventDefault = 0;
constexpr unsigned kEventTiming = 1;
constexpr size_t kMaxQueuedWork = 1024;  // per stream, like CUDA's launch queue depth

// The process-wide HAL (the software NeuronCore). Created on first use from the environment
// (config.h); throws ConfigError if the environment is invalid.
Hal& hal();

}  // namespace openneuron::runtime
