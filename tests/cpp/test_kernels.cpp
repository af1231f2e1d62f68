// The hand-written kernels of csrc/kernels against small scalar (double) references: layer
// norm forward/backward, attention forward/backward (causal, mask, odd sizes), fused Adam/AdamW,
// and the shared helpers (exp, bf16/fp16 conversions). Runs serial and with a 2-thread
// parallel backend.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/adam.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/foreach.h"
#include "kernels/kernel_util.h"
#include "kernels/layer_norm.h"
#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

using test_util::randn;

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "at " << i;
}

class Kernels : public test_util::SerialAndTwoThreads {};

TEST(KernelUtil, ExpMatchesStdExp) {
  for (float x = -100.0f; x < 100.0f; x += 0.173f) {
    const float want = std::exp(x);
    const float got = exp_f32(x);
    if (want < 1e-37f) {
      EXPECT_LT(got, 1e-37f) << x;
    } else if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(got)) << x;
    } else {
      EXPECT_NEAR(got, want, 3e-7f * want) << x;
    }
  }
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(exp_f32(INFINITY)));
  EXPECT_TRUE(std::isnan(exp_f32(NAN)));
}

TEST(KernelUtil, HalfAndBfloatConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(bf16_to_float(0x4049), float_of(0x40490000u));
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);            // overflow -> inf
  EXPECT_EQ(float_to_f16(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_to_float(0x0001), 5.9604645e-08f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  for (uint32_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(float_to_f16(f16_to_float(h)), h);
}

TEST_P(Kernels, LayerNormForwardBackward) {
  const int64_t rows = 37, n = 53;
  auto x = randn(rows * n, 1, 2.0f), w = randn(n, 2), b = randn(n, 3), dy = randn(rows * n, 4);
  std::vector<float> y(rows * n), mean(rows), rstd(rows), dx(rows * n), dw(n), db(n);
  const float eps = 1e-5f;
  LayerNormTypes t;
  layer_norm_forward(t, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, n,
                     eps);
  layer_norm_backward(t, dy.data(), x.data(), mean.data(), rstd.data(), w.data(), dx.data(),
                      dw.data(), db.data(), rows, n);
  std::vector<double> ry(rows * n), rdx(rows * n), rdw(n, 0), rdb(n, 0), rmean(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t k = 0; k < n; ++k) mu += x[r * n + k];
    mu /= n;
    for (int64_t k = 0; k < n; ++k) var += (x[r * n + k] - mu) * (x[r * n + k] - mu);
    var /= n;
    const double rs = 1 / std::sqrt(var + eps);
    rmean[r] = mu;
    double c1 = 0, c2 = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double xh = (x[r * n + k] - mu) * rs;
      ry[r * n + k] = xh * w[k] + b[k];
      rdw[k] += dy[r * n + k] * xh;
      rdb[k] += dy[r * n + k];
      c1 += dy[r * n + k] * w[k] * xh;
      c2 += dy[r * n + k] * w[k];
    }
    for (int64_t k = 0; k < n; ++k) {
      const double xh = (x[r * n + k] - mu) * rs;
      rdx[r * n + k] = rs * (dy[r * n + k] * w[k] - c2 / n - xh * c1 / n);
    }
  }
  expect_near(y, ry, 1e-5);
  expect_near(mean, rmean, 1e-5);
  expect_near(dx, rdx, 1e-4);
  expect_near(dw, rdw, 1e-4);
  expect_near(db, rdb, 1e-4);
}

TEST_P(Kernels, LayerNormBfloatStorage) {
  const int64_t rows = 5, n = 40;
  auto xf = randn(rows * n, 5);
  std::vector<uint16_t> x(rows * n), y(rows * n), mean(rows), rstd(rows);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(xf[i]);
  LayerNormTypes t{DType::kBFloat16, DType::kBFloat16, DType::kBFloat16};
  layer_norm_forward(t, x.data(), nullptr, nullptr, y.data(), mean.data(), rstd.data(), rows, n,
                     1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t k = 0; k < n; ++k) mu += bf16_to_float(x[r * n + k]);
    mu /= n;
    for (int64_t k = 0; k < n; ++k) var += std::pow(bf16_to_float(x[r * n + k]) - mu, 2);
    const double rs = 1 / std::sqrt(var / n + 1e-5);
    for (int64_t k = 0; k < n; ++k)
      ASSERT_NEAR(bf16_to_float(y[r * n + k]), (bf16_to_float(x[r * n + k]) - mu) * rs, 2e-2);
  }
}

