#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::runtime {
namespace {

TEST(Parallel, SerialDefaultCoversRangeOnce) {
  set_parallel_backend(nullptr);
  std::vector<int> hits(1000, 0);
  parallel_for(0, 1000, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(Parallel, BackendSplitsAndEmptyRangeIsNoop) {
  // A two-thread backend: halves the range.
  set_parallel_backend([](int64_t begin, int64_t end, int64_t, ParallelBody body, void* ctx) {
    int64_t mid = begin + (end - begin) / 2;
    std::thread t([&] { body(ctx, begin, mid); });
    body(ctx, mid, end);
    t.join();
  });
  std::vector<std::atomic<int>> hits(1001);
  parallel_for(0, 1001, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  int calls = 0;
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  set_parallel_backend(nullptr);
}

}  // namespace
}  // namespace openneuron::runtime
