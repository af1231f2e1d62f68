// The software NeuronCore: the built-in Hal. Device memory is host memory (mmap for large
// blocks, so untouched pages cost nothing) under a per-device capacity; streams are WorkQueues
// (work_queue.h); events are positions in those queues; a failing work item is kept per device
// and raised at that device's next sync point. Not thread pools or kernels: those live above.
#include "software_core.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "errors.h"
#include "origin.h"
#include "work_queue.h"

namespace openneuron::runtime {
namespace {

constexpr uint64_t kSmallAlign = 64;
constexpr uint64_t kPageAlign = 4096;
constexpr uint64_t kMmapThreshold = 64 * 1024;
constexpr auto kExitDrainLimit = std::chrono::seconds(10);

uint64_t round_up(uint64_t n, uint64_t m) { return (n + m - 1) / m * m; }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string device_name(DeviceIndex d) { return "neuron:" + std::to_string(d); }

// One device: memory accounting and the first asynchronous error since the last sync point.
class DeviceState : public ErrorSink {
 public:
  DeviceState(DeviceIndex index, uint64_t capacity) : index_(index), capacity_(capacity) {}

  DeviceIndex index() const { return index_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
  int next_stream() { return streams_.fetch_add(1, std::memory_order_relaxed); }

  void* alloc(uint64_t bytes) {
    const uint64_t size =
        round_up(std::max<uint64_t>(bytes, 1), bytes >= kMmapThreshold ? kPageAlign : kSmallAlign);
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + size > capacity_) return nullptr;
    } while (!used_.compare_exchange_weak(used, used + size, std::memory_order_relaxed));
    void* p = nullptr;
    if (size >= kMmapThreshold) {
      p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = nullptr;
    } else {
      p = std::aligned_alloc(kSmallAlign, size);
    }
    if (p == nullptr) {
      used_.fetch_sub(size, std::memory_order_relaxed);
      return nullptr;
    }
    std::lock_guard<std::mutex> lk(mem_mu_);
    blocks_.emplace(p, size);
    return p;
  }

  void free(void* p) {
    uint64_t size = 0;
    {
      std::lock_guard<std::mutex> lk(mem_mu_);
      auto it = blocks_.find(p);
      if (it == blocks_.end()) {
        throw DeviceError("mem_free: " + device_name(index_) +
                          " did not allocate this pointer (double free or wrong device)");
      }
      size = it->second;
      blocks_.erase(it);
    }
    if (size >= kMmapThreshold) {
      ::munmap(p, size);
    } else {
      std::free(p);
    }
    used_.fetch_sub(size, std::memory_order_relaxed);
  }

  void on_error(const Work& work, const char* what) noexcept override {
    try {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (has_error_.load(std::memory_order_relaxed)) return;
      err_name_ = (work.name != nullptr && *work.name) ? work.name : "work item";
      err_seq_ = work.seq;
      err_origin_ = work.origin;
      err_what_ = what;
      has_error_.store(true, std::memory_order_release);
    } catch (...) {
      // NOTE: out of memory while recording an error: nothing better to do than drop it.
    }
  }

  // Throws AsyncError for the pending error, if any, and clears it. Called at sync points.
  void raise_pending() {
    if (!has_error_.load(std::memory_order_acquire)) return;
    std::string name, what;
    uint64_t seq = 0;
    uint32_t origin = 0;
    {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (!has_error_.load(std::memory_order_relaxed)) return;
      name.swap(err_name_);
      what.swap(err_what_);
      seq = err_seq_;
      origin = err_origin_;
      has_error_.store(false, std::memory_order_release);
    }
    // NOTE: the origin is resolved here, on the thread at the sync point, never on the
    // executor: the resolver may take the GIL, which that thread may be holding.
    const std::string where = origin_describe(origin);
    std::string msg = device_name(index_) + ": " + name + " (op #" + std::to_string(seq);
    if (!where.empty()) msg += ", enqueued at " + where;
    msg += ") failed asynchronously: " + what;
    throw AsyncError(msg);
  }

 private:
  const DeviceIndex index_;
  const uint64_t capacity_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> seq_{0};
  std::atomic<int> streams_{0};
  std::mutex mem_mu_;
  std::unordered_map<void*, uint64_t> blocks_;

  std::mutex err_mu_;
  std::atomic<bool> has_error_{false};
  std::string err_name_, err_what_;
  uint64_t err_seq_ = 0;
  uint32_t err_origin_ = 0;
};

}  // namespace

struct HalStream {
  HalStream(DeviceState* d, int prio, const std::string& name)
      : device(d), priority(prio), queue(std::make_shared<WorkQueue>(d, name)) {}
  DeviceState* device;
  int priority;
  std::shared_ptr<WorkQueue> queue;
};

