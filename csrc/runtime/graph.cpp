// Graph capture and replay (graph.h). A capture swaps the stream's queue for a list: Stream
// hands each item to record(), which keeps it if it can run again. A replay is one work item
// running the list in order; the replay's error names the item that failed.
#include "graph.h"

#include <atomic>
#include <exception>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "caching_allocator.h"

namespace openneuron::runtime {
namespace {

std::atomic<uint64_t> next_pool{1};
thread_local const ReplayRng* tl_replay_rng = nullptr;

// The captures going on, by id, for a stream joining one through an event. NOTE: lock order:
// this registry's mutex, then a graph's mu_ (graph_join_capture); a graph never takes it while
// holding its own.
struct Captures {
  std::mutex mu;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Graph*> by_id;
};
Captures& captures() {
  static Captures* c = new Captures();  // NOTE: leaked on purpose, used from destructors at exit
  return *c;
}
uint64_t register_capture(Graph* g) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lk(c.mu);
  const uint64_t id = c.next_id++;
  c.by_id.emplace(id, g);
  return id;
}
void unregister_capture(uint64_t id) {
  if (id == 0) return;
  Captures& c = captures();
  std::lock_guard<std::mutex> lk(c.mu);
  c.by_id.erase(id);
}

std::string stream_name(const Stream& s) {
  return "neuron:" + std::to_string(s.device()) + " stream " + std::to_string(s.id());
}

}  // namespace

uint64_t graph_pool_create() { return next_pool.fetch_add(1, std::memory_order_relaxed); }

const ReplayRng* graph_replay_rng() { return tl_replay_rng; }

uint64_t graph_capture_id(const Stream& s) {
  Graph* g = stream_capture_graph(s);
  return g == nullptr ? 0 : g->capture_id();
}

bool graph_capture_active(uint64_t id) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.by_id.count(id) > 0;
}

bool graph_join_capture(uint64_t id, const Stream& s) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lk(c.mu);
  auto it = c.by_id.find(id);
  if (it == c.by_id.end()) return false;
  it->second->join(s);
  return true;
}

uint64_t Graph::rng_reserve(uint64_t increment) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!capturing_) throw CaptureError("rng_reserve on a neuron graph that is not capturing");
  const uint64_t at = rng_increment_;
  rng_increment_ += increment;
  return at;
}

Graph::~Graph() {
  try {
    if (capturing_) {  // destroyed mid-capture: the streams stop capturing, nothing is kept
      unregister_capture(std::exchange(capture_id_, 0));
      detach_streams();
      capturing_.reset();
    }
    reset();
  } catch (...) {  // NOTE: a destructor must not throw; reset() only fails on a dead device
  }
}

void Graph::detach_streams() {
  stream_set_capture_graph(stream_, nullptr);
  for (const Stream& j : joined_) stream_set_capture_graph(j, nullptr);
  joined_.clear();
}

void Graph::capture_begin(const Stream& s, uint64_t pool) {
  // NOTE: ops held back by adaptive eager go out first, uncaptured (and at capture_end, into
  // the graph); unlocked: a flush enqueues, which record() would lock for.
  run_flush_hook(FlushPoint::kGraphCapture);
  // NOTE: registered before mu_ is taken (lock order: the registry, then mu_); no event can
  // name the id before the stream captures.
  const uint64_t id = register_capture(this);
  struct Unregister {
    uint64_t id;
    ~Unregister() { unregister_capture(id); }
  } on_error{id};
  std::lock_guard<std::mutex> lk(mu_);
  if (capturing_ || items_) {
    throw CaptureError(
        "capture_begin on a neuron graph that already holds a capture; call "
        "reset() first");
  }
  pool_ = pool != 0 ? pool : graph_pool_create();
  stream_ = s;
  rng_increment_ = 0;
  invalid_.clear();
  capturing_ = std::make_unique<Items>();
  allocator_pool_hold(s, pool_);
  holds_pool_ = true;
  try {
    stream_set_capture_graph(s, this);
  } catch (...) {
    capturing_.reset();
    allocator_pool_release(s.device(), pool_);
    holds_pool_ = false;
    throw;
  }
  capture_id_ = id;
  on_error.id = 0;  // registered for the capture
}

uint64_t Graph::capture_id() {
  std::lock_guard<std::mutex> lk(mu_);
  return capture_id_;
}

