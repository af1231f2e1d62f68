// gtests for the stream engine (work_queue.h) under contention: several producers pushing and
// waiting on one queue while its executor keeps falling asleep and waking. A lost wake-up shows
// up as a hang, so a watchdog fails the test instead of letting it wait forever.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/parallel.h"
#include "runtime/work_queue.h"

namespace openneuron::runtime {
namespace {

class NoErrors : public ErrorSink {
 public:
  void on_error(const Work&, const char*) noexcept override {}
};

TEST(WorkQueue, ProducersNeverLoseTheExecutorsWakeUp) {
  NoErrors sink;
  WorkQueue q(&sink, "test-queue");
  std::atomic<int64_t> ran{0};
  std::atomic<bool> finished{false};
  constexpr int kThreads = 3;
  constexpr int kRounds = 4000;
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!finished.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished.load()) {
      ADD_FAILURE() << "a wait never returned: lost wake-up (" << q.done() << " of " << q.pushed()
                    << " items ran)";
      std::_Exit(1);
    }
  });
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        Work w;
        w.fn = [&ran] { ran.fetch_add(1, std::memory_order_relaxed); };
        w.name = "tick";
        const uint64_t ticket = q.push(std::move(w));
        if ((i + t) % 3 == 0) q.wait(ticket);
        // NOTE: pauses longer than the executor's spin make it sleep between pushes.
        if (i % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  for (auto& p : producers) p.join();
  q.wait(q.pushed());
  finished = true;
  watchdog.join();
  EXPECT_EQ(ran.load(), int64_t{kThreads} * kRounds);
}

std::atomic<int> g_releases{0};

struct ReleaseHook {
  explicit ReleaseHook(unsigned on) {
    set_parallel_release([] { g_releases.fetch_add(1); }, on);
  }
  ~ReleaseHook() { set_parallel_release(nullptr, 0); }
};

TEST(WorkQueue, AHostThreadAboutToSleepReleasesItsParallelThreads) {
  ReleaseHook hook(kReleaseOnHostWait);
  NoErrors sink;
  WorkQueue q(&sink, "release-queue");
  g_releases = 0;
  Work slow;
  slow.fn = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  slow.name = "slow";
  q.wait(q.push(std::move(slow)));  // longer than the waiter's spin: it sleeps
  EXPECT_EQ(g_releases.load(), 1);
  Work fast;
  fast.fn = [] {};
  fast.name = "fast";
  const uint64_t t = q.push(std::move(fast));
  while (q.done() < t) std::this_thread::yield();
  q.wait(t);  // already done: no sleep, no release
  EXPECT_EQ(g_releases.load(), 1);
}

// The default: a host thread frees its pool before a block only when its previous block was
// long (a training step's), never after short ones (a decode token's). A host stall can stretch
// a short block, and a slow spin (ASan) can absorb a 1 ms item: each wait's length, timed here,
// bounds the releases; a 20 ms item always blocks, so the one after the first 20 ms releases.
TEST(WorkQueue, AHostThreadReleasesBeforeABlockAfterALongOne) {
  ReleaseHook hook(kReleaseOnLongHostWait);
  NoErrors sink;
  WorkQueue q(&sink, "long-wait-queue");
  g_releases = 0;
  std::thread host([&] {  // a fresh thread: no block before this test's
    int at_least = 0, at_most = 0;
    auto previous = std::chrono::steady_clock::duration::zero();
    for (int ms : {1, 1, 20, 20}) {
      const auto t0 = std::chrono::steady_clock::now();
      Work w;
      w.fn = [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
      w.name = "sleep";
      q.wait(q.push(std::move(w)));
      // the block before this wait lasted at most `previous` (which adds push and spin)
      if (previous > std::chrono::milliseconds(6) && ms == 20) ++at_least;
      if (previous >= std::chrono::milliseconds(4)) ++at_most;
      previous = std::chrono::steady_clock::now() - t0;
    }
    EXPECT_GE(g_releases.load(), at_least);
    EXPECT_LE(g_releases.load(), at_most);
    EXPECT_GE(at_least, 1);  // the wait after the 20 ms one
  });
  host.join();
}

TEST(WorkQueue, AnExecutorIdleFor50msReleasesItsParallelThreadsOnce) {
  ReleaseHook hook(kReleaseOnIdleExecutor);
  NoErrors sink;
  WorkQueue q(&sink, "idle-queue");
  g_releases = 0;
  auto push_noop = [&q] {
    Work w;
    w.fn = [] {};
    w.name = "noop";
    q.wait(q.push(std::move(w)));
  };
  push_noop();
  // Busy: work every millisecond keeps the pool (asserted when no gap between pushes reached
  // the idle time, which a loaded host's scheduler could cause).
  auto longest = std::chrono::steady_clock::duration::zero();
  for (int i = 0; i < 30; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    push_noop();
    longest = std::max(longest, std::chrono::steady_clock::now() - t0);
  }
  if (longest < std::chrono::milliseconds(40)) {
    EXPECT_EQ(g_releases.load(), 0);
  }
  g_releases = 0;
  // Idle: released once, however long it stays idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(g_releases.load(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(g_releases.load(), 1);
  // Work again, then idle again: one more.
  push_noop();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(g_releases.load(), 2);
}

}  // namespace
}  // namespace openneuron::runtime
