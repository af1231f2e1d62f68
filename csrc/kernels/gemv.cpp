#include "kernels/gemv.h"

#include <algorithm>
#include <vector>

#include "kernels/kernel_util.h"
#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

// Rows of b contiguous (b_cs == 1, HF's Conv1D weight [k, n]): y's columns in panels of kPanel,
// their sums in an L1-resident float32 accumulator, b streamed kRowsPerStep rows at a time;
// each result's sum is sequential over p. Columns contiguous (b_rs == 1, nn.Linear's weight
// [n, k] transposed): each result a dot product over one row of the weight, in kLanes lanes as
// dot_f32 sums (lane l takes p = l, l + 16, ..., then the tail, then the lanes in order).
constexpr int64_t kPanel = 512;
constexpr int64_t kRowsPerStep = 4;

// a as float32 rows [m][k].
void load_a(const GemvArgs& g, float* af) {
  for (int64_t i = 0; i < g.m; ++i) {
    if (g.a_cs == 1) {
      load_row(g.dtype, g.a, i * g.a_rs, g.k, af + i * g.k);
    } else {
      for (int64_t p = 0; p < g.k; ++p)
        af[i * g.k + p] = load_any(g.dtype, g.a, i * g.a_rs + p * g.a_cs);
    }
  }
}

// y[i, j0 + j] = beta * c[i, j0 + j] + alpha * s[j] for j < w (s overwritten); c read before y
// is written, so y may be c.
OPENNEURON_INLINE void finish(const GemvArgs& g, int64_t i, int64_t j0, int64_t w, float* s) {
  if (g.alpha != 1.0f)
    for (int64_t j = 0; j < w; ++j) s[j] = g.alpha * s[j];
  if (g.c != nullptr && g.beta != 0.0f) {
    for (int64_t j = 0; j < w; ++j) {
      const float cv = load_any(g.dtype, g.c, i * g.c_rs + (j0 + j) * g.c_cs);
      s[j] = (g.beta == 1.0f ? cv : g.beta * cv) + s[j];
    }
  }
  store_row(g.dtype, s, g.y, i * g.y_rs + j0, w);
}

template <class V, int M>
OPENNEURON_INLINE void kn_columns(const GemvArgs& g, const float* af, int64_t j_begin,
                                  int64_t j_end) {
  constexpr int64_t L = kLanesOf<V>;
  alignas(64) float acc[M * kPanel];
  alignas(64) float conv[kRowsPerStep * kPanel];  // bf16 / fp16 rows of b as float32
  const bool f32 = g.dtype == DType::kFloat32;
  const auto* bf = static_cast<const float*>(g.b);
  const int64_t k = g.k;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kPanel) {
    const int64_t w = std::min(kPanel, j_end - j0);
    const int64_t wv = w - w % L;
    std::fill(acc, acc + M * kPanel, 0.0f);
    auto row = [&](int64_t q, int64_t p) -> const float* {
      if (f32) return bf + p * g.b_rs + j0;
      load_row(g.dtype, g.b, p * g.b_rs + j0, w, conv + q * kPanel);
      return conv + q * kPanel;
    };
    int64_t p = 0;
    for (; p + kRowsPerStep <= k; p += kRowsPerStep) {
      const float* r0 = row(0, p);
      const float* r1 = row(1, p + 1);
      const float* r2 = row(2, p + 2);
      const float* r3 = row(3, p + 3);
      for (int64_t j = 0; j < wv; j += L) {
        V b0, b1, b2, b3;
        load_n(&b0, r0 + j);
        load_n(&b1, r1 + j);
        load_n(&b2, r2 + j);
        load_n(&b3, r3 + j);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const float* ai = af + i * k + p;
          V s;
          load_n(&s, acc + i * kPanel + j);
          s = s + b0 * ai[0];
          s = s + b1 * ai[1];
          s = s + b2 * ai[2];
          s = s + b3 * ai[3];
          store_n(acc + i * kPanel + j, s);
        }
      }
      for (int64_t j = wv; j < w; ++j) {
        for (int i = 0; i < M; ++i) {
          const float* ai = af + i * k + p;
          float s = acc[i * kPanel + j];
          s = s + r0[j] * ai[0];
          s = s + r1[j] * ai[1];
          s = s + r2[j] * ai[2];
          s = s + r3[j] * ai[3];
          acc[i * kPanel + j] = s;
        }
      }
    }
    for (; p < k; ++p) {
      const float* r0 = row(0, p);
      for (int64_t j = 0; j < wv; j += L) {
        V b0;
        load_n(&b0, r0 + j);
        for (int i = 0; i < M; ++i) {
          V s;
          load_n(&s, acc + i * kPanel + j);
          s = s + b0 * af[i * k + p];
          store_n(acc + i * kPanel + j, s);
        }
      }
      for (int64_t j = wv; j < w; ++j)
        for (int i = 0; i < M; ++i)
          acc[i * kPanel + j] = acc[i * kPanel + j] + r0[j] * af[i * k + p];
    }
    for (int i = 0; i < M; ++i) finish(g, i, j0, w, acc + i * kPanel);
  }
}

