// csrc/kernels/gemv against a double reference: both layouts of b (rows contiguous, columns
// contiguous), m = 1..4, n and k off every vector width and panel, alpha / beta, a broadcast c,
// c being y (addmm_), strided a, bfloat16 / float16 storage; and the same bits on every SIMD
// variant this CPU has and on one or two threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/gemv.h"
#include "kernels/kernel_util.h"
#include "runtime/isa.h"
#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

using test_util::randn;

struct Case {
  int64_t m, n, k;
  bool columns_contiguous;  // b as nn.Linear's weight [n, k] transposed
  float alpha = 1, beta = 1;
  bool with_c = true, c_row = false;  // c [m, n], or one row [n] broadcast
  int64_t a_cs = 1;                   // a's column stride (a_rs = k * a_cs)
};

struct Operands {
  std::vector<float> a, b, c;
  GemvArgs g;
};

Operands make(const Case& t, uint32_t seed) {
  Operands o;
  o.a = randn(static_cast<size_t>(t.m * t.k * t.a_cs), seed);
  o.b = randn(static_cast<size_t>(t.k * t.n), seed + 1);
  o.c = randn(static_cast<size_t>(t.c_row ? t.n : t.m * t.n), seed + 2);
  GemvArgs& g = o.g;
  g.m = t.m;
  g.n = t.n;
  g.k = t.k;
  g.a_rs = t.k * t.a_cs;
  g.a_cs = t.a_cs;
  g.b_rs = t.columns_contiguous ? 1 : t.n;
  g.b_cs = t.columns_contiguous ? t.k : 1;
  g.c_rs = t.c_row ? 0 : t.n;
  g.c_cs = 1;
  g.y_rs = t.n;
  g.alpha = t.alpha;
  g.beta = t.beta;
  return o;
}

// y in double, and each result's bound: k * 2^-22 * sum |terms| (float32 sums over k terms).
void reference(const Case& t, const Operands& o, std::vector<double>* y, std::vector<double>* tol) {
  const GemvArgs& g = o.g;
  y->assign(static_cast<size_t>(t.m * t.n), 0.0);
  tol->assign(y->size(), 0.0);
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) {
      double s = 0, abs = 0;
      for (int64_t p = 0; p < t.k; ++p) {
        const double term = double(o.a[i * g.a_rs + p * g.a_cs]) * o.b[p * g.b_rs + j * g.b_cs];
        s += term;
        abs += std::fabs(term);
      }
      double v = t.alpha * s;
      double bound = (t.k + 2) * std::ldexp(std::fabs(t.alpha) * abs, -22);
      if (t.with_c && t.beta != 0) {
        const double cv = o.c[i * g.c_rs + j * g.c_cs];
        v += t.beta * cv;
        bound += std::ldexp(std::fabs(t.beta * cv) + std::fabs(v), -22);
      }
      (*y)[i * t.n + j] = v;
      (*tol)[i * t.n + j] = bound + 1e-30;
    }
  }
}

std::vector<float> run(const Case& t, Operands& o) {
  std::vector<float> y(static_cast<size_t>(t.m * t.n), NAN);
  o.g.a = o.a.data();
  o.g.b = o.b.data();
  o.g.c = t.with_c ? o.c.data() : nullptr;
  o.g.y = y.data();
  EXPECT_TRUE(gemv_supported(o.g));
  gemv(o.g);
  return y;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (bool cc : {false, true}) {
    for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1},
                          {7, 5},
                          {37, 19},
                          {513, 300},
                          {1030, 67},
                          {16, 1024}}) {
        v.push_back({m, n, k, cc});
      }
    }
    v.push_back({2, 100, 33, cc, 0.5f, -2.0f});
    v.push_back({1, 100, 33, cc, 1.0f, 0.0f});                 // beta 0: c unread
    v.push_back({3, 70, 40, cc, 1.0f, 1.0f, false});           // mm: no c
    v.push_back({4, 600, 21, cc, 1.0f, 1.0f, true, true});     // bias row broadcast
    v.push_back({2, 45, 17, cc, 1.0f, 1.0f, true, false, 3});  // strided a
  }
  return v;
}

class GemvKernel : public test_util::SerialAndTwoThreads {
 protected:
  void TearDown() override {
    SerialAndTwoThreads::TearDown();
    runtime::set_isa(runtime::host_isa());
  }
};

