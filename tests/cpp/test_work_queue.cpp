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
