#include "kernels/attention.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "runtime/isa.h"
#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

constexpr int64_t kQueryBlock = 32;  // query rows per forward task (share one K/V load)
constexpr int64_t kRows = 8;         // query rows per micro-kernel call (register blocking)

OPENNEURON_INLINE int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Row stride of the key-major buffers (K^T, V^T, score rows): the keys padded to 16, plus 16
// floats (one cache line) so that walking down a column does not hit one L1 set: the score
// micro-kernel reads K^T's E rows at this stride, and at a power-of-two row of 1 KiB or more
// those rows alias in a 12-way L1 (forward of [1, 8, 1024, 64] fp32: 18.7 -> 8.3 ms).
OPENNEURON_INLINE int64_t key_stride(int64_t keys) { return round16(keys) + 16; }

OPENNEURON_INLINE int64_t off(const Strides4& st, int64_t b, int64_t h, int64_t r) {
  return b * st.s[0] + h * st.s[1] + r * st.s[2];
}

// The micro-kernels below run on the active variant's own register width (kernel_util.h,
// VecF): with 16-float vectors the AVX2 forward ran 3x slower than ATen's flash kernel
// ([8, 4, 128, 32] causal: 3.4 vs 1.0 ms on an AVX2-only EPYC). Every width adds each output's
// terms in the same order.

// C[r][0, ncols) = sum_{e < k} A[r][e] * B[e][0, ncols) for the kRows rows of A (row stride
// lda) and C (ldc); B has row stride ldb; ncols is a multiple of 16. The kRows x lanes block of
// C stays in registers while e runs.
template <class V>
OPENNEURON_INLINE void gemm_rows_v(const float* A, int64_t lda, int64_t k, const float* B,
                                   int64_t ldb, int64_t ncols, float* C, int64_t ldc) {
  for (int64_t jb = 0; jb < ncols; jb += kLanesOf<V>) {
    V c[kRows] = {};
    for (int64_t e = 0; e < k; ++e) {
      V b;
      load_n(&b, B + e * ldb + jb);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) c[r] += b * A[r * lda + e];
    }
#pragma GCC unroll 8
    for (int64_t r = 0; r < kRows; ++r) store_n(C + r * ldc + jb, c[r]);
  }
}

// C[j][0, ncols) += sum_r coef[r][j] * X[r][0, ncols) for j < rows (a rank-kRows update).
template <class V>
OPENNEURON_INLINE void rank_update_v(float* C, int64_t ldc, int64_t rows, int64_t ncols,
                                     const float* coef, int64_t ldcoef, const float* X,
                                     int64_t ldx) {
  for (int64_t eb = 0; eb < ncols; eb += kLanesOf<V>) {
    V x[kRows];
#pragma GCC unroll 8
    for (int64_t r = 0; r < kRows; ++r) load_n(&x[r], X + r * ldx + eb);
    for (int64_t j = 0; j < rows; ++j) {
      V c;
      load_n(&c, C + j * ldc + eb);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) c += x[r] * coef[r * ldcoef + j];
      store_n(C + j * ldc + eb, c);
    }
  }
}

// The two on the active variant's vector type (inlined into each variant's clone).
OPENNEURON_INLINE void gemm_rows(const float* A, int64_t lda, int64_t k, const float* B,
                                 int64_t ldb, int64_t ncols, float* C, int64_t ldc) {
  with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    gemm_rows_v<typename decltype(tag)::type>(A, lda, k, B, ldb, ncols, C, ldc);
  });
}
OPENNEURON_INLINE void rank_update(float* C, int64_t ldc, int64_t rows, int64_t ncols,
                                   const float* coef, int64_t ldcoef, const float* X, int64_t ldx) {
  with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    rank_update_v<typename decltype(tag)::type>(C, ldc, rows, ncols, coef, ldcoef, X, ldx);
  });
}

