// NOTE: FP exceptions are never inspected: without trapping math GCC if-converts the selects
// of exp_f32 and the max reductions, so those loops vectorize. Results are unchanged.
#pragma GCC optimize("no-trapping-math")

#include "kernels/attention.h"

#include <algorithm>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

constexpr int64_t kQueryBlock = 32;

OPENNEURON_INLINE float load1(DType d, const void* p, int64_t i) {
  switch (d) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

template <class D>
OPENNEURON_INLINE void load_vec(const void* p, int64_t off, int64_t n, float* dst) {
  const typename D::T* s = static_cast<const typename D::T*>(p) + off;
  for (int64_t j = 0; j < n; ++j) dst[j] = D::load(s[j]);
}
template <class D>
OPENNEURON_INLINE void store_vec(const float* src, void* p, int64_t off, int64_t n) {
  typename D::T* d = static_cast<typename D::T*>(p) + off;
  for (int64_t j = 0; j < n; ++j) d[j] = D::store(src[j]);
}

OPENNEURON_INLINE int64_t off(const Strides4& st, int64_t b, int64_t h, int64_t r) {
  return b * st.s[0] + h * st.s[1] + r * st.s[2];
}

// Scores of query row i (qf: E floats) against keys [0, n): s[j] = (q . k_j) * scale + mask.
OPENNEURON_INLINE void scores(const AttentionArgs& a, const float* qf, const float* kt,
                              int64_t b, int64_t h, int64_t i, int64_t n, float* s) {
  for (int64_t j = 0; j < n; ++j) s[j] = 0;
  for (int64_t e = 0; e < a.E; ++e) {
    const float qe = qf[e];
    const float* row = kt + e * a.S;
    for (int64_t j = 0; j < n; ++j) s[j] += qe * row[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= a.scale;
  if (a.mask) {
    const int64_t mo = b * a.m.s[0] + h * a.m.s[1] + i * a.m.s[2];
    for (int64_t j = 0; j < n; ++j) s[j] += load1(a.mask_dtype, a.mask, mo + j * a.m.s[3]);
  }
}

template <class D>
OPENNEURON_INLINE void forward_task(const AttentionArgs& a, const void* q, const void* k,
                                    const void* v, void* out, float* lse, int64_t task,
                                    float* buf) {
  const int64_t blocks = (a.L + kQueryBlock - 1) / kQueryBlock;
  const int64_t bh = task / blocks, blk = task % blocks;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t i0 = blk * kQueryBlock, i1 = std::min(a.L, i0 + kQueryBlock);
  float* kt = buf;
  float* vf = kt + a.E * a.S;
  float* s = vf + a.S * a.Ev;
  float* qf = s + a.S;
  float* o = qf + std::max(a.E, a.Ev);
  const int64_t n_max = a.causal ? std::min(a.S, i1) : a.S;
  // Only the keys this block can see.
  {  // kt rows keep stride a.S (scores() reads kt + e * a.S).
    for (int64_t j = 0; j < n_max; ++j) {
      load_vec<D>(k, off(a.k, b, h, j), a.E, o);
      for (int64_t e = 0; e < a.E; ++e) kt[e * a.S + j] = o[e];
      load_vec<D>(v, off(a.v, b, h, j), a.Ev, vf + j * a.Ev);
    }
  }
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t n = a.causal ? std::min(a.S, i + 1) : a.S;
    load_vec<D>(q, off(a.q, b, h, i), a.E, qf);
    scores(a, qf, kt, b, h, i, n, s);
    const float m = max_f32(s, n);
    for (int64_t e = 0; e < a.Ev; ++e) o[e] = 0;
    const int64_t row = (b * a.H + h) * a.L + i;
    if (n == 0 || m == -INFINITY) {
      lse[row] = -INFINITY;
    } else {
      for (int64_t j = 0; j < n; ++j) s[j] = exp_f32(s[j] - m);
      const float sum = sum_f32(s, n);
      for (int64_t j = 0; j < n; ++j) {
        const float p = s[j];
        const float* vr = vf + j * a.Ev;
        for (int64_t e = 0; e < a.Ev; ++e) o[e] += p * vr[e];
      }
      const float inv = 1.0f / sum;
      for (int64_t e = 0; e < a.Ev; ++e) o[e] *= inv;
      lse[row] = m + std::log(sum);
    }
    store_vec<D>(o, out, row * a.Ev, a.Ev);
  }
}

OPENNEURON_KERNEL_TARGETS
void forward_range(const AttentionArgs& a, const void* q, const void* k, const void* v,
                   void* out, float* lse, int64_t t0, int64_t t1, float* buf) {
  for (int64_t t = t0; t < t1; ++t) {
    switch (a.dtype) {
      case DType::F32:
        forward_task<F32>(a, q, k, v, out, lse, t, buf);
        break;
      case DType::BF16:
        forward_task<BF16>(a, q, k, v, out, lse, t, buf);
        break;
      case DType::F16:
        forward_task<F16>(a, q, k, v, out, lse, t, buf);
        break;
    }
  }
}

template <class D>
OPENNEURON_INLINE void backward_task(const AttentionArgs& a, const void* q, const void* k,
                                     const void* v, const void* out, const Strides4& os,
                                     const void* gout, const Strides4& gs, const float* lse,
                                     void* dq, void* dk, void* dv, int64_t bh, float* buf) {
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t S = a.S, E = a.E, Ev = a.Ev;
  float* kt = buf;              // [E][S]
  float* vt = kt + E * S;       // [Ev][S]
  float* kf = vt + Ev * S;      // [S][E]
  float* dkf = kf + S * E;      // [S][E]
  float* dvf = dkf + S * E;     // [S][Ev]
  float* s = dvf + S * Ev;      // [S]
  float* dp = s + S;            // [S]
  float* qf = dp + S;           // [E]
  float* dqf = qf + E;          // [E]
  float* gf = dqf + E;          // [Ev]
  float* of = gf + Ev;          // [Ev]
  for (int64_t j = 0; j < S; ++j) {
    load_vec<D>(k, off(a.k, b, h, j), E, kf + j * E);
    for (int64_t e = 0; e < E; ++e) kt[e * S + j] = kf[j * E + e];
    load_vec<D>(v, off(a.v, b, h, j), Ev, gf);
    for (int64_t e = 0; e < Ev; ++e) vt[e * S + j] = gf[e];
  }
  for (int64_t x = 0; x < S * E; ++x) dkf[x] = 0;
  for (int64_t x = 0; x < S * Ev; ++x) dvf[x] = 0;
  for (int64_t i = 0; i < a.L; ++i) {
    const int64_t row = (b * a.H + h) * a.L + i;
    const int64_t n = a.causal ? std::min(S, i + 1) : S;
    const float l = lse[row];
    for (int64_t e = 0; e < E; ++e) dqf[e] = 0;
    if (n > 0 && l != -INFINITY) {
      load_vec<D>(q, off(a.q, b, h, i), E, qf);
      load_vec<D>(gout, off(gs, b, h, i), Ev, gf);
      load_vec<D>(out, off(os, b, h, i), Ev, of);
      const float di = dot_f32(gf, of, Ev);
      scores(a, qf, kt, b, h, i, n, s);
      for (int64_t j = 0; j < n; ++j) s[j] = exp_f32(s[j] - l);  // probabilities
      for (int64_t j = 0; j < n; ++j) dp[j] = 0;
      for (int64_t e = 0; e < Ev; ++e) {
        const float ge = gf[e];
        const float* vr = vt + e * S;
        for (int64_t j = 0; j < n; ++j) dp[j] += ge * vr[j];
      }
      for (int64_t j = 0; j < n; ++j) dp[j] = s[j] * (dp[j] - di) * a.scale;  // dS * scale
      for (int64_t j = 0; j < n; ++j) {
        const float p = s[j], d = dp[j];
        float* dvr = dvf + j * Ev;
        for (int64_t e = 0; e < Ev; ++e) dvr[e] += p * gf[e];
        const float* kr = kf + j * E;
        float* dkr = dkf + j * E;
        for (int64_t e = 0; e < E; ++e) {
          dqf[e] += d * kr[e];
          dkr[e] += d * qf[e];
        }
      }
    }
    store_vec<D>(dqf, dq, row * E, E);
  }
  const int64_t kv_row = bh * S;
  store_vec<D>(dkf, dk, kv_row * E, S * E);
  store_vec<D>(dvf, dv, kv_row * Ev, S * Ev);
}

OPENNEURON_KERNEL_TARGETS
void backward_range(const AttentionArgs& a, const void* q, const void* k, const void* v,
                    const void* out, const Strides4& os, const void* gout, const Strides4& gs,
                    const float* lse, void* dq, void* dk, void* dv, int64_t t0, int64_t t1,
                    float* buf) {
  for (int64_t t = t0; t < t1; ++t) {
    switch (a.dtype) {
      case DType::F32:
        backward_task<F32>(a, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
      case DType::BF16:
        backward_task<BF16>(a, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
      case DType::F16:
        backward_task<F16>(a, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
    }
  }
}

}  // namespace

void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                       void* out, float* lse) {
  if (a.B <= 0 || a.H <= 0 || a.L <= 0) return;
  const int64_t blocks = (a.L + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = a.B * a.H * blocks;
  const size_t floats =
      static_cast<size_t>(a.E * a.S + a.S * a.Ev + a.S + std::max(a.E, a.Ev) + a.Ev + 16);
  runtime::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(floats);
    forward_range(a, q, k, v, out, lse, t0, t1, buf.data());
  });
}

void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                        const void* out, Strides4 out_strides, const void* grad_out,
                        Strides4 grad_strides, const float* lse, void* dq, void* dk, void* dv) {
  if (a.B <= 0 || a.H <= 0) return;
  const int64_t S = a.S, E = a.E, Ev = a.Ev;
  const size_t floats =
      static_cast<size_t>(E * S + Ev * S + 2 * S * E + S * Ev + 2 * S + 2 * E + 2 * Ev + 16);
  runtime::parallel_for(0, a.B * a.H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(floats);
    backward_range(a, q, k, v, out, out_strides, grad_out, grad_strides, lse, dq, dk, dv, t0, t1,
                   buf.data());
  });
}

}  // namespace openneuron::kernels