// Reference attention in double: returns out, and the gradients for grad_out g.
struct AttnRef {
  std::vector<double> out, dq, dk, dv;
};

AttnRef attention_ref(const AttentionArgs& a, const std::vector<float>& q,
                      const std::vector<float>& k, const std::vector<float>& v,
                      const std::vector<float>& mask, const std::vector<float>& g) {
  const int64_t L = a.L, S = a.S, E = a.E, Ev = a.Ev;
  AttnRef r;
  r.out.assign(a.B * a.H * L * Ev, 0);
  r.dq.assign(a.B * a.H * L * E, 0);
  r.dk.assign(a.B * a.H * S * E, 0);
  r.dv.assign(a.B * a.H * S * Ev, 0);
  for (int64_t bh = 0; bh < a.B * a.H; ++bh) {
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(S, -INFINITY), p(S, 0);
      double m = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        if (a.causal && j > i) continue;
        double d = 0;
        for (int64_t e = 0; e < E; ++e) d += q[(bh * L + i) * E + e] * k[(bh * S + j) * E + e];
        s[j] = d * a.scale + (mask.empty() ? 0.0 : mask[i * S + j]);
        m = std::max(m, s[j]);
      }
      if (m == -INFINITY) continue;
      double sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += (p[j] = std::exp(s[j] - m));
      for (int64_t j = 0; j < S; ++j) p[j] /= sum;
      double di = 0;
      for (int64_t e = 0; e < Ev; ++e) {
        double o = 0;
        for (int64_t j = 0; j < S; ++j) o += p[j] * v[(bh * S + j) * Ev + e];
        r.out[(bh * L + i) * Ev + e] = o;
        di += o * g[(bh * L + i) * Ev + e];
      }
      for (int64_t j = 0; j < S; ++j) {
        double dp = 0;
        for (int64_t e = 0; e < Ev; ++e) {
          dp += g[(bh * L + i) * Ev + e] * v[(bh * S + j) * Ev + e];
          r.dv[(bh * S + j) * Ev + e] += p[j] * g[(bh * L + i) * Ev + e];
        }
        const double ds = p[j] * (dp - di) * a.scale;
        for (int64_t e = 0; e < E; ++e) {
          r.dq[(bh * L + i) * E + e] += ds * k[(bh * S + j) * E + e];
          r.dk[(bh * S + j) * E + e] += ds * q[(bh * L + i) * E + e];
        }
      }
    }
  }
  return r;
}