// Loads up to kRows rows [i0, i0 + count) of a [*, n] operand as floats into dst (row stride
// ld, zero padded to ld; missing rows zero).
template <class D>
OPENNEURON_INLINE void load_rows(const void* p, const Strides4& st, int64_t b, int64_t h,
                                 int64_t i0, int64_t count, int64_t n, float* dst, int64_t ld) {
  for (int64_t r = 0; r < kRows; ++r) {
    float* row = dst + r * ld;
    for (int64_t e = 0; e < ld; ++e) row[e] = 0;
    if (r < count) to_float<D>(p, off(st, b, h, i0 + r), n, row);
  }
}

// Adds row i's additive mask to its scores s[0, n).
OPENNEURON_INLINE void add_mask(const AttentionArgs& a, int64_t b, int64_t h, int64_t i, float* s,
                                int64_t n) {
  const int64_t mo = b * a.m.s[0] + h * a.m.s[1] + i * a.m.s[2];
  for (int64_t j = 0; j < n; ++j) s[j] += load_any(a.mask_dtype, a.mask, mo + j * a.m.s[3]);
}

// Scores of rows [i0, i0 + count) against keys [0, n): s[r][j] = (q_r . k_j) * scale + mask,
// -inf past each row's causal limit (columns up to nc = round16(n) are written).
OPENNEURON_INLINE void scores4(const AttentionArgs& a, const float* q4, int64_t ldq,
                               const float* kt, int64_t ldk, int64_t b, int64_t h, int64_t i0,
                               int64_t count, int64_t n, float* s4, int64_t lds) {
  gemm_rows(q4, ldq, a.E, kt, ldk, round16(n), s4, lds);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t i = i0 + r;
    float* s = s4 + r * lds;
    const int64_t nr = a.causal ? std::min(n, i + 1) : n;
    for (int64_t j = 0; j < nr; ++j) s[j] *= a.scale;
    if (a.mask) add_mask(a, b, h, i, s, nr);
    for (int64_t j = nr; j < n; ++j) s[j] = -INFINITY;
  }
}

// K transposed ([E][ldk], keys [0, n)) and V ([n][ldv]) of (b, h) as floats.
template <class D>
OPENNEURON_INLINE void load_kv(const AttentionArgs& a, const void* k, const void* v, int64_t b,
                               int64_t h, int64_t n, float* kt, int64_t ldk, float* vf, int64_t ldv,
                               float* tmp) {
  for (int64_t j = 0; j < n; ++j) {
    to_float<D>(k, off(a.k, b, h, j), a.E, tmp);
    for (int64_t e = 0; e < a.E; ++e) kt[e * ldk + j] = tmp[e];
    float* vr = vf + j * ldv;
    to_float<D>(v, off(a.v, b, h, j), a.Ev, vr);
    for (int64_t e = a.Ev; e < ldv; ++e) vr[e] = 0;
  }
  for (int64_t e = 0; e < a.E; ++e)
    for (int64_t j = n; j < round16(n); ++j) kt[e * ldk + j] = 0;
}

struct FwdLayout {
  int64_t ldk, ldv, ldq;  // Kt row stride (keys, padded), V row stride, q row stride
  size_t floats;
};

FwdLayout fwd_layout(const AttentionArgs& a) {
  FwdLayout l;
  l.ldk = key_stride(a.S);
  l.ldv = round16(a.Ev);
  l.ldq = round16(a.E);
  l.floats = static_cast<size_t>(a.E * l.ldk + a.S * l.ldv + kRows * l.ldq + kRows * l.ldk +
                                 kRows * l.ldv + l.ldq + 64);
  return l;
}

