// csrc/kernels/rms_norm against a scalar double reference: forward (with / without weight),
// backward (dx, dweight, each optional), bf16 / fp16 storage with a float32 weight, and
// dweight bitwise independent of the thread count; and the fused cross-entropy kernel vs a
// double log-softmax reference. Runs serial and with a 2-thread backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cross_entropy.h"
#include "kernels/kernel_util.h"
#include "kernels/rms_norm.h"
#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

using test_util::randn;
using test_util::use_two_threads;

class RmsNormKernel : public test_util::SerialAndTwoThreads {};

struct Ref {
  std::vector<double> y, rstd, dx, dw;
};

// Double reference of y = x * rstd * w and its gradients for grad_out g.
Ref reference(const std::vector<float>& x, const float* w, const std::vector<float>& g,
              int64_t rows, int64_t n, double eps) {
  Ref r;
  r.y.resize(rows * n);
  r.dx.resize(rows * n);
  r.dw.assign(n, 0.0);
  r.rstd.resize(rows);
  for (int64_t i = 0; i < rows; ++i) {
    double ms = 0;
    for (int64_t k = 0; k < n; ++k) ms += double(x[i * n + k]) * x[i * n + k];
    const double rs = 1 / std::sqrt(ms / n + eps);
    r.rstd[i] = rs;
    double c = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double xh = x[i * n + k] * rs, wk = w ? w[k] : 1.0;
      r.y[i * n + k] = xh * wk;
      r.dw[k] += g[i * n + k] * xh;
      c += g[i * n + k] * wk * xh;
    }
    c /= n;
    for (int64_t k = 0; k < n; ++k) {
      const double wk = w ? w[k] : 1.0;
      r.dx[i * n + k] = rs * (g[i * n + k] * wk - x[i * n + k] * rs * c);
    }
  }
  return r;
}

void expect_near(const float* got, const std::vector<double>& want, double tol) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "at " << i;
}

TEST_P(RmsNormKernel, Float32ForwardBackward) {
  for (const bool with_w : {true, false}) {
    for (const auto& [rows, n] :
         {std::pair<int64_t, int64_t>{37, 256}, {5, 33}, {1, 1}, {300, 7}}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << n << " weight " << with_w);
      const auto x = randn(rows * n, 1, 2.0f, 0.5f);
      const auto w = randn(n, 2, 0.3f, 1.0f);
      const auto g = randn(rows * n, 3);
      const float* wp = with_w ? w.data() : nullptr;
      std::vector<float> y(rows * n), rstd(rows), dx(rows * n), dw(n, -1.0f);
      const RmsNormTypes t{DType::kFloat32, DType::kFloat32};
      rms_norm_forward(t, x.data(), wp, y.data(), rstd.data(), rows, n, 1e-5f);
      rms_norm_backward(t, g.data(), x.data(), rstd.data(), wp, dx.data(),
                        with_w ? dw.data() : nullptr, rows, n);
      const Ref r = reference(x, wp, g, rows, n, 1e-5);
      expect_near(y.data(), r.y, 1e-5);
      expect_near(rstd.data(), r.rstd, 1e-5);
      expect_near(dx.data(), r.dx, 1e-4);
      if (with_w)
        expect_near(dw.data(), r.dw, 1e-4);
      else
        for (float v : dw) ASSERT_EQ(v, -1.0f);  // not written
      // dweight alone (dx not wanted).
      std::vector<float> dw2(n);
      rms_norm_backward(t, g.data(), x.data(), rstd.data(), wp, nullptr, dw2.data(), rows, n);
      expect_near(dw2.data(), r.dw, 1e-4);
    }
  }
}