void run_attention(bool causal, bool with_mask, int64_t L, int64_t S, int64_t E, int64_t Ev) {
  AttentionArgs a;
  a.B = 2;
  a.H = 3;
  a.L = L;
  a.S = S;
  a.E = E;
  a.Ev = Ev;
  a.causal = causal;
  a.scale = 0.3f;
  a.q.s[0] = a.H * L * E, a.q.s[1] = L * E, a.q.s[2] = E;
  a.k.s[0] = a.H * S * E, a.k.s[1] = S * E, a.k.s[2] = E;
  a.v.s[0] = a.H * S * Ev, a.v.s[1] = S * Ev, a.v.s[2] = Ev;
  auto q = randn(a.B * a.H * L * E, 11), k = randn(a.B * a.H * S * E, 12),
       v = randn(a.B * a.H * S * Ev, 13), g = randn(a.B * a.H * L * Ev, 14);
  std::vector<float> mask;
  if (with_mask) {
    mask = randn(L * S, 15);
    for (int64_t j = 0; j < S; j += 3) mask[j] = -INFINITY;  // row 0 partly masked
    a.mask = mask.data();
    a.m.s[0] = 0, a.m.s[1] = 0, a.m.s[2] = S, a.m.s[3] = 1;  // [L, S] broadcast
  }
  std::vector<float> out(a.B * a.H * L * Ev), lse(a.B * a.H * L), dq(q.size()), dk(k.size()),
      dv(v.size());
  attention_forward(a, q.data(), k.data(), v.data(), out.data(), lse.data());
  Strides4 os;
  os.s[0] = a.H * L * Ev, os.s[1] = L * Ev, os.s[2] = Ev;
  attention_backward(a, q.data(), k.data(), v.data(), out.data(), os, g.data(), os, lse.data(),
                     dq.data(), dk.data(), dv.data());
  const AttnRef r = attention_ref(a, q, k, v, mask, g);
  expect_near(out, r.out, 1e-5);
  expect_near(dq, r.dq, 1e-4);
  expect_near(dk, r.dk, 1e-4);
  expect_near(dv, r.dv, 1e-4);
}

TEST_P(Kernels, AttentionPlain) { run_attention(false, false, 37, 45, 16, 24); }
TEST_P(Kernels, AttentionCausal) { run_attention(true, false, 50, 20, 8, 8); }
TEST_P(Kernels, AttentionMaskOddSizes) { run_attention(false, true, 5, 33, 7, 3); }
TEST_P(Kernels, AttentionSingle) { run_attention(true, true, 1, 1, 1, 1); }
// At most 4 query rows: the decode path (K and V read in place; float32 rows of 16 in place).
TEST_P(Kernels, AttentionDecodeRows) { run_attention(false, true, 1, 300, 64, 64); }
TEST_P(Kernels, AttentionDecodeCausalOddSizes) { run_attention(true, false, 3, 70, 7, 40); }

TEST_P(Kernels, AdamWMatchesScalarReference) {
  for (bool adamw : {false, true}) {
    for (bool amsgrad : {false, true}) {
      const int64_t n = 70001;  // several chunks, odd tail
      auto p = randn(n, 21), g = randn(n, 22), m = randn(n, 23, 0.1f), v = randn(n, 24, 0.1f);
      for (auto& x : v) x = x * x;
      std::vector<float> vmax(v), p0(p), m0(m), v0(v);
      const float step = 3;
      AdamTensor t;
      t.param = p.data(), t.grad = g.data(), t.exp_avg = m.data(), t.exp_avg_sq = v.data();
      t.max_exp_avg_sq = vmax.data(), t.step = &step, t.numel = n;
      AdamConfig c;
      c.lr = 0.01, c.weight_decay = 0.1, c.adamw = adamw, c.amsgrad = amsgrad;
      adam_step(c, &t, 1);
      const double bc1 = 1 - std::pow(c.beta1, 3.0), bc2 = 1 - std::pow(c.beta2, 3.0);
      for (int64_t i = 0; i < n; i += 97) {
        double pi = p0[i], gi = g[i];
        if (adamw)
          pi *= 1 - c.lr * c.weight_decay;
        else
          gi += c.weight_decay * pi;
        const double mi = c.beta1 * m0[i] + (1 - c.beta1) * gi;
        double vi = c.beta2 * v0[i] + (1 - c.beta2) * gi * gi;
        if (amsgrad) vi = std::max<double>(v0[i], vi);  // vmax started as v0
        pi -= c.lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + c.eps);
        ASSERT_NEAR(p[i], pi, 1e-5 * (1 + std::fabs(pi))) << i;
        ASSERT_NEAR(m[i], mi, 1e-6 * (1 + std::fabs(mi))) << i;
      }
    }
  }
}

TEST_P(Kernels, AdamSkipsOnFoundInf) {
  std::vector<float> p{1, 2}, g{1, 1}, m{0, 0}, v{0, 0};
  const float step = 1, inf_flag = 1;
  AdamTensor t;
  t.param = p.data(), t.grad = g.data(), t.exp_avg = m.data(), t.exp_avg_sq = v.data();
  t.step = &step, t.numel = 2;
  AdamConfig c;
  c.found_inf = &inf_flag;
  adam_step(c, &t, 1);
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[1], 2);
}

