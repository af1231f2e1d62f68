// gtests for the profiler's device trace (trace.h) and its hook in the work queue: off by
// default, one record per work item while a session is active, bounded, thread-safe, nested
// and repeated sessions, buffer released when the outermost session stops.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/trace.h"
#include "runtime/work_queue.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::make_work;

class NoErrors : public ErrorSink {
 public:
  void on_error(const Work&, const char*) noexcept override {}
};

// Pushes n named items and waits for them.
void run_items(WorkQueue& q, int n, const char* name) {
  uint64_t ticket = 0;
  for (int i = 0; i < n; ++i) {
    Work w = make_work([] {}, name);
    w.seq = static_cast<uint64_t>(i);
    ticket = q.push(std::move(w));
  }
  q.wait(ticket);
}

TEST(Trace, QueueIdsComeFromTheStreamName) {
  const trace::QueueId a = trace::queue_id("neuron3:s12");
  EXPECT_EQ(a.device, 3);
  EXPECT_EQ(a.stream, 12);
  const trace::QueueId b = trace::queue_id("test-queue");
  EXPECT_EQ(b.device, -1);
  EXPECT_GE(b.stream, 0);
  EXPECT_EQ(trace::queue_id("neuron1:s2x").device, -1);
}

TEST(Trace, OffByDefaultRecordsNothing) {
  ASSERT_EQ(trace::sessions(), 0);
  EXPECT_FALSE(trace::enabled());
  NoErrors sink;
  WorkQueue q(&sink, "neuron0:s0");
  run_items(q, 100, "untraced");
  EXPECT_EQ(trace::size(), 0u);
  // A record outside a session is ignored too.
  trace::Record r;
  r.name = "stray";
  trace::record(r);
  EXPECT_EQ(trace::size(), 0u);
}

TEST(Trace, SessionRecordsEachItemInOrderWithinTheWindow) {
  NoErrors sink;
  WorkQueue q(&sink, "neuron2:s5");
  run_items(q, 3, "before");  // not traced
  const int64_t t0 = trace::session_start();
  EXPECT_TRUE(trace::enabled());
  run_items(q, 20, "aten::add");
  const int64_t t1 = trace::now_ns();
  const std::vector<trace::Record> recs = trace::session_stop(t0);
  EXPECT_FALSE(trace::enabled());
  EXPECT_EQ(trace::size(), 0u);  // cleared when the session ends
  ASSERT_EQ(recs.size(), 20u);
  for (size_t i = 0; i < recs.size(); ++i) {
    const trace::Record& r = recs[i];
    EXPECT_STREQ(r.name, "aten::add");
    EXPECT_EQ(r.device, 2);
    EXPECT_EQ(r.stream, 5);
    EXPECT_EQ(r.seq, i);  // one queue: executed in push order
    EXPECT_GE(r.start_ns, t0);
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_LE(r.end_ns, t1);
    if (i > 0) {
      EXPECT_GE(r.start_ns, recs[i - 1].end_ns);
    }
  }
  run_items(q, 5, "after");  // not traced
  EXPECT_EQ(trace::size(), 0u);
}

TEST(Trace, BoundedBufferCountsDroppedRecords) {
  NoErrors sink;
  WorkQueue q(&sink, "neuron0:s1");
  const int64_t t0 = trace::session_start(/*capacity=*/10);
  run_items(q, 50, "op");
  EXPECT_EQ(trace::size(), 10u);
  EXPECT_EQ(trace::dropped(), 40u);
  const auto recs = trace::session_stop(t0);
  EXPECT_EQ(recs.size(), 10u);
  EXPECT_EQ(trace::size(), 0u);
  // The next session starts empty with its own capacity.
  const int64_t t1 = trace::session_start(/*capacity=*/100);
  EXPECT_EQ(trace::dropped(), 0u);
  run_items(q, 50, "op");
  EXPECT_EQ(trace::session_stop(t1).size(), 50u);
}

