// Stream handles over HAL streams: the default stream (id 0) and, per priority level, a pool of
// kStreamPoolSize streams handed out round-robin (ids 1 + level * kStreamPoolSize + index, level
// 0 = priority 0, level 1 = kStreamPriorityHigh). HAL streams are created on first use and live
// for the process. The calling thread's current stream per device is thread-local.
#include "stream.h"

#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device.h"
#include "errors.h"
#include "graph.h"
#include "stream_registry.h"

namespace openneuron::runtime {
namespace {

constexpr int kPriorityLevels = 2;
constexpr int64_t kStreamsPerDevice = 1 + kPriorityLevels * kStreamPoolSize;

struct DeviceStreams {
  std::mutex mu;
  std::array<std::atomic<HalStream*>, kStreamsPerDevice> hal{};
  std::array<std::atomic<uint32_t>, kPriorityLevels> next{};
  std::atomic<bool> non_default_used{false};
  std::array<std::atomic<Graph*>, kStreamsPerDevice> capture{};
  std::atomic<int> capturing{0};  // streams with a graph in `capture`
};

struct Registry {
  int count = 0;
  std::unique_ptr<DeviceStreams[]> devices;
};

// NOTE: never destroyed, like the HAL: the streams it names outlive static destruction.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->count = device_count();
    reg->devices.reset(new DeviceStreams[reg->count > 0 ? reg->count : 1]);
    return reg;
  }();
  return *r;
}

DeviceStreams& streams_of(DeviceIndex d) {
  Registry& r = registry();
  if (d < 0 || d >= r.count) device_check(d);
  return r.devices[d];
}

int level_of(int priority) { return priority < 0 ? 1 : 0; }

void check_id(DeviceIndex d, int64_t id) {
  if (id < 0 || id >= kStreamsPerDevice) {
    throw DeviceError(
        "invalid stream id " + std::to_string(id) + " on neuron:" + std::to_string(d) +
        ": stream ids are 0 (default stream) to " + std::to_string(kStreamsPerDevice - 1) +
        "; use a Stream obtained from torch.neuron.Stream() or current_stream()");
  }
}

thread_local std::vector<int64_t> tl_current_stream;

}  // namespace

int Stream::priority() const {
  if (id_ <= 0) return 0;
  return (id_ - 1) / kStreamPoolSize == 0 ? 0 : kStreamPriorityHigh;
}

HalStream* Stream::hal_stream() const {
  DeviceStreams& ds = streams_of(device_);
  check_id(device_, id_);
  std::atomic<HalStream*>& slot = ds.hal[id_];
  HalStream* s = slot.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  std::lock_guard<std::mutex> lk(ds.mu);
  s = slot.load(std::memory_order_relaxed);
  if (s == nullptr) {
    s = hal().stream_create(device_, priority());
    slot.store(s, std::memory_order_release);
  }
  return s;
}

namespace detail {
std::atomic<FlushHook> flush_hook{nullptr};
}  // namespace detail

void set_flush_hook(FlushHook hook) { detail::flush_hook.store(hook, std::memory_order_release); }

void Stream::enqueue(Work work) const {
  run_flush_hook(FlushPoint::kEnqueue);
  if (Graph* g = stream_capture_graph(*this)) {
    g->record(*this, std::move(work));
    return;
  }
  hal().stream_enqueue(hal_stream(), std::move(work));
}

void Stream::memcpy(void* dst, const void* src, size_t bytes, CopyKind kind) const {
  run_flush_hook(FlushPoint::kMemcpy);
  if (Graph* g = stream_capture_graph(*this)) {
    if (kind != CopyKind::DeviceToDevice) {
      g->fail(std::string("a copy ") +
              (kind == CopyKind::HostToDevice ? "from the host to the device"
                                              : "from the device to the host") +
              " on a stream capturing a neuron graph (a graph replays device work only; copy "
              "into a static device tensor before replay() instead)");
    }
    Work w;
    w.fn = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
    w.name = "memcpy DtoD";
    w.replayable = true;
    g->record(*this, std::move(w));
    return;
  }
  hal().memcpy(dst, src, bytes, kind, hal_stream());
}

void Stream::synchronize() const {
  run_flush_hook(FlushPoint::kStreamSync);
  if (Graph* g = stream_capture_graph(*this)) {
    g->fail(
        "synchronize() on a stream capturing a neuron graph (its work has not run: it is "
        "recorded; synchronize after replay())");
  }
  hal().stream_sync(hal_stream());
}