TEST_P(RmsNormKernel, HalfStorageWithFloatWeight) {
  const int64_t rows = 9, n = 40;
  for (const DType d : {DType::kBFloat16, DType::kFloat16}) {
    const auto xf = randn(rows * n, 4);
    const auto gf = randn(rows * n, 5);
    const auto w = randn(n, 6, 0.3f, 1.0f);
    auto to16 = [&](float v) { return d == DType::kBFloat16 ? float_to_bf16(v) : float_to_f16(v); };
    auto from16 = [&](uint16_t v) {
      return d == DType::kBFloat16 ? bf16_to_float(v) : f16_to_float(v);
    };
    std::vector<uint16_t> x(rows * n), g(rows * n), y(rows * n), dx(rows * n);
    std::vector<float> xr(rows * n), gr(rows * n), rstd(rows), dw(n);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = to16(xf[i]);
      g[i] = to16(gf[i]);
      xr[i] = from16(x[i]);
      gr[i] = from16(g[i]);
    }
    const RmsNormTypes t{d, DType::kFloat32};
    rms_norm_forward(t, x.data(), w.data(), y.data(), rstd.data(), rows, n, 1e-6f);
    rms_norm_backward(t, g.data(), x.data(), rstd.data(), w.data(), dx.data(), dw.data(), rows, n);
    const Ref r = reference(xr, w.data(), gr, rows, n, 1e-6);
    const double tol = d == DType::kBFloat16 ? 1e-2 : 1e-3;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(from16(y[i]), r.y[i], tol * (1 + std::fabs(r.y[i])));
      ASSERT_NEAR(from16(dx[i]), r.dx[i], tol * (1 + std::fabs(r.dx[i])));
    }
    expect_near(dw.data(), r.dw, 1e-4);  // float32 weight gradient
  }
}

TEST(RmsNormKernelDeterminism, WeightGradIndependentOfThreads) {
  const int64_t rows = 1000, n = 64;
  const auto x = randn(rows * n, 7), g = randn(rows * n, 8), w = randn(n, 9);
  std::vector<float> rstd(rows), y(rows * n), dw1(n), dw2(n), dx1(rows * n), dx2(rows * n);
  const RmsNormTypes t{DType::kFloat32, DType::kFloat32};
  rms_norm_forward(t, x.data(), w.data(), y.data(), rstd.data(), rows, n, 1e-5f);
  rms_norm_backward(t, g.data(), x.data(), rstd.data(), w.data(), dx1.data(), dw1.data(), rows, n);
  use_two_threads();
  rms_norm_backward(t, g.data(), x.data(), rstd.data(), w.data(), dx2.data(), dw2.data(), rows, n);
  runtime::set_parallel_backend(nullptr);
  EXPECT_EQ(0, std::memcmp(dw1.data(), dw2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(float)));
}

// Fused cross-entropy (kernels/cross_entropy.h) against a double log-softmax reference.
TEST_P(RmsNormKernel, CrossEntropyForwardBackward) {
  const int64_t rows = 50, classes = 700, ignore = -100;
  const auto x = randn(rows * classes, 10, 3.0f);
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 0 ? ignore : (r * 37) % classes;
  const auto gr = randn(rows, 11);
  std::vector<float> loss(rows), lse(rows), dx(rows * classes);
  EXPECT_EQ(0, cross_entropy_forward(DType::kFloat32, x.data(), t.data(), loss.data(), lse.data(),
                                     rows, classes, ignore));
  cross_entropy_backward(DType::kFloat32, x.data(), t.data(), lse.data(), gr.data(), 1, 0.5f,
                         dx.data(), rows, classes, ignore);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (int64_t k = 0; k < classes; ++k) m = std::max(m, double(x[r * classes + k]));
    for (int64_t k = 0; k < classes; ++k) s += std::exp(double(x[r * classes + k]) - m);
    const double l = m + std::log(s);
    ASSERT_NEAR(lse[r], l, 1e-5 * (1 + std::fabs(l)));
    const bool ign = t[r] == ignore;
    ASSERT_NEAR(loss[r], ign ? 0.0 : l - x[r * classes + t[r]], 1e-4);
    for (int64_t k = 0; k < classes; ++k) {
      const double want =
          ign ? 0.0
              : (std::exp(double(x[r * classes + k]) - l) - (k == t[r] ? 1.0 : 0.0)) * gr[r] * 0.5;
      ASSERT_NEAR(dx[r * classes + k], want, 1e-6) << r << "," << k;
    }
  }
  t[3] = classes;  // out of range: counted, not read
  EXPECT_EQ(1, cross_entropy_forward(DType::kFloat32, x.data(), t.data(), loss.data(), lse.data(),
                                     rows, classes, ignore));
}

INSTANTIATE_TEST_SUITE_P(SerialAndParallel, RmsNormKernel, ::testing::Bool());

}  // namespace
}  // namespace openneuron::kernels
