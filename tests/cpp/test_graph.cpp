// gtests for graph capture (runtime/graph.h) over the process HAL: recording instead of running,
// replays in order and repeated, what a capturing stream refuses (syncs, host copies, work that
// cannot run twice) and the invalidated capture, errors naming the failed item, nested capture of
// a replay, destruction mid-capture, streams joining a capture through events (fork / join), the
// generator state of each replay, and the graph's private
// memory pool (reuse inside the capture
// only, kept by empty_cache, back to the stream after reset).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/errors.h"
#include "runtime/event.h"
#include "runtime/graph.h"
#include "runtime/stream.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::make_work;

Work replayable(std::function<void()> fn, const char* name = "test work") {
  Work w = make_work(std::move(fn), name);
  w.replayable = true;
  return w;
}

TEST(Graph, RecordsInsteadOfRunningThenReplaysInOrder) {
  const Stream s = stream_from_pool(0);
  std::vector<int> order;
  Graph g;
  g.capture_begin(s);
  EXPECT_EQ(stream_capture_graph(s), &g);
  s.enqueue(replayable([&] { order.push_back(1); }));
  s.enqueue(replayable([&] { order.push_back(2); }));
  g.capture_end();
  EXPECT_EQ(stream_capture_graph(s), nullptr);
  s.synchronize();
  EXPECT_TRUE(order.empty());  // captured work has not run
  EXPECT_EQ(g.num_items(), 2u);
  g.replay(s);
  g.replay(s);
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1, 2}));
  // Work queued after the capture runs as usual.
  s.enqueue(make_work([&] { order.push_back(3); }));
  s.synchronize();
  EXPECT_EQ(order.back(), 3);
}

TEST(Graph, ReplaysOnAnotherStreamAndOtherStreamsAreNotCaptured) {
  const Stream s = stream_from_pool(0);
  const Stream other = stream_from_pool(0);
  std::atomic<int> runs{0}, outside{0};
  Graph g;
  g.capture_begin(s);
  s.enqueue(replayable([&] { ++runs; }));
  other.enqueue(make_work([&] { ++outside; }));
  g.capture_end();
  other.synchronize();
  EXPECT_EQ(outside.load(), 1);
  g.replay(other);
  other.synchronize();
  EXPECT_EQ(runs.load(), 1);
}