TEST(Trace, ManyExecutorsAndProducersAtOnce) {
  NoErrors sink;
  constexpr int kQueues = 4;
  constexpr int kItems = 500;
  std::vector<std::unique_ptr<WorkQueue>> queues;
  for (int i = 0; i < kQueues; ++i) {
    queues.push_back(std::make_unique<WorkQueue>(&sink, "neuron1:s" + std::to_string(i)));
  }
  const int64_t t0 = trace::session_start();
  std::vector<std::thread> producers;
  for (int i = 0; i < kQueues; ++i) {
    producers.emplace_back([&, i] {
      trace::push_correlation(static_cast<uint64_t>(100 + i));
      run_items(*queues[i], kItems, "work");
      trace::pop_correlation();
    });
  }
  // Readers while executors write.
  for (int i = 0; i < 50; ++i) (void)trace::size();
  for (auto& t : producers) t.join();
  const auto recs = trace::session_stop(t0);
  ASSERT_EQ(recs.size(), static_cast<size_t>(kQueues * kItems));
  std::vector<int> per_stream(kQueues, 0);
  for (const trace::Record& r : recs) {
    ASSERT_EQ(r.device, 1);
    ASSERT_GE(r.stream, 0);
    ASSERT_LT(r.stream, kQueues);
    EXPECT_EQ(r.correlation, static_cast<uint64_t>(100 + r.stream));
    ++per_stream[r.stream];
  }
  for (int n : per_stream) EXPECT_EQ(n, kItems);
  EXPECT_TRUE(std::is_sorted(recs.begin(), recs.end(),
                             [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; }));
}

TEST(Trace, NestedSessionsSeeTheirOwnWindow) {
  NoErrors sink;
  WorkQueue q(&sink, "neuron0:s2");
  const int64_t outer = trace::session_start();
  run_items(q, 3, "outer-only");
  const int64_t inner = trace::session_start();
  EXPECT_EQ(trace::sessions(), 2);
  run_items(q, 4, "both");
  const auto inner_recs = trace::session_stop(inner);
  ASSERT_EQ(inner_recs.size(), 4u);
  for (const auto& r : inner_recs) EXPECT_STREQ(r.name, "both");
  EXPECT_TRUE(trace::enabled());  // the outer session is still on
  run_items(q, 2, "outer-only");
  const auto outer_recs = trace::session_stop(outer);
  EXPECT_EQ(outer_recs.size(), 9u);
  EXPECT_FALSE(trace::enabled());
  EXPECT_EQ(trace::sessions(), 0);
  EXPECT_EQ(trace::size(), 0u);
  // Stopping with no session is harmless.
  EXPECT_TRUE(trace::session_stop(0).empty());
}

TEST(Trace, CorrelationIsTheInnermostHostOpAtPushTime) {
  NoErrors sink;
  WorkQueue q(&sink, "neuron0:s3");
  EXPECT_EQ(trace::current_correlation(), 0u);
  const int64_t t0 = trace::session_start();
  trace::push_correlation(7);
  run_items(q, 1, "a");
  trace::push_correlation(8);
  run_items(q, 1, "b");
  trace::pop_correlation();
  run_items(q, 1, "c");
  trace::pop_correlation();
  run_items(q, 1, "d");
  trace::pop_correlation();  // unbalanced pop is harmless
  EXPECT_EQ(trace::current_correlation(), 0u);
  const auto recs = trace::session_stop(t0);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[0].correlation, 7u);
  EXPECT_EQ(recs[1].correlation, 8u);
  EXPECT_EQ(recs[2].correlation, 7u);
  EXPECT_EQ(recs[3].correlation, 0u);
  // Launch stamps: when and from which thread the host enqueued (only for host ops).
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(recs[i].enqueue_ns, t0);
    EXPECT_LE(recs[i].enqueue_ns, recs[i].start_ns);
    EXPECT_GT(recs[i].host_thread, 0);
    EXPECT_EQ(recs[i].host_thread, recs[0].host_thread);
  }
  EXPECT_EQ(recs[3].enqueue_ns, 0);
}

}  // namespace
}  // namespace openneuron::runtime