bool Stream::query() const {
  run_flush_hook(FlushPoint::kStreamQuery);
  if (Graph* g = stream_capture_graph(*this)) {
    g->fail("query() on a stream capturing a neuron graph (its work is recorded, not run)");
  }
  DeviceStreams& ds = streams_of(device_);
  check_id(device_, id_);
  HalStream* s = ds.hal[id_].load(std::memory_order_acquire);
  return s == nullptr || hal().stream_query(s);
}

Stream stream_default(DeviceIndex d) {
  streams_of(d);
  return Stream(d, 0);
}

Stream stream_from_pool(DeviceIndex d, int priority) {
  DeviceStreams& ds = streams_of(d);
  const int level = level_of(priority);
  const uint32_t idx = ds.next[level].fetch_add(1, std::memory_order_relaxed) % kStreamPoolSize;
  ds.non_default_used.store(true, std::memory_order_relaxed);
  return Stream(d, 1 + static_cast<int64_t>(level) * kStreamPoolSize + idx);
}

Stream stream_from_id(DeviceIndex d, int64_t id) {
  DeviceStreams& ds = streams_of(d);
  check_id(d, id);
  if (id != 0) ds.non_default_used.store(true, std::memory_order_relaxed);
  return Stream(d, id);
}

Stream stream_current(DeviceIndex d) {
  streams_of(d);
  if (static_cast<size_t>(d) < tl_current_stream.size()) return Stream(d, tl_current_stream[d]);
  return Stream(d, 0);
}

void stream_set_current(const Stream& s) {
  DeviceStreams& ds = streams_of(s.device());
  check_id(s.device(), s.id());
  if (s.id() != 0) ds.non_default_used.store(true, std::memory_order_relaxed);
  if (static_cast<size_t>(s.device()) >= tl_current_stream.size()) {
    tl_current_stream.resize(s.device() + 1, 0);
  }
  tl_current_stream[s.device()] = s.id();
}

bool stream_non_default_used(DeviceIndex d) {
  return streams_of(d).non_default_used.load(std::memory_order_relaxed);
}

Graph* stream_capture_graph(const Stream& s) {
  DeviceStreams& ds = streams_of(s.device());
  if (ds.capturing.load(std::memory_order_acquire) == 0) return nullptr;
  check_id(s.device(), s.id());
  return ds.capture[s.id()].load(std::memory_order_acquire);
}

void stream_set_capture_graph(const Stream& s, Graph* g) {
  DeviceStreams& ds = streams_of(s.device());
  check_id(s.device(), s.id());
  if (g == nullptr) {
    if (ds.capture[s.id()].exchange(nullptr, std::memory_order_acq_rel) != nullptr) {
      ds.capturing.fetch_sub(1, std::memory_order_acq_rel);
    }
    return;
  }
  Graph* expected = nullptr;
  if (!ds.capture[s.id()].compare_exchange_strong(expected, g, std::memory_order_acq_rel)) {
    throw CaptureError("neuron:" + std::to_string(s.device()) + " stream " +
                       std::to_string(s.id()) +
                       " is already capturing a graph; end that capture first");
  }
  ds.capturing.fetch_add(1, std::memory_order_acq_rel);
}

bool device_capturing(DeviceIndex d) {
  return streams_of(d).capturing.load(std::memory_order_acquire) != 0;
}

void stream_sync_all(DeviceIndex d) {
  DeviceStreams& ds = streams_of(d);
  run_flush_hook(FlushPoint::kStreamSync);
  if (ds.capturing.load(std::memory_order_acquire) != 0) {
    for (auto& slot : ds.capture) {
      if (Graph* g = slot.load(std::memory_order_acquire)) {
        g->fail("a device-wide synchronize while a stream of neuron:" + std::to_string(d) +
                " captures a graph (its work is recorded, not run; synchronize after the "
                "capture ends)");
      }
    }
  }
  std::exception_ptr first;
  for (std::atomic<HalStream*>& slot : ds.hal) {
    HalStream* s = slot.load(std::memory_order_acquire);
    if (s == nullptr) continue;
    try {
      hal().stream_sync(s);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void stream_drain_all(DeviceIndex d) {
  run_flush_hook(FlushPoint::kStreamSync);
  for (std::atomic<HalStream*>& slot : streams_of(d).hal) {
    HalStream* s = slot.load(std::memory_order_acquire);
    if (s == nullptr) continue;
    while (!hal().stream_query(s)) std::this_thread::yield();
  }
}

}  // namespace openneuron::runtime