TEST_P(GemvKernel, Float32MatchesDoubleReference) {
  uint32_t seed = 1;
  for (const Case& t : cases()) {
    Operands o = make(t, seed += 3);
    std::vector<double> ref, tol;
    reference(t, o, &ref, &tol);
    if (t.beta == 0) std::fill(o.c.begin(), o.c.end(), NAN);  // must not be read
    const std::vector<float> y = run(t, o);
    for (size_t e = 0; e < y.size(); ++e) {
      ASSERT_LE(std::fabs(y[e] - ref[e]), tol[e])
          << "m=" << t.m << " n=" << t.n << " k=" << t.k << " columns=" << t.columns_contiguous
          << " element " << e;
    }
  }
}

TEST_P(GemvKernel, SameBitsOnEveryVariant) {
  // Large enough to run parallel (m * n * k / 16 >= kMinParallelWork) with two threads.
  for (bool cc : {false, true}) {
    const Case t{1, 1100, 1000, cc};
    std::vector<float> first;
    for (runtime::Isa isa : runtime::host_isas()) {
      runtime::set_isa(isa);
      Operands o = make(t, 7);
      const std::vector<float> y = run(t, o);
      if (first.empty()) {
        first = y;
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
            << runtime::isa_name(isa) << " columns=" << cc;
      }
    }
  }
}

TEST_P(GemvKernel, YIsC) {  // addmm_: c read before y is written
  for (bool cc : {false, true}) {
    const Case t{3, 530, 40, cc, 1.0f, 0.5f};
    Operands o = make(t, 11);
    std::vector<double> ref, tol;
    reference(t, o, &ref, &tol);
    o.g.a = o.a.data();
    o.g.b = o.b.data();
    o.g.c = o.c.data();
    o.g.y = o.c.data();
    gemv(o.g);
    for (size_t e = 0; e < ref.size(); ++e) ASSERT_LE(std::fabs(o.c[e] - ref[e]), tol[e]) << e;
  }
}

TEST_P(GemvKernel, ReducedPrecisionStorage) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (bool cc : {false, true}) {
      const Case t{2, 300, 70, cc, 1.0f, 1.0f};
      Operands o = make(t, 5);
      // Round the inputs to the storage dtype; the reference uses the rounded values.
      auto round = [&](std::vector<float>& v, std::vector<uint16_t>* h) {
        h->resize(v.size());
        for (size_t e = 0; e < v.size(); ++e) {
          (*h)[e] = dt == DType::kBFloat16 ? float_to_bf16(v[e]) : float_to_f16(v[e]);
          v[e] = dt == DType::kBFloat16 ? bf16_to_float((*h)[e]) : f16_to_float((*h)[e]);
        }
      };
      std::vector<uint16_t> ha, hb, hc, hy(static_cast<size_t>(t.m * t.n));
      round(o.a, &ha);
      round(o.b, &hb);
      round(o.c, &hc);
      std::vector<double> ref, tol;
      reference(t, o, &ref, &tol);
      o.g.dtype = dt;
      o.g.a = ha.data();
      o.g.b = hb.data();
      o.g.c = hc.data();
      o.g.y = hy.data();
      ASSERT_TRUE(gemv_supported(o.g));
      gemv(o.g);
      const int bits = dt == DType::kBFloat16 ? 8 : 11;  // one rounding of the result
      for (size_t e = 0; e < ref.size(); ++e) {
        const double y = dt == DType::kBFloat16 ? bf16_to_float(hy[e]) : f16_to_float(hy[e]);
        ASSERT_LE(std::fabs(y - ref[e]), tol[e] + std::ldexp(std::fabs(ref[e]), -bits))
            << ir::dtype_name(dt) << " columns=" << cc << " element " << e;
      }
    }
  }
}

TEST(GemvKernelArgs, Supported) {
  GemvArgs g;
  float x = 0;
  g.a = g.b = g.y = &x;
  g.m = 1;
  g.n = 4;
  g.k = 4;
  g.b_rs = 4;
  g.b_cs = 1;
  EXPECT_TRUE(gemv_supported(g));
  g.m = kGemvMaxRows + 1;  // a full matrix product: ATen's
  EXPECT_FALSE(gemv_supported(g));
  g.m = 1;
  g.b_rs = 8;
  g.b_cs = 2;  // neither layout
  EXPECT_FALSE(gemv_supported(g));
  g.b_cs = 1;
  g.dtype = DType::kInt32;
  EXPECT_FALSE(gemv_supported(g));
}

INSTANTIATE_TEST_SUITE_P(Threads, GemvKernel, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "two" : "one"; });

}  // namespace
}  // namespace openneuron::kernels