template <class D>
OPENNEURON_INLINE void forward_task(const AttentionArgs& a, const FwdLayout& l, const void* q,
                                    const void* k, const void* v, void* out, float* lse,
                                    int64_t task, float* buf) {
  const int64_t blocks = (a.L + kQueryBlock - 1) / kQueryBlock;
  const int64_t bh = task / blocks, blk = task % blocks;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t i0 = blk * kQueryBlock, i1 = std::min(a.L, i0 + kQueryBlock);
  float* kt = buf;                  // [E][ldk]
  float* vf = kt + a.E * l.ldk;     // [S][ldv]
  float* q4 = vf + a.S * l.ldv;     // [kRows][ldq]
  float* s4 = q4 + kRows * l.ldq;   // [kRows][ldk]
  float* o4 = s4 + kRows * l.ldk;   // [kRows][ldv]
  float* tmp = o4 + kRows * l.ldv;  // [ldq]
  const int64_t n_max = a.causal ? std::min(a.S, i1) : a.S;
  load_kv<D>(a, k, v, b, h, n_max, kt, l.ldk, vf, l.ldv, tmp);
  for (int64_t g = i0; g < i1; g += kRows) {
    const int64_t count = std::min(kRows, i1 - g);
    const int64_t n = a.causal ? std::min(a.S, g + count) : a.S;
    float inv[kRows] = {};
    load_rows<D>(q, a.q, b, h, g, count, a.E, q4, l.ldq);
    if (n > 0) scores4(a, q4, l.ldq, kt, l.ldk, b, h, g, count, n, s4, l.ldk);
    for (int64_t r = 0; r < kRows; ++r) {
      float* s = s4 + r * l.ldk;
      const int64_t row = (b * a.H + h) * a.L + g + r;
      const float m = r < count && n > 0 ? max_f32(s, n) : -INFINITY;
      if (m == -INFINITY) {  // fully masked (or a padding row): p = 0, out = 0
        for (int64_t j = 0; j < n; ++j) s[j] = 0;
        if (r < count) lse[row] = -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < n; ++j) s[j] = exp_f32(s[j] - m);
      const float sum = sum_f32(s, n);
      inv[r] = 1.0f / sum;
      lse[row] = m + std::log(sum);
    }
    gemm_rows(s4, l.ldk, n, vf, l.ldv, l.ldv, o4, l.ldv);
    for (int64_t r = 0; r < count; ++r) {
      float* o = o4 + r * l.ldv;
      for (int64_t e = 0; e < a.Ev; ++e) o[e] *= inv[r];
      from_float<D>(o, out, off(a.out, b, h, g + r), a.Ev);
    }
  }
}

// Decode-shaped attention (at most kDirectRows query rows against any number of keys): each
// row's scores are dot products with K's rows and its output a weighted sum of V's rows, both
// read in place. The blocked path above copies K transposed and V for every task and computes
// kRows rows at a time; for one query row that copy and the padding cost ~10x the attention
// itself (one [1, 4, 1, 64] query against 1024 keys, fp32, one thread: 241 -> 47 us; ATen's
// flash kernel on CPU: 56 us).
constexpr int64_t kDirectRows = 4;

typedef int32_t VecI __attribute__((vector_size(64)));
typedef int32_t VecI8 __attribute__((vector_size(32)));
typedef int32_t VecI4 __attribute__((vector_size(16)));