// NOTE: an event is a position (queue, ticket) in a stream: recording enqueues nothing (so it
// never blocks on a full queue) unless the event takes timestamps; then a marker item stamps
// the time when the executor reaches it. Reference counted: the owner holds one reference and
// each queued marker one, so destroying an event with a pending record is safe (as in CUDA).
struct HalEvent {
  explicit HalEvent(unsigned f) : flags(f) {}
  const unsigned flags;
  std::atomic<int> refs{1};
  std::mutex mu;                           // guards everything below
  std::shared_ptr<const WorkQueue> queue;  // stream of the latest record; null: never recorded
  uint64_t ticket = 0;  // the latest record is reached once queue->done() >= ticket
  DeviceIndex device = -1;
  uint64_t records = 0;      // records so far
  uint64_t stamp_count = 0;  // which record stamp_ns belongs to
  int64_t stamp_ns = 0;
};

namespace {

struct EventPoint {
  std::shared_ptr<const WorkQueue> queue;
  uint64_t ticket = 0;
  DeviceIndex device = -1;
  bool reached() const { return queue == nullptr || queue->done() >= ticket; }
};

EventPoint event_point(HalEvent* e) {
  std::lock_guard<std::mutex> lk(e->mu);
  return {e->queue, e->ticket, e->device};
}

void event_release(HalEvent* e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete e;
}

// The queue item of a timing record; trivially copyable and 16 bytes, so std::function stores
// it without a heap allocation.
struct EventStamp {
  HalEvent* e;
  uint64_t n;
  void operator()() const {
    {
      std::lock_guard<std::mutex> lk(e->mu);
      if (n > e->stamp_count) {
        e->stamp_count = n;
        e->stamp_ns = now_ns();
      }
    }
    event_release(e);
  }
};

const char* copy_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice:
      return "memcpy HtoD";
    case CopyKind::DeviceToHost:
      return "memcpy DtoH";
    case CopyKind::DeviceToDevice:
      return "memcpy DtoD";
  }
  return "memcpy";
}

class SoftwareCore;

// Live software cores, drained at process exit (see drain_at_exit).
struct LiveCores {
  std::mutex mu;
  std::unordered_set<SoftwareCore*> cores;
};
LiveCores& live_cores() {
  static auto* l = new LiveCores;
  return *l;
}
void drain_at_exit();

class SoftwareCore final : public Hal {
 public:
  explicit SoftwareCore(const Config& config) : launch_blocking_(config.launch_blocking) {
    for (size_t i = 0; i < config.visible_cores.size(); ++i) {
      devices_.emplace_back(
          std::make_unique<DeviceState>(static_cast<DeviceIndex>(i), config.device_memory));
    }
    const unsigned hw = std::thread::hardware_concurrency();
    host_cores_ = hw == 0 ? 1 : static_cast<int>(hw);
    static std::once_flag registered;
    std::call_once(registered, [] { std::atexit(drain_at_exit); });
    LiveCores& live = live_cores();
    std::lock_guard<std::mutex> lk(live.mu);
    live.cores.insert(this);
  }

  ~SoftwareCore() override {
    {
      LiveCores& live = live_cores();
      std::lock_guard<std::mutex> lk(live.mu);
      live.cores.erase(this);
    }
    std::lock_guard<std::mutex> lk(streams_mu_);
    for (HalStream* s : streams_) {
      s->queue->shutdown();
      delete s;
    }
    streams_.clear();
  }