// Results y[i0 .. i0 + M, j .. j + J) as dot products over rows j .. j + J of the [n, k] weight.
template <class V, int M, int J>
OPENNEURON_INLINE void nk_rows(const GemvArgs& g, const float* af, int64_t i0, int64_t j,
                               float* conv) {
  constexpr int64_t L = kLanesOf<V>, P = kLanes / L;
  const int64_t k = g.k;
  const float* rows[J];
  for (int jj = 0; jj < J; ++jj) {
    if (g.dtype == DType::kFloat32) {
      rows[jj] = static_cast<const float*>(g.b) + (j + jj) * g.b_cs;
    } else {
      load_row(g.dtype, g.b, (j + jj) * g.b_cs, k, conv + jj * k);
      rows[jj] = conv + jj * k;
    }
  }
  V acc[J][M][P] = {};
  af += i0 * k;
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
#pragma GCC unroll 4
    for (int64_t q = 0; q < P; ++q) {
      V av[M];
      for (int i = 0; i < M; ++i) load_n(&av[i], af + i * k + p + q * L);
      for (int jj = 0; jj < J; ++jj) {
        V bv;
        load_n(&bv, rows[jj] + p + q * L);
        for (int i = 0; i < M; ++i) acc[jj][i][q] += av[i] * bv;
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    float out[J];
    for (int jj = 0; jj < J; ++jj) {
      float s = 0;
      for (int64_t t = p; t < k; ++t) s += af[i * k + t] * rows[jj][t];
      float lanes[kLanes];
      for (int64_t q = 0; q < P; ++q) store_n(lanes + q * L, acc[jj][i][q]);
      for (int l = 0; l < kLanes; ++l) s += lanes[l];
      out[jj] = s;
    }
    finish(g, i0 + i, j, J, out);
  }
}

// Rows of a in pairs (and one left over), one pass over the weight each: M * J * (kLanes / L)
// accumulators (8) stay within the register file. Three or four rows in one pass spilled them
// and ran 2.7-4x slower than two passes ([4, 4096] x [4096, 4096]^T: 10.5 ms, 2 x 2.2 ms).
template <class V, int M>
OPENNEURON_INLINE void nk_columns(const GemvArgs& g, const float* af, int64_t i0, int64_t j_begin,
                                  int64_t j_end) {
  constexpr int J = M == 1 ? 4 : 2;
  std::vector<float> conv(g.dtype == DType::kFloat32 ? 0 : static_cast<size_t>(J * g.k));
  int64_t j = j_begin;
  for (; j + J <= j_end; j += J) nk_rows<V, M, J>(g, af, i0, j, conv.data());
  for (; j < j_end; ++j) nk_rows<V, M, 1>(g, af, i0, j, conv.data());
}

template <class V>
OPENNEURON_INLINE void nk_columns_by_rows(const GemvArgs& g, const float* af, int64_t jb,
                                          int64_t je) {
  int64_t i = 0;
  for (; i + 2 <= g.m; i += 2) nk_columns<V, 2>(g, af, i, jb, je);
  if (i < g.m) nk_columns<V, 1>(g, af, i, jb, je);
}

template <class V>
OPENNEURON_INLINE void kn_columns_by_rows(const GemvArgs& g, const float* af, int64_t jb,
                                          int64_t je) {
  switch (g.m) {
    case 1:
      kn_columns<V, 1>(g, af, jb, je);
      break;
    case 2:
      kn_columns<V, 2>(g, af, jb, je);
      break;
    case 3:
      kn_columns<V, 3>(g, af, jb, je);
      break;
    default:
      kn_columns<V, 4>(g, af, jb, je);
      break;
  }
}

OPENNEURON_ISA_BODY void kn_body(const GemvArgs& g, const float* af, int64_t jb, int64_t je) {
  with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    kn_columns_by_rows<typename decltype(tag)::type>(g, af, jb, je);
  });
}
OPENNEURON_ISA_DISPATCH(void, kn, (const GemvArgs& g, const float* af, int64_t jb, int64_t je),
                        (g, af, jb, je))

OPENNEURON_ISA_BODY void nk_body(const GemvArgs& g, const float* af, int64_t jb, int64_t je) {
  with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    nk_columns_by_rows<typename decltype(tag)::type>(g, af, jb, je);
  });
}
OPENNEURON_ISA_DISPATCH(void, nk, (const GemvArgs& g, const float* af, int64_t jb, int64_t je),
                        (g, af, jb, je))

// The columns-contiguous form where b allows it and the other does not apply (or n == 1: one
// dot product beats a one-column panel).
bool columns_contiguous(const GemvArgs& g) { return g.b_rs == 1 && (g.b_cs != 1 || g.n == 1); }

}  // namespace

bool gemv_supported(const GemvArgs& g) {
  const bool dtype_ok =
      g.dtype == DType::kFloat32 || g.dtype == DType::kBFloat16 || g.dtype == DType::kFloat16;
  const bool strides_ok = g.a_rs >= 0 && g.a_cs >= 0 && g.b_rs >= 0 && g.b_cs >= 0 && g.c_rs >= 0 &&
                          g.c_cs >= 0 && g.y_rs >= 0;
  return dtype_ok && strides_ok && g.m >= 1 && g.m <= kGemvMaxRows && g.n >= 0 && g.k >= 0 &&
         (g.b_cs == 1 || g.b_rs == 1) && g.a != nullptr && g.b != nullptr && g.y != nullptr;
}

void gemv(const GemvArgs& g) {
  if (g.n == 0) return;
  std::vector<float> af(static_cast<size_t>(g.m * g.k));
  load_a(g, af.data());
  const float* a = af.data();
  const int64_t work = g.m * g.n * g.k / runtime::kMultiplyAddsPerElement;
  if (columns_contiguous(g)) {
    runtime::parallel_for(0, g.n, 16, work, [&](int64_t jb, int64_t je) { nk(g, a, jb, je); });
  } else {
    const int64_t panels = (g.n + kPanel - 1) / kPanel;
    runtime::parallel_for(0, panels, 1, work, [&](int64_t pb, int64_t pe) {
      kn(g, a, pb * kPanel, std::min(g.n, pe * kPanel));
    });
  }
}

}  // namespace openneuron::kernels
