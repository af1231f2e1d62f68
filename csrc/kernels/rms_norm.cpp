#include "kernels/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

OPENNEURON_ISA_BODY void forward_chunk_body(RmsNormTypes t, const void* x, const float* w, void* y,
                                            float* rstd, int64_t begin, int64_t end, int64_t n,
                                            float eps, float* row) {
  for (int64_t r = begin; r < end; ++r) {
    load_row(t.dtype, x, r * n, n, row);
    const float ms = dot_f32(row, row, n) / static_cast<float>(n);
    const float rs = 1.0f / std::sqrt(ms + eps);
    if (rstd) rstd[r] = rs;
    if (w) {
      for (int64_t k = 0; k < n; ++k) row[k] = (row[k] * rs) * w[k];
    } else {
      for (int64_t k = 0; k < n; ++k) row[k] = row[k] * rs;
    }
    store_row(t.dtype, row, y, r * n, n);
  }
}
OPENNEURON_ISA_DISPATCH(void, forward_chunk,
                        (RmsNormTypes t, const void* x, const float* w, void* y, float* rstd,
                         int64_t begin, int64_t end, int64_t n, float eps, float* row),
                        (t, x, w, y, rstd, begin, end, n, eps, row))

// dx for rows [begin, end) and this block's dweight partial sums (pw may be null).
// NOTE: the partial sums are double: a block spans up to thousands of rows when rows are short,
// and a float32 running sum over them lost ~10x the accuracy of ATen's pairwise sum.
OPENNEURON_ISA_BODY void backward_chunk_body(RmsNormTypes t, const void* dy, const void* x,
                                             const float* rstd, const float* w, void* dx,
                                             double* pw, int64_t begin, int64_t end, int64_t n,
                                             float* g, float* xh) {
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t r = begin; r < end; ++r) {
    load_row(t.dtype, dy, r * n, n, g);
    load_row(t.dtype, x, r * n, n, xh);
    const float rs = rstd[r];
    for (int64_t k = 0; k < n; ++k) xh[k] = xh[k] * rs;
    if (pw)
      for (int64_t k = 0; k < n; ++k) pw[k] += static_cast<double>(g[k] * xh[k]);
    if (!dx) continue;
    if (w)
      for (int64_t k = 0; k < n; ++k) g[k] = g[k] * w[k];
    const float c = dot_f32(g, xh, n) * inv_n;
    for (int64_t k = 0; k < n; ++k) g[k] = rs * (g[k] - xh[k] * c);
    store_row(t.dtype, g, dx, r * n, n);
  }
}
OPENNEURON_ISA_DISPATCH(void, backward_chunk,
                        (RmsNormTypes t, const void* dy, const void* x, const float* rstd,
                         const float* w, void* dx, double* pw, int64_t begin, int64_t end,
                         int64_t n, float* g, float* xh),
                        (t, dy, x, rstd, w, dx, pw, begin, end, n, g, xh))

std::vector<float> param_as_float(DType d, const void* p, int64_t n) {
  std::vector<float> out;
  if (!p) return out;
  out.resize(static_cast<size_t>(n));
  load_row(d, p, 0, n, out.data());
  return out;
}

}  // namespace

void rms_norm_forward(RmsNormTypes t, const void* x, const void* weight, void* y, float* rstd,
                      int64_t rows, int64_t n, float eps) {
  if (rows <= 0 || n <= 0) return;
  const std::vector<float> w = param_as_float(t.wdtype, weight, n);
  runtime::parallel_for(0, rows, row_grain(n), rows * n, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(n));
    forward_chunk(t, x, weight ? w.data() : nullptr, y, rstd, begin, end, n, eps, row.data());
  });
}

void rms_norm_backward(RmsNormTypes t, const void* dy, const void* x, const float* rstd,
                       const void* weight, void* dx, void* dweight, int64_t rows, int64_t n) {
  if (n <= 0) return;
  const std::vector<float> w = param_as_float(t.wdtype, weight, n);
  const int64_t block = std::max<int64_t>(row_grain(n), (rows + 255) / 256);
  const int64_t blocks = rows > 0 ? (rows + block - 1) / block : 0;
  const bool want_w = dweight != nullptr;
  std::vector<double> pw(want_w ? static_cast<size_t>(blocks * n) : 0, 0.0);
  runtime::parallel_for(0, blocks, 1, rows * n, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(static_cast<size_t>(2 * n));
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t begin = bi * block, end = std::min(rows, begin + block);
      backward_chunk(t, dy, x, rstd, weight ? w.data() : nullptr, dx,
                     want_w ? pw.data() + bi * n : nullptr, begin, end, n, buf.data(),
                     buf.data() + n);
    }
  });
  if (want_w) {
    std::vector<double> total(static_cast<size_t>(n), 0.0);
    for (int64_t bi = 0; bi < blocks; ++bi)
      for (int64_t k = 0; k < n; ++k) total[k] += pw[bi * n + k];
    std::vector<float> total_f(total.begin(), total.end());
    store_row(t.wdtype, total_f.data(), dweight, 0, n);
  }
}

}  // namespace openneuron::kernels
