// Shared helpers for the kernel gtests: seeded normal data, a two-thread parallel backend (each
// parallel_for split in halves, one on a second thread) and a fixture running a test both
// serially and split.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels::test_util {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(shift, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline void use_two_threads() {
  runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t, runtime::ParallelBody body, void* ctx) {
        const int64_t mid = begin + (end - begin) / 2;
        std::thread t([&] { body(ctx, begin, mid); });
        body(ctx, mid, end);
        t.join();
      });
}

// A kernel test instantiated serially (false) and with the two-thread backend (true).
class SerialAndTwoThreads : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam())
      use_two_threads();
    else
      runtime::set_parallel_backend(nullptr);
  }
  void TearDown() override { runtime::set_parallel_backend(nullptr); }
};

}  // namespace openneuron::kernels::test_util