// Lane 0 of a halving tree over one vector's lanes (lane l += lane l ^ w for w = lanes/2 .. 1).
OPENNEURON_INLINE float tree_lane0(const VecF& v) {
  VecF acc = v;
  acc += __builtin_shuffle(acc, VecI{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  acc += __builtin_shuffle(acc, VecI{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  acc += __builtin_shuffle(acc, VecI{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  acc += __builtin_shuffle(acc, VecI{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return acc[0];
}
OPENNEURON_INLINE float tree_lane0(const Vec8& v) {
  Vec8 acc = v;
  acc += __builtin_shuffle(acc, VecI8{4, 5, 6, 7, 0, 1, 2, 3});
  acc += __builtin_shuffle(acc, VecI8{2, 3, 0, 1, 6, 7, 4, 5});
  acc += __builtin_shuffle(acc, VecI8{1, 0, 3, 2, 5, 4, 7, 6});
  return acc[0];
}
OPENNEURON_INLINE float tree_lane0(const Vec4& v) {
  Vec4 acc = v;
  acc += __builtin_shuffle(acc, VecI4{2, 3, 0, 1});
  acc += __builtin_shuffle(acc, VecI4{1, 0, 3, 2});
  return acc[0];
}

// q . k over n floats (n a multiple of kLanes): products in 16 lanes (as kLanes / lanes vectors
// of V), then a halving tree across the 16 lanes: the same order in every ISA variant, and no
// serial chain of 16 adds per key.
template <class V>
OPENNEURON_INLINE float dot_lanes(const float* q, const float* k, int64_t n) {
  constexpr int64_t P = kLanes / kLanesOf<V>;
  V acc[P] = {};
  for (int64_t e = 0; e < n; e += kLanes) {
#pragma GCC unroll 4
    for (int64_t p = 0; p < P; ++p) {
      V a, b;
      load_n(&a, q + e + p * kLanesOf<V>);
      load_n(&b, k + e + p * kLanesOf<V>);
      acc[p] += a * b;
    }
  }
  for (int64_t w = P / 2; w >= 1; w /= 2)
    for (int64_t p = 0; p < w; ++p) acc[p] += acc[p + w];
  return tree_lane0(acc[0]);
}

// A row of n elements as floats padded with zeros to round16(n): float32 rows of a multiple
// of kLanes in place, others converted into tmp (whose padding is zero).
template <class D>
OPENNEURON_INLINE const float* row_f32(const void* src, int64_t offset, int64_t n, float* tmp) {
  if constexpr (std::is_same_v<D, F32>) {
    if (n % kLanes == 0) return static_cast<const float*>(src) + offset;
  }
  to_float<D>(src, offset, n, tmp);
  return tmp;
}

size_t direct_floats(const AttentionArgs& a) {
  return static_cast<size_t>(2 * round16(a.E) + 2 * round16(a.Ev) + round16(a.S) + 64);
}

template <class D, class V>
OPENNEURON_INLINE void forward_row_direct(const AttentionArgs& a, const void* q, const void* k,
                                          const void* v, void* out, float* lse, int64_t task,
                                          float* buf) {
  const int64_t i = task % a.L, bh = task / a.L;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t lde = round16(a.E), ldv = round16(a.Ev);
  float* qf = buf;       // [lde]
  float* kr = qf + lde;  // [lde]
  float* o = kr + lde;   // [ldv]
  float* vr = o + ldv;   // [ldv]
  float* s = vr + ldv;   // [S]
  for (int64_t e = 0; e < lde; ++e) qf[e] = kr[e] = 0;
  for (int64_t e = 0; e < ldv; ++e) o[e] = vr[e] = 0;
  to_float<D>(q, off(a.q, b, h, i), a.E, qf);
  const int64_t n = a.causal ? std::min(a.S, i + 1) : a.S;
  const int64_t row = bh * a.L + i;
  for (int64_t j = 0; j < n; ++j)
    s[j] = dot_lanes<V>(qf, row_f32<D>(k, off(a.k, b, h, j), a.E, kr), lde) * a.scale;
  if (a.mask) add_mask(a, b, h, i, s, n);
  const float m = n > 0 ? max_f32(s, n) : -INFINITY;
  if (m == -INFINITY) {  // fully masked: out = 0
    lse[row] = -INFINITY;
    from_float<D>(o, out, off(a.out, b, h, i), a.Ev);
    return;
  }
  for (int64_t j = 0; j < n; ++j) s[j] = exp_f32(s[j] - m);
  const float sum = sum_f32(s, n);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = row_f32<D>(v, off(a.v, b, h, j), a.Ev, vr);
    for (int64_t e = 0; e < ldv; e += kLanesOf<V>) {
      V acc, x;
      load_n(&acc, o + e);
      load_n(&x, vj + e);
      acc += x * s[j];
      store_n(o + e, acc);
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < a.Ev; ++e) o[e] *= inv;
  from_float<D>(o, out, off(a.out, b, h, i), a.Ev);
  lse[row] = m + std::log(sum);
}

template <class V>
OPENNEURON_INLINE void forward_direct_v(const AttentionArgs& a, const void* q, const void* k,
                                        const void* v, void* out, float* lse, int64_t t0,
                                        int64_t t1, float* buf) {
  for (int64_t t = t0; t < t1; ++t) {
    switch (a.dtype) {
      case DType::kFloat32:
        forward_row_direct<F32, V>(a, q, k, v, out, lse, t, buf);
        break;
      case DType::kBFloat16:
        forward_row_direct<BF16, V>(a, q, k, v, out, lse, t, buf);
        break;
      case DType::kFloat16:
        forward_row_direct<F16, V>(a, q, k, v, out, lse, t, buf);
        break;
      default:  // not a kernel dtype: callers take only these three
        break;
    }
  }
}

OPENNEURON_ISA_BODY void forward_direct_body(const AttentionArgs& a, const void* q, const void* k,
                                             const void* v, void* out, float* lse, int64_t t0,
                                             int64_t t1, float* buf) {
  with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    forward_direct_v<typename decltype(tag)::type>(a, q, k, v, out, lse, t0, t1, buf);
  });
}
OPENNEURON_ISA_DISPATCH(void, forward_direct,
                        (const AttentionArgs& a, const void* q, const void* k, const void* v,
                         void* out, float* lse, int64_t t0, int64_t t1, float* buf),
                        (a, q, k, v, out, lse, t0, t1, buf))

OPENNEURON_ISA_BODY void forward_range_body(const AttentionArgs& a, const FwdLayout& l,
                                            const void* q, const void* k, const void* v, void* out,
                                            float* lse, int64_t t0, int64_t t1, float* buf) {
  for (int64_t t = t0; t < t1; ++t) {
    switch (a.dtype) {
      case DType::kFloat32:
        forward_task<F32>(a, l, q, k, v, out, lse, t, buf);
        break;
      case DType::kBFloat16:
        forward_task<BF16>(a, l, q, k, v, out, lse, t, buf);
        break;
      case DType::kFloat16:
        forward_task<F16>(a, l, q, k, v, out, lse, t, buf);
        break;
      default:  // not a kernel dtype: callers take only these three
        break;
    }
  }
}
OPENNEURON_ISA_DISPATCH(void, forward_range,
                        (const AttentionArgs& a, const FwdLayout& l, const void* q, const void* k,
                         const void* v, void* out, float* lse, int64_t t0, int64_t t1, float* buf),
                        (a, l, q, k, v, out, lse, t0, t1, buf))

struct BwdLayout {
  int64_t ldk, lde, ldv;  // keys padded, E padded, Ev padded
  size_t floats;
};

BwdLayout bwd_layout(const AttentionArgs& a) {
  BwdLayout l;
  l.ldk = key_stride(a.S);
  l.lde = round16(a.E);
  l.ldv = round16(a.Ev);
  const int64_t S = a.S;
  l.floats = static_cast<size_t>(a.E * l.ldk + a.Ev * l.ldk + S * l.lde + S * l.lde + S * l.ldv +
                                 S * l.ldv + 3 * kRows * l.ldk + 2 * kRows * l.lde +
                                 2 * kRows * l.ldv + l.lde + l.ldv + 64);
  return l;
}

template <class D>
OPENNEURON_INLINE void backward_task(const AttentionArgs& a, const BwdLayout& l, const void* q,
                                     const void* k, const void* v, const void* out,
                                     const Strides4& os, const void* gout, const Strides4& gs,
                                     const float* lse, void* dq, void* dk, void* dv, int64_t bh,
                                     float* buf) {
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t S = a.S, E = a.E, Ev = a.Ev;
  float* kt = buf;                  // [E][ldk]   K^T
  float* vt = kt + E * l.ldk;       // [Ev][ldk]  V^T
  float* kf = vt + Ev * l.ldk;      // [S][lde]   K
  float* dkf = kf + S * l.lde;      // [S][lde]
  float* vf = dkf + S * l.lde;      // [S][ldv]   V
  float* dvf = vf + S * l.ldv;      // [S][ldv]
  float* p4 = dvf + S * l.ldv;      // [kRows][ldk] probabilities
  float* dp4 = p4 + kRows * l.ldk;  // [kRows][ldk] dP, then dS * scale
  float* q4 = dp4 + kRows * l.ldk;  // [kRows][lde]
  float* dq4 = q4 + kRows * l.lde;  // [kRows][lde]
  float* g4 = dq4 + kRows * l.lde;  // [kRows][ldv] grad_out rows
  float* o4 = g4 + kRows * l.ldv;   // [kRows][ldv] out rows
  load_kv<D>(a, k, v, b, h, S, kt, l.ldk, vf, l.ldv, dkf);
  for (int64_t j = 0; j < S; ++j) {
    float* kr = kf + j * l.lde;
    to_float<D>(k, off(a.k, b, h, j), E, kr);
    for (int64_t e = E; e < l.lde; ++e) kr[e] = 0;
    for (int64_t e = 0; e < Ev; ++e) vt[e * l.ldk + j] = vf[j * l.ldv + e];
  }
  for (int64_t e = 0; e < Ev; ++e)
    for (int64_t j = S; j < l.ldk; ++j) vt[e * l.ldk + j] = 0;
  for (int64_t x = 0; x < S * l.lde; ++x) dkf[x] = 0;
  for (int64_t x = 0; x < S * l.ldv; ++x) dvf[x] = 0;
  for (int64_t g = 0; g < a.L; g += kRows) {
    const int64_t count = std::min(kRows, a.L - g);
    const int64_t n = a.causal ? std::min(S, g + count) : S;
    load_rows<D>(q, a.q, b, h, g, count, E, q4, l.lde);
    load_rows<D>(gout, gs, b, h, g, count, Ev, g4, l.ldv);
    load_rows<D>(out, os, b, h, g, count, Ev, o4, l.ldv);
    if (n > 0) {
      scores4(a, q4, l.lde, kt, l.ldk, b, h, g, count, n, p4, l.ldk);
      gemm_rows(g4, l.ldv, Ev, vt, l.ldk, round16(n), dp4, l.ldk);
    }
    for (int64_t r = 0; r < kRows; ++r) {
      float* p = p4 + r * l.ldk;
      float* d = dp4 + r * l.ldk;
      const float lr = r < count ? lse[(b * a.H + h) * a.L + g + r] : -INFINITY;
      if (lr == -INFINITY) {
        for (int64_t j = 0; j < n; ++j) p[j] = d[j] = 0;
        continue;
      }
      const float di = dot_f32(g4 + r * l.ldv, o4 + r * l.ldv, Ev);
      for (int64_t j = 0; j < n; ++j) p[j] = exp_f32(p[j] - lr);
      for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - di) * a.scale;
    }
    if (n > 0) {
      gemm_rows(dp4, l.ldk, n, kf, l.lde, l.lde, dq4, l.lde);
      rank_update(dvf, l.ldv, n, l.ldv, p4, l.ldk, g4, l.ldv);
      rank_update(dkf, l.lde, n, l.lde, dp4, l.ldk, q4, l.lde);
    } else {
      for (int64_t x = 0; x < kRows * l.lde; ++x) dq4[x] = 0;
    }
    for (int64_t r = 0; r < count; ++r)
      from_float<D>(dq4 + r * l.lde, dq, off(a.dq, b, h, g + r), E);
  }
  for (int64_t j = 0; j < S; ++j) {
    from_float<D>(dkf + j * l.lde, dk, off(a.dk, b, h, j), E);
    from_float<D>(dvf + j * l.ldv, dv, off(a.dv, b, h, j), Ev);
  }
}

OPENNEURON_ISA_BODY void backward_range_body(const AttentionArgs& a, const BwdLayout& l,
                                             const void* q, const void* k, const void* v,
                                             const void* out, const Strides4& os, const void* gout,
                                             const Strides4& gs, const float* lse, void* dq,
                                             void* dk, void* dv, int64_t t0, int64_t t1,
                                             float* buf) {
  for (int64_t t = t0; t < t1; ++t) {
    switch (a.dtype) {
      case DType::kFloat32:
        backward_task<F32>(a, l, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
      case DType::kBFloat16:
        backward_task<BF16>(a, l, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
      case DType::kFloat16:
        backward_task<F16>(a, l, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t, buf);
        break;
      default:  // not a kernel dtype: callers take only these three
        break;
    }
  }
}
OPENNEURON_ISA_DISPATCH(void, backward_range,
                        (const AttentionArgs& a, const BwdLayout& l, const void* q, const void* k,
                         const void* v, const void* out, const Strides4& os, const void* gout,
                         const Strides4& gs, const float* lse, void* dq, void* dk, void* dv,
                         int64_t t0, int64_t t1, float* buf),
                        (a, l, q, k, v, out, os, gout, gs, lse, dq, dk, dv, t0, t1, buf))

// Unset result strides: contiguous [B, H, rows, cols].
Strides4 or_contiguous(const Strides4& st, const AttentionArgs& a, int64_t rows, int64_t cols) {
  if (!st.unset()) return st;
  Strides4 c;
  c.s[2] = cols;
  c.s[1] = rows * cols;
  c.s[0] = a.H * rows * cols;
  return c;
}

}  // namespace

void attention_forward(const AttentionArgs& args, const void* q, const void* k, const void* v,
                       void* out, float* lse) {
  AttentionArgs a = args;
  a.out = or_contiguous(a.out, a, a.L, a.Ev);
  if (a.B <= 0 || a.H <= 0 || a.L <= 0) return;
  const int64_t work = a.B * a.H * a.L * a.S * (a.E + a.Ev) / runtime::kMultiplyAddsPerElement;
  if (a.L <= kDirectRows) {
    const size_t floats = direct_floats(a);
    runtime::parallel_for(0, a.B * a.H * a.L, 1, work, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(floats);
      forward_direct(a, q, k, v, out, lse, t0, t1, buf.data());
    });
    return;
  }
  const int64_t blocks = (a.L + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = a.B * a.H * blocks;
  const FwdLayout l = fwd_layout(a);
  runtime::parallel_for(0, tasks, 1, work, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(l.floats);
    forward_range(a, l, q, k, v, out, lse, t0, t1, buf.data());
  });
}

void attention_backward(const AttentionArgs& args, const void* q, const void* k, const void* v,
                        const void* out, Strides4 out_strides, const void* grad_out,
                        Strides4 grad_strides, const float* lse, void* dq, void* dk, void* dv) {
  AttentionArgs a = args;
  a.dq = or_contiguous(a.dq, a, a.L, a.E);
  a.dk = or_contiguous(a.dk, a, a.S, a.E);
  a.dv = or_contiguous(a.dv, a, a.S, a.Ev);
  if (a.B <= 0 || a.H <= 0) return;
  const BwdLayout l = bwd_layout(a);
  const int64_t work = 2 * a.B * a.H * a.L * a.S * (a.E + a.Ev) / runtime::kMultiplyAddsPerElement;
  runtime::parallel_for(0, a.B * a.H, 1, work, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(l.floats);
    backward_range(a, l, q, k, v, out, out_strides, grad_out, grad_strides, lse, dq, dk, dv, t0, t1,
                   buf.data());
  });
}

}  // namespace openneuron::kernels
