// gtests for streams: the software core's in-order queues (ordering, bounded queue, many
// producers, query, destroy, executor thread-init hook) and stream.cpp's handles (default,
// pools, priorities, ids, the thread's current stream).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/software_core.h"
#include "runtime/stream.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::Gate;
using testing::make_work;

std::unique_ptr<Hal> make_hal(bool blocking = false) {
  Config c;
  c.visible_cores = {0};
  c.device_memory = uint64_t{64} << 20;
  c.launch_blocking = blocking;
  return software_core_create(c);
}

TEST(Streams, TenThousandItemsRunInOrder) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  std::vector<int> seen;
  for (int i = 0; i < 10000; ++i)
    h->stream_enqueue(s, make_work([&seen, i] { seen.push_back(i); }));
  h->stream_sync(s);
  ASSERT_EQ(seen.size(), 10000u);
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(seen[i], i);
  h->stream_destroy(s);
}

TEST(Streams, QueryBeforeAndAfter) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  EXPECT_TRUE(h->stream_query(s));
  Gate gate;
  h->stream_enqueue(s, gate.work());
  EXPECT_FALSE(h->stream_query(s));
  gate.open();
  h->stream_sync(s);
  EXPECT_TRUE(h->stream_query(s));
  h->stream_destroy(s);
}

TEST(Streams, ProducerBlocksWhenQueueIsFull) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  Gate gate;
  h->stream_enqueue(s, gate.work());
  std::atomic<size_t> returned{0};
  std::atomic<int> ran{0};
  std::thread producer([&] {
    for (size_t i = 0; i < kMaxQueuedWork + 10; ++i) {
      h->stream_enqueue(s, make_work([&ran] { ran.fetch_add(1); }));
      returned.fetch_add(1);
    }
  });
  while (returned.load() < kMaxQueuedWork - 1) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // The gate plus kMaxQueuedWork - 1 items fill the queue; the next enqueue must wait.
  EXPECT_EQ(returned.load(), kMaxQueuedWork - 1);
  EXPECT_EQ(ran.load(), 0);
  gate.open();
  producer.join();
  h->stream_sync(s);
  EXPECT_EQ(ran.load(), static_cast<int>(kMaxQueuedWork + 10));
  h->stream_destroy(s);
}

TEST(Streams, ManyProducersKeepTheirOwnOrder) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  constexpr int kThreads = 4, kItems = 3000;
  std::vector<std::vector<int>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kItems; ++i) {
        h->stream_enqueue(s, make_work([&seen, t, i] { seen[t].push_back(i); }));
      }
    });
  }
  for (auto& t : threads) t.join();
  h->stream_sync(s);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(seen[t].size(), static_cast<size_t>(kItems));
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(seen[t][i], i);
  }
  h->stream_destroy(s);
}

TEST(Streams, DestroyWaitsForQueuedWork) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) h->stream_enqueue(s, make_work([&ran] { ran.fetch_add(1); }));
  h->stream_destroy(s);
  EXPECT_EQ(ran.load(), 100);
}

TEST(Streams, WorkSyncingItsOwnStreamFailsInsteadOfHanging) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  HalStream* other = h->stream_create(0, 0);
  std::atomic<bool> enqueued_from_work{false};
  h->stream_enqueue(s, make_work([&] { h->stream_sync(other); }));  // another stream: fine
  h->stream_enqueue(s, make_work([&] {
                      h->stream_enqueue(
                          s, make_work([&] { enqueued_from_work = true; }));  // not full: fine
                    }));
  h->stream_enqueue(s, make_work([&] { h->stream_sync(s); }, "aten::self_sync"));
  try {
    h->stream_sync(s);
    ADD_FAILURE() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::self_sync (op #"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("wait for itself forever"), std::string::npos);
  }
  // NOTE: the sync above waited for the items queued when it was called; the one the second
  // item enqueues may come after that, so a second sync waits for it (and raises nothing).
  h->stream_sync(s);
  EXPECT_TRUE(enqueued_from_work.load());
  h->stream_destroy(s);
  h->stream_destroy(other);
}