TEST(Graph, DeviceCopyIsCapturedHostCopiesAreRefused) {
  const Stream s = stream_from_pool(0);
  float src = 1.0f, dst = 0.0f;
  Graph g;
  g.capture_begin(s);
  s.memcpy(&dst, &src, sizeof(float), CopyKind::DeviceToDevice);
  g.capture_end();
  src = 7.0f;
  g.replay(s);
  s.synchronize();
  EXPECT_EQ(dst, 7.0f);  // the copy ran at replay, from the captured addresses

  Graph h;
  h.capture_begin(s);
  EXPECT_THROW(s.memcpy(&dst, &src, sizeof(float), CopyKind::HostToDevice), CaptureError);
  try {
    h.capture_end();
    FAIL() << "capture_end of an invalidated capture must throw";
  } catch (const CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("invalidated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("from the host to the device"), std::string::npos);
  }
  EXPECT_FALSE(h.captured());
  EXPECT_EQ(stream_capture_graph(s), nullptr);
}

TEST(Graph, SyncsAndEventsOnACapturingStreamThrow) {
  const Stream s = stream_from_pool(0);
  Graph g;
  g.capture_begin(s);
  EXPECT_THROW(s.synchronize(), CaptureError);
  EXPECT_THROW(g.capture_end(), CaptureError);

  g.capture_begin(s);
  EXPECT_TRUE(device_capturing(0));
  EXPECT_THROW(s.query(), CaptureError);
  EXPECT_THROW(g.capture_end(), CaptureError);
  EXPECT_FALSE(device_capturing(0));

  Event outside;  // recorded on the device: a capturing stream cannot wait on it
  outside.record(s);
  g.capture_begin(s);
  EXPECT_THROW(outside.block(s), CaptureError);
  EXPECT_THROW(g.capture_end(), CaptureError);

  // A second capture of the same stream, and a replay of an empty graph, are errors too.
  Graph a, b;
  a.capture_begin(s);
  EXPECT_THROW(b.capture_begin(s), CaptureError);
  a.capture_end();
  EXPECT_THROW(b.replay(s), CaptureError);
}

// CUDA's fork and join: a stream waiting on an event recorded in the capture joins it; its work
// is recorded in the order queued and replays after what preceded the record; after capture_end
// it runs on its own again.
TEST(Graph, StreamsJoinTheCaptureThroughEvents) {
  const Stream s = stream_from_pool(0);
  const Stream side = stream_from_pool(0);
  ASSERT_NE(s.id(), side.id());
  std::vector<int> order;
  std::mutex mu;
  auto push = [&](int v) {
    std::lock_guard<std::mutex> lk(mu);
    order.push_back(v);
  };
  Graph g;
  g.capture_begin(s);
  s.enqueue(replayable([&] { push(1); }));
  Event fork, join;
  fork.record(s);
  EXPECT_TRUE(fork.query());  // a point in the capture, nothing on the device
  EXPECT_EQ(stream_capture_graph(side), nullptr);
  fork.block(side);  // side joins the capture
  EXPECT_EQ(stream_capture_graph(side), &g);
  side.enqueue(replayable([&] { push(2); }));
  join.record(side);
  join.block(s);  // same capture: nothing to wait for
  s.enqueue(replayable([&] { push(3); }));
  EXPECT_THROW(side.synchronize(), CaptureError);  // a joined stream captures: no sync
  EXPECT_THROW(g.capture_end(), CaptureError);

  g.capture_begin(s);
  s.enqueue(replayable([&] { push(1); }));
  fork.record(s);
  fork.block(side);
  side.enqueue(replayable([&] { push(2); }));
  join.record(side);
  join.block(s);
  s.enqueue(replayable([&] { push(3); }));
  g.capture_end();
  EXPECT_EQ(stream_capture_graph(side), nullptr);
  EXPECT_EQ(g.num_items(), 3u);
  s.synchronize();
  side.synchronize();
  EXPECT_TRUE(order.empty());
  g.replay(s);
  g.replay(s);
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 1, 2, 3}));
  // After the capture: side runs its own work; waiting on the capture's event is a no-op.
  fork.block(side);
  side.enqueue(make_work([&] { push(4); }));
  side.synchronize();
  EXPECT_EQ(order.back(), 4);

  // A stream capturing another graph cannot wait on this capture's event.
  Graph a, b;
  a.capture_begin(s);
  Event e;
  e.record(s);
  b.capture_begin(side);
  EXPECT_THROW(e.block(side), CaptureError);
  EXPECT_THROW(b.capture_end(), CaptureError);
  a.capture_end();
  // ... but once that capture has ended, its event is nothing to wait for.
  b.capture_begin(side);
  e.block(side);
  b.capture_end();
}

TEST(Graph, WorkThatCannotRunTwiceIsRefusedByName) {
  const Stream s = stream_from_pool(0);
  Graph g;
  g.capture_begin(s);
  try {
    s.enqueue(make_work([] {}, "aten::bernoulli_"));
    FAIL() << "a non-replayable item must be refused";
  } catch (const CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::bernoulli_"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.capture_end(), CaptureError);
}

TEST(Graph, ReplayErrorNamesTheItem) {
  const Stream s = stream_from_pool(0);
  Graph g;
  g.capture_begin(s);
  s.enqueue(replayable([] { throw std::runtime_error("boom"); }, "aten::test_op"));
  g.capture_end();
  g.replay(s);
  try {
    s.synchronize();
    FAIL() << "the replay's error must surface at the sync";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::test_op (in a neuron graph replay): boom"),
              std::string::npos)
        << e.what();
  }
}

TEST(Graph, AReplayCanBeCapturedIntoAnotherGraph) {
  const Stream s = stream_from_pool(0);
  std::atomic<int> runs{0};
  Graph inner, outer;
  inner.capture_begin(s);
  s.enqueue(replayable([&] { ++runs; }));
  inner.capture_end();
  outer.capture_begin(s);
  inner.replay(s);
  inner.replay(s);
  outer.capture_end();
  s.synchronize();
  EXPECT_EQ(runs.load(), 0);
  outer.replay(s);
  s.synchronize();
  EXPECT_EQ(runs.load(), 2);
}

