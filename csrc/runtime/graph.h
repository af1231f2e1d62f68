// Graph capture, CUDA graphs' counterpart: while a stream captures, the work queued on it is
// recorded instead of run, and a replay queues the recorded work again as one item, on the same
// buffers. Allocations on a capturing stream come from the graph's private memory pool
// (caching_allocator.h), reserved until the graph is reset. Not a graph compiler: the items
// are the launches as they were queued; nothing is fused or reordered.
// Several streams, as CUDA's fork and join: an event recorded on a capturing stream is a point
// in the capture; a stream that waits on it joins the capture (its work is recorded into the
// same graph until capture_end), and a capturing stream waiting on it needs nothing. The graph
// keeps one list in the order the host queued the work, which respects every stream's order
// and every event edge, and a replay runs it on one stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"
#include "hal.h"
#include "stream.h"

namespace openneuron::runtime {

// What a capturing stream cannot do (a sync, a host copy, work that cannot run twice). Thrown
// at the offending call; the capture is invalidated and capture_end throws it again.
class CaptureError : public Error {
 public:
  using Error::Error;
};

// Random numbers in a graph, as CUDA's graph-safe RNG: a random op captured reserves its share
// of the generator's stream (Graph::rng_reserve: an offset relative to the graph's start); each
// replay is queued with the generator's (seed, offset) for the whole graph, taken when replay()
// is called, and the op reads seed and offset + its share while the replay runs. A replay thus
// draws what running the captured ops in order would draw from that state.
struct ReplayRng {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
// While a replay runs (on its executor thread): the state it was queued with; else nullptr.
const ReplayRng* graph_replay_rng();

class Graph {
 public:
  Graph() = default;
  ~Graph();  // reset(), errors swallowed
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts recording the work queued on s (from any thread) into this graph, which must be
  // empty. pool: a pool id shared with other graphs (pool() of one, or graph_pool_create());
  // 0 = a pool of its own. Throws CaptureError if s already captures or this graph is captured.
  void capture_begin(const Stream& s, uint64_t pool = 0);
  // Stops recording. Throws CaptureError (the graph left empty) if the capture was invalidated.
  void capture_end();
  // Queues the recorded work on s as one item (replays of one graph never overlap).
  // rng: the generator state for the graph's random ops (rng_increment() offsets of it).
  void replay(const Stream& s, ReplayRng rng = {});
  // Drops the recorded work and this graph's hold on its pool (released in stream order after
  // the last replay, never waiting for it); the graph can capture again.
  void reset();

  bool captured() const { return items_ != nullptr; }
  uint64_t pool() const { return pool_; }
  DeviceIndex device() const { return stream_.device(); }  // of the capture
  // While capturing: reserves `increment` offsets of the generator stream for a random op and
  // returns where they start, relative to the replay's offset. Total reserved so far:
  uint64_t rng_reserve(uint64_t increment);
  uint64_t rng_increment() const { return rng_increment_; }
  size_t num_items() const { return items_ ? items_->work.size() : 0; }

  // Called by Stream for work queued on s, a stream this graph captures. record() throws
  // CaptureError for work that is not replayable; fail() invalidates the capture.
  void record(const Stream& s, Work&& work);
  [[noreturn]] void fail(const std::string& what);
  // s joins this capture (graph_join_capture); throws CaptureError if it cannot.
  void join(const Stream& s);
  uint64_t capture_id();  // 0 when not capturing

 private:
  struct Items {
    std::mutex mu;  // one replay at a time: items may keep state between runs
    std::vector<Work> work;
  };
  // The capturing stream and every stream that joined it stop capturing (mu_ held, or the
  // destructor).
  void detach_streams();
  std::mutex mu_;  // capture state (work may be queued from several threads)
  std::shared_ptr<Items> items_;
  std::unique_ptr<Items> capturing_;
  std::string invalid_;  // why the capture failed, empty while valid
  Stream stream_;
  std::vector<Stream> joined_;  // streams that joined the capture (fork), until capture_end
  uint64_t capture_id_ = 0;     // this capture's id (events recorded in it keep it); 0 = none
  uint64_t pool_ = 0;
  uint64_t rng_increment_ = 0;
  bool holds_pool_ = false;
  std::optional<Stream> replayed_on_;  // the stream of the last replay since the capture
};

// A fresh pool id (torch.neuron.graph_pool_handle()); never 0.
uint64_t graph_pool_create();

// The id of the capture s records into (0 when s does not capture): what an event recorded on
// s keeps (event.cpp).
uint64_t graph_capture_id(const Stream& s);
// s waits on an event recorded in capture `id`: s joins that capture if it is still going on
// (true), else nothing (false: the capture ended; the event is no point of the device's work).
// Throws CaptureError if s captures another graph.
bool graph_join_capture(uint64_t id, const Stream& s);
// Whether capture `id` is still going on.
bool graph_capture_active(uint64_t id);

}  // namespace openneuron::runtime