TEST(Streams, StreamsRunConcurrently) {
  auto h = make_hal();
  HalStream* a = h->stream_create(0, 0);
  HalStream* b = h->stream_create(0, -1);
  Gate gate;
  h->stream_enqueue(a, gate.work());
  std::atomic<bool> b_ran{false};
  h->stream_enqueue(b, make_work([&] { b_ran = true; }));
  h->stream_sync(b);  // must not wait for a's gate
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(h->stream_query(a));
  gate.open();
  h->stream_sync(a);
  h->stream_destroy(a);
  h->stream_destroy(b);
}

TEST(Streams, ThreadInitHookRunsOncePerExecutor) {
  std::atomic<int> calls{0};
  executor_set_thread_init([&calls] { calls.fetch_add(1); });
  {
    auto h = make_hal();
    HalStream* a = h->stream_create(0, 0);
    HalStream* b = h->stream_create(0, 0);
    for (int i = 0; i < 10; ++i) {
      h->stream_enqueue(a, make_work([] {}));
      h->stream_enqueue(b, make_work([] {}));
    }
    h->stream_sync(a);
    h->stream_sync(b);
    EXPECT_EQ(calls.load(), 2);
    h->stream_destroy(a);
    h->stream_destroy(b);
  }
  executor_set_thread_init(nullptr);
}

TEST(Streams, MemcpyIsOrderedOnTheStream) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  std::vector<int> src(1000), dst(1000, -1);
  for (int i = 0; i < 1000; ++i) src[i] = i;
  void* dev = h->mem_alloc(0, sizeof(int) * 1000);
  h->memcpy(dev, src.data(), sizeof(int) * 1000, CopyKind::HostToDevice, s);
  h->stream_enqueue(s, make_work([dev] { static_cast<int*>(dev)[0] = 42; }));
  h->memcpy(dst.data(), dev, sizeof(int) * 1000, CopyKind::DeviceToHost, s);
  h->stream_sync(s);
  EXPECT_EQ(dst[0], 42);
  EXPECT_EQ(dst[999], 999);
  h->mem_free(0, dev);
  h->stream_destroy(s);
}

TEST(StreamHandles, DefaultPoolAndIds) {
  const Stream def = stream_default(0);
  EXPECT_EQ(def.id(), 0);
  EXPECT_EQ(def.priority(), 0);
  EXPECT_EQ(Stream(), def);
  const Stream a = stream_from_pool(0);
  const Stream b = stream_from_pool(0);
  EXPECT_NE(a, b);
  EXPECT_NE(a.id(), 0);
  EXPECT_EQ(a.priority(), 0);
  const Stream hi = stream_from_pool(0, -5);
  EXPECT_EQ(hi.priority(), kStreamPriorityHigh);
  EXPECT_EQ(stream_from_pool(0, 3).priority(), 0);
  EXPECT_EQ(stream_from_id(0, hi.id()), hi);
  EXPECT_EQ(stream_from_id(1, a.id()).device(), 1);
  EXPECT_THROW(stream_from_id(0, -1), DeviceError);
  EXPECT_THROW(stream_from_id(0, 1 + 2 * kStreamPoolSize), DeviceError);
  EXPECT_THROW(stream_default(7), DeviceError);
}

TEST(StreamHandles, PoolIsRoundRobin) {
  std::vector<int64_t> ids;
  for (int i = 0; i < kStreamPoolSize; ++i) ids.push_back(stream_from_pool(1).id());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), kStreamPoolSize);
}

TEST(StreamHandles, CurrentStreamIsPerThreadAndPerDevice) {
  EXPECT_EQ(stream_current(0), stream_default(0));
  const Stream s = stream_from_pool(0);
  stream_set_current(s);
  EXPECT_EQ(stream_current(0), s);
  EXPECT_EQ(stream_current(1), stream_default(1));
  std::thread([] { EXPECT_EQ(stream_current(0), stream_default(0)); }).join();
  stream_set_current(stream_default(0));
  EXPECT_EQ(stream_current(0), stream_default(0));
}

TEST(StreamHandles, EnqueueSyncAndQuery) {
  const Stream s = stream_from_pool(1);
  EXPECT_EQ(s.hal_stream(), s.hal_stream());
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) s.enqueue(make_work([&ran] { ran.fetch_add(1); }));
  s.synchronize();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_TRUE(s.query());
}

}  // namespace
}  // namespace openneuron::runtime