TEST(Graph, DestroyedWhileCapturingReleasesTheStream) {
  const Stream s = stream_from_pool(0);
  {
    Graph g;
    g.capture_begin(s);
  }
  EXPECT_EQ(stream_capture_graph(s), nullptr);
  std::atomic<int> runs{0};
  s.enqueue(make_work([&] { ++runs; }));
  s.synchronize();
  EXPECT_EQ(runs.load(), 1);
}

TEST(Graph, ReplaysCarryTheGeneratorStateTheyWereQueuedWith) {
  const Stream s = stream_from_pool(0);
  Graph g;
  g.capture_begin(s);
  EXPECT_EQ(g.rng_reserve(8), 0u);  // two random ops' shares, relative to the replay's offset
  EXPECT_EQ(g.rng_reserve(4), 8u);
  std::vector<uint64_t> seen;
  s.enqueue(replayable([&] {
    const ReplayRng* r = graph_replay_rng();
    seen.push_back(r != nullptr ? r->offset : ~uint64_t{0});
  }));
  g.capture_end();
  EXPECT_EQ(g.rng_increment(), 12u);
  g.replay(s, {1, 100});
  g.replay(s, {1, 112});
  s.synchronize();
  EXPECT_EQ(seen, (std::vector<uint64_t>{100, 112}));
  EXPECT_EQ(graph_replay_rng(), nullptr);  // only inside a replay
  // A replay that draws random numbers cannot itself be captured: its numbers would repeat.
  Graph outer;
  outer.capture_begin(s);
  EXPECT_THROW(g.replay(s, {1, 124}), CaptureError);
  outer.capture_end();
}

TEST(Graph, PoolBlocksAreTheGraphsUntilReset) {
  const Stream s = stream_from_pool(1);
  constexpr size_t kBytes = 4096;
  Graph g;
  g.capture_begin(s);
  void* a = allocator_alloc(kBytes, s);
  allocator_free(a);                     // freed inside the capture...
  void* b = allocator_alloc(kBytes, s);  // ...reused inside it, as replay order allows
  EXPECT_EQ(a, b);
  g.capture_end();
  allocator_free(b);
  // Outside the capture the stream never takes the pool's blocks, and empty_cache keeps them.
  void* c = allocator_alloc(kBytes, s);
  EXPECT_NE(c, b);
  allocator_empty_cache(1);
  bool pool_kept = false;
  for (const SegmentInfo& seg : allocator_snapshot(1)) {
    const auto p = reinterpret_cast<uint64_t>(b);
    pool_kept |= p >= seg.address && p < seg.address + seg.total_size;
  }
  EXPECT_TRUE(pool_kept);
  allocator_free(c);
  // After reset the pool's memory is the stream's again: reused, or released by empty_cache.
  g.reset();
  void* d = allocator_alloc(kBytes, s);
  EXPECT_TRUE(d == b || d == c);
  allocator_free(d);
  allocator_empty_cache(1);
  EXPECT_EQ(allocator_stats(1).reserved_bytes[kStatAggregate].current, 0);
}

TEST(Graph, GraphsShareAPool) {
  const Stream s = stream_from_pool(1);
  const uint64_t pool = graph_pool_create();
  Graph g1, g2;
  g1.capture_begin(s, pool);
  void* a = allocator_alloc(4096, s);
  g1.capture_end();
  allocator_free(a);
  g2.capture_begin(s, pool);
  void* b = allocator_alloc(4096, s);  // the shared pool's block freed after g1's capture
  g2.capture_end();
  EXPECT_EQ(a, b);
  EXPECT_EQ(g1.pool(), g2.pool());
  allocator_free(b);
  g1.reset();
  g2.reset();
  allocator_empty_cache(1);
  EXPECT_EQ(allocator_stats(1).reserved_bytes[kStatAggregate].current, 0);
}

}  // namespace
}  // namespace openneuron::runtime