  // Lets queued work finish (until `deadline`), without raising its errors.
  void drain(std::chrono::steady_clock::time_point deadline) {
    std::lock_guard<std::mutex> lk(streams_mu_);
    for (HalStream* s : streams_) {
      const uint64_t ticket = s->queue->pushed();
      while (s->queue->done() < ticket && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  int device_count() const noexcept override { return static_cast<int>(devices_.size()); }

  DeviceProps device_props(DeviceIndex d) const noexcept override {
    DeviceProps p;
    if (d < 0 || d >= device_count()) return p;
    try {
      p.name = "NeuronCore-v3 (software)";
    } catch (...) {
      return p;
    }
    p.total_memory = devices_[d]->capacity();
    p.cores = host_cores_;
    return p;
  }

  void memory_info(DeviceIndex d, uint64_t* free, uint64_t* total) override {
    DeviceState& dev = device(d);
    const uint64_t used = dev.used();
    if (total) *total = dev.capacity();
    if (free) *free = used >= dev.capacity() ? 0 : dev.capacity() - used;
  }

  void* mem_alloc(DeviceIndex d, uint64_t bytes) override { return device(d).alloc(bytes); }
  void mem_free(DeviceIndex d, void* ptr) override {
    if (ptr != nullptr) device(d).free(ptr);
  }

  void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, HalStream* s) override {
    Work w;
    w.fn = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
    w.name = copy_name(kind);
    stream_enqueue(s, std::move(w));
  }

  HalStream* stream_create(DeviceIndex d, int priority) override {
    DeviceState& dev = device(d);
    auto* s = new HalStream(
        &dev, priority, "neuron" + std::to_string(d) + ":s" + std::to_string(dev.next_stream()));
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.insert(s);
    return s;
  }

  void stream_destroy(HalStream* s) override {
    if (s == nullptr) return;
    {
      std::lock_guard<std::mutex> lk(streams_mu_);
      streams_.erase(s);
    }
    s->queue->shutdown();
    delete s;
  }

  void stream_sync(HalStream* s) override {
    s->queue->wait(s->queue->pushed());
    s->device->raise_pending();
  }

  bool stream_query(HalStream* s) override { return s->queue->done() >= s->queue->pushed(); }

  void stream_enqueue(HalStream* s, Work work) override {
    work.seq = s->device->next_seq();
    const uint64_t ticket = s->queue->push(std::move(work));
    if (launch_blocking_) {
      s->queue->wait(ticket);
      s->device->raise_pending();
    }
  }

  DeviceIndex stream_device(HalStream* s) const override { return s->device->index(); }

  HalEvent* event_create(unsigned flags) override { return new HalEvent(flags); }

  void event_destroy(HalEvent* e) override {
    if (e != nullptr) event_release(e);
  }

  void event_record(HalEvent* e, HalStream* s) override {
    if (!(e->flags & kEventTiming)) {
      std::lock_guard<std::mutex> lk(e->mu);
      ++e->records;
      e->queue = s->queue;
      e->ticket = s->queue->pushed();
      e->device = s->device->index();
      return;
    }
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      n = ++e->records;
    }
    e->refs.fetch_add(1, std::memory_order_relaxed);
    Work w;
    w.fn = EventStamp{e, n};
    w.name = "event record";
    const uint64_t ticket = s->queue->push(std::move(w));
    std::lock_guard<std::mutex> lk(e->mu);
    if (e->records == n) {
      e->queue = s->queue;
      e->ticket = ticket;
      e->device = s->device->index();
    }
  }

  void stream_wait_event(HalStream* s, HalEvent* e) override {
    EventPoint p = event_point(e);
    if (p.reached() || p.queue == s->queue) return;
    Work w;
    w.fn = [q = std::move(p.queue), ticket = p.ticket] { q->wait(ticket); };
    w.name = "event wait";
    s->queue->push(std::move(w));
  }

  void event_sync(HalEvent* e) override {
    const EventPoint p = event_point(e);
    if (p.queue == nullptr) return;
    p.queue->wait(p.ticket);
    if (p.device >= 0 && p.device < device_count()) devices_[p.device]->raise_pending();
  }

  bool event_query(HalEvent* e) override { return event_point(e).reached(); }

  float event_elapsed_ms(HalEvent* start, HalEvent* end) override {
    if (!(start->flags & kEventTiming) || !(end->flags & kEventTiming)) {
      throw Error(
          "elapsed_time needs both events created with timing enabled "
          "(torch.neuron.Event(enable_timing=True))");
    }
    const int64_t t0 = stamp_of(start, "start");
    const int64_t t1 = stamp_of(end, "end");
    return static_cast<float>(static_cast<double>(t1 - t0) / 1e6);
  }

 private:
  DeviceState& device(DeviceIndex d) const {
    if (d < 0 || d >= device_count()) {
      throw DeviceError("invalid device index " + std::to_string(d) + ": neuron has " +
                        std::to_string(device_count()) + " devices");
    }
    return *devices_[d];
  }

  static int64_t stamp_of(HalEvent* e, const char* which) {
    std::lock_guard<std::mutex> lk(e->mu);
    if (e->records == 0) {
      throw Error(std::string("elapsed_time: the ") + which +
                  " event was never recorded; call record() on both events first");
    }
    if (e->stamp_count < e->records) {
      throw Error(std::string("elapsed_time: the ") + which +
                  " event has not completed yet; call synchronize() on it first");
    }
    return e->stamp_ns;
  }

  const bool launch_blocking_;
  int host_cores_ = 1;
  std::vector<std::unique_ptr<DeviceState>> devices_;
  std::mutex streams_mu_;
  std::unordered_set<HalStream*> streams_;
};

// NOTE: registered with atexit when the first core is created, so it runs before the static
// destructors of everything constructed earlier (torch included): queued work must not run
// against destroyed statics. Executor threads are left parked, never joined, at exit.
void drain_at_exit() {
  LiveCores& live = live_cores();
  std::lock_guard<std::mutex> lk(live.mu);
  const auto deadline = std::chrono::steady_clock::now() + kExitDrainLimit;
  for (SoftwareCore* core : live.cores) core->drain(deadline);
}

}  // namespace

std::unique_ptr<Hal> software_core_create(const Config& config) {
  return std::make_unique<SoftwareCore>(config);
}

}  // namespace openneuron::runtime