INSTANTIATE_TEST_SUITE_P(SerialAndParallel, Kernels, ::testing::Bool());

}  // namespace
}  // namespace openneuron::kernels

namespace openneuron::kernels {
namespace {

TEST_P(Kernels, EmbeddingBackwardSumsRowsInOrder) {
  const int64_t n = 300, dim = 5, nw = 1000;
  auto g = randn(n * dim, 31);
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = (i * 37) % 13 * 71 % nw;
  idx[7] = 2;  // padding
  std::vector<float> out(nw * dim, -1.0f);
  int64_t bad = -1;
  embedding_backward(DType::kFloat32, g.data(), idx.data(), false, n, dim, nw, 2, out.data(), &bad);
  EXPECT_EQ(bad, 0);
  std::vector<float> ref(nw * dim, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] != 2)
      for (int64_t d = 0; d < dim; ++d) ref[idx[i] * dim + d] += g[i * dim + d];
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(out[i], ref[i]) << i;  // same order: bitwise
  // -1 is the padding index here (skipped, as ATen does); 1000 and -2 are out of range.
  std::vector<int32_t> idx32{0, 1000, -1, -2, 4};
  embedding_backward(DType::kFloat32, g.data(), idx32.data(), true, 5, dim, nw, -1, out.data(),
                     &bad);
  EXPECT_EQ(bad, 2);
}

}  // namespace
}  // namespace openneuron::kernels

namespace openneuron::kernels {
namespace {

TEST_P(Kernels, ForeachOpsMatchScalarMath) {
  auto a0 = randn(40000, 41), b = randn(40000, 42), c = randn(40000, 43);
  for (auto& x : c) x = std::fabs(x) + 0.5f;
  const ForeachOp ops[] = {ForeachOp::MulScalar, ForeachOp::AddScalar, ForeachOp::DivScalar,
                           ForeachOp::Lerp,      ForeachOp::Addcmul,   ForeachOp::Addcdiv,
                           ForeachOp::Sqrt};
  for (ForeachOp op : ops) {
    std::vector<float> a(a0), out(a0.size());
    if (op == ForeachOp::Sqrt)
      for (auto& x : a) x = std::fabs(x);
    ForeachTensor t[2];
    for (int i = 0; i < 2; ++i) {  // two tensors: [0, 30000) and [30000, 40000)
      const int64_t off = i == 0 ? 0 : 30000;
      t[i].a = a.data() + off;
      t[i].out = out.data() + off;
      t[i].b = b.data() + off;
      t[i].c = c.data() + off;
      t[i].s = i == 0 ? 0.3f : 0.8f;
      t[i].numel = i == 0 ? 30000 : 10000;
    }
    foreach_apply(op, DType::kFloat32, t, 2);
    for (int64_t i = 0; i < 40000; i += 7) {
      const float s = i < 30000 ? 0.3f : 0.8f, x = a[i], y = b[i], z = c[i];
      float want = 0;
      switch (op) {
        case ForeachOp::MulScalar:
          want = x * s;
          break;
        case ForeachOp::AddScalar:
          want = x + s;
          break;
        case ForeachOp::DivScalar:
          want = x / s;
          break;
        case ForeachOp::Lerp:
          want = s < 0.5f ? x + s * (y - x) : y - (y - x) * (1 - s);
          break;
        case ForeachOp::Addcmul:
          want = x + s * y * z;
          break;
        case ForeachOp::Addcdiv:
          want = x + s * y / z;
          break;
        case ForeachOp::Sqrt:
          want = std::sqrt(x);
          break;
      }
      ASSERT_EQ(out[i], want) << static_cast<int>(op) << " at " << i;  // same float ops
    }
  }
}

}  // namespace
}  // namespace openneuron::kernels