void Graph::join(const Stream& s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!capturing_) throw CaptureError("join: the neuron graph is not capturing");
  if (s.device() != stream_.device()) {
    throw CaptureError(stream_name(s) + " waited on an event recorded in a capture of " +
                       stream_name(stream_) + ": a graph captures one device's streams");
  }
  stream_set_capture_graph(s, this);  // throws if s captures another graph
  joined_.push_back(s);
}

void Graph::capture_end() {
  run_flush_hook(FlushPoint::kGraphCapture);
  unregister_capture(capture_id());  // no stream joins from here on
  std::unique_lock<std::mutex> lk(mu_);
  if (!capturing_) throw CaptureError("capture_end on a neuron graph that is not capturing");
  capture_id_ = 0;
  detach_streams();
  std::unique_ptr<Items> items = std::move(capturing_);
  if (!invalid_.empty()) {
    const std::string why = std::move(invalid_);
    invalid_.clear();
    lk.unlock();
    items.reset();
    reset();
    throw CaptureError("neuron graph capture on " + stream_name(stream_) +
                       " was invalidated: " + why);
  }
  items_ = std::shared_ptr<Items>(items.release());
}

void Graph::record(const Stream& s, Work&& work) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!capturing_) {  // the capture ended between the stream's check and now
    lk.unlock();
    hal().stream_enqueue(s.hal_stream(), std::move(work));
    return;
  }
  if (!work.replayable) {
    lk.unlock();
    fail(std::string(work.name) +
         " cannot be captured in a neuron graph: its work cannot run twice with the same "
         "effect (it draws random numbers from a seed taken when queued, communicates, or "
         "reads the host); run it outside the captured region");
  }
  if (!invalid_.empty()) return;  // already failed: nothing recorded after
  capturing_->work.push_back(std::move(work));
}

void Graph::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing_ && invalid_.empty()) invalid_ = what;
  }
  throw CaptureError(what);
}

void Graph::replay(const Stream& s, ReplayRng rng) {
  std::shared_ptr<Items> items;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing_) throw CaptureError("replay() of a neuron graph while it is capturing");
    if (!items_) throw CaptureError("replay() of a neuron graph with no capture");
    if (rng_increment_ > 0 && stream_capture_graph(s) != nullptr) {
      throw CaptureError(
          "replay() of a neuron graph that draws random numbers, inside another "
          "capture: the outer graph would repeat its numbers on every replay");
    }
    items = items_;
  }
  Work w;
  w.name = "neuron graph replay";
  w.replayable = true;  // a replay may itself be captured into another graph
  w.fn = [items = std::move(items), rng] {
    std::lock_guard<std::mutex> lk(items->mu);
    struct Scope {  // the replay's generator state for its random ops, restored on unwinding
      const ReplayRng* saved = tl_replay_rng;
      explicit Scope(const ReplayRng* r) { tl_replay_rng = r; }
      ~Scope() { tl_replay_rng = saved; }
    } scope(&rng);
    for (Work& item : items->work) {
      try {
        item.fn();
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string(item.name) +
                                 " (in a neuron graph replay): " + e.what());
      }
    }
  };
  s.enqueue(std::move(w));
  if (stream_capture_graph(s) != nullptr) return;  // captured into another graph: not run yet
  std::lock_guard<std::mutex> lk(mu_);
  replayed_on_ = s;
}

void Graph::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  if (capturing_) {
    throw CaptureError("reset() of a neuron graph while it is capturing; call capture_end()");
  }
  items_.reset();  // a queued replay keeps the items it runs
  if (!holds_pool_) return;
  holds_pool_ = false;
  const DeviceIndex device = stream_.device();
  const uint64_t pool = pool_;
  if (!replayed_on_) {
    allocator_pool_release(device, pool);
    return;
  }
  // NOTE: the pool's blocks may be reused once released, so the release is queued after the
  // last replay instead of waiting for it (the caller may hold the GIL, which queued work such
  // as a Python kernel on the executor could need).
  Work w;
  w.name = "neuron graph pool release";
  w.fn = [device, pool] { allocator_pool_release(device, pool); };
  hal().stream_enqueue(std::exchange(replayed_on_, std::nullopt)->hal_stream(), std::move(w));
}

}  // namespace openneuron::runtime
