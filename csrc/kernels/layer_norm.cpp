#include "kernels/layer_norm.h"

#include <algorithm>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

// Per-chunk float buffers: a row and the weight / bias as float.
OPENNEURON_ISA_BODY void forward_chunk_body(LayerNormTypes t, const void* x, const float* w,
                                            const float* b, void* y, void* mean, void* rstd,
                                            int64_t begin, int64_t end, int64_t n, float eps,
                                            float* row) {
  for (int64_t r = begin; r < end; ++r) {
    load_row(t.dtype, x, r * n, n, row);
    const float mu = sum_f32(row, n) / static_cast<float>(n);
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float d = row[j + l] - mu;
        acc[l] += d * d;
      }
    float var = 0;
    for (; j < n; ++j) var += (row[j] - mu) * (row[j] - mu);
    for (int l = 0; l < kLanes; ++l) var += acc[l];
    var /= static_cast<float>(n);
    const float rs = 1.0f / std::sqrt(std::max(var, 0.0f) + eps);
    store_any(t.sdtype, mean, r, mu);
    store_any(t.sdtype, rstd, r, rs);
    for (int64_t k = 0; k < n; ++k) {
      float v = (row[k] - mu) * rs;
      if (w) v = v * w[k];
      if (b) v = v + b[k];
      row[k] = v;
    }
    store_row(t.dtype, row, y, r * n, n);
  }
}
OPENNEURON_ISA_DISPATCH(void, forward_chunk,
                        (LayerNormTypes t, const void* x, const float* w, const float* b, void* y,
                         void* mean, void* rstd, int64_t begin, int64_t end, int64_t n, float eps,
                         float* row),
                        (t, x, w, b, y, mean, rstd, begin, end, n, eps, row))

// dx for rows [begin, end) and this block's dweight / dbias partial sums (pw, pb may be null).
OPENNEURON_ISA_BODY void backward_chunk_body(LayerNormTypes t, const void* dy, const void* x,
                                             const void* mean, const void* rstd, const float* w,
                                             void* dx, float* pw, float* pb, int64_t begin,
                                             int64_t end, int64_t n, float* g, float* xh) {
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t r = begin; r < end; ++r) {
    load_row(t.dtype, dy, r * n, n, g);
    load_row(t.dtype, x, r * n, n, xh);
    const float mu = load_any(t.sdtype, mean, r);
    const float rs = load_any(t.sdtype, rstd, r);
    for (int64_t k = 0; k < n; ++k) xh[k] = (xh[k] - mu) * rs;
    if (pw)
      for (int64_t k = 0; k < n; ++k) pw[k] += g[k] * xh[k];
    if (pb)
      for (int64_t k = 0; k < n; ++k) pb[k] += g[k];
    if (!dx) continue;
    if (w)
      for (int64_t k = 0; k < n; ++k) g[k] = g[k] * w[k];
    const float c1 = dot_f32(g, xh, n) * inv_n;
    const float c2 = sum_f32(g, n) * inv_n;
    for (int64_t k = 0; k < n; ++k) g[k] = rs * ((g[k] - c2) - xh[k] * c1);
    store_row(t.dtype, g, dx, r * n, n);
  }
}
OPENNEURON_ISA_DISPATCH(void, backward_chunk,
                        (LayerNormTypes t, const void* dy, const void* x, const void* mean,
                         const void* rstd, const float* w, void* dx, float* pw, float* pb,
                         int64_t begin, int64_t end, int64_t n, float* g, float* xh),
                        (t, dy, x, mean, rstd, w, dx, pw, pb, begin, end, n, g, xh))

std::vector<float> param_as_float(DType d, const void* p, int64_t n) {
  std::vector<float> out;
  if (!p) return out;
  out.resize(static_cast<size_t>(n));
  load_row(d, p, 0, n, out.data());
  return out;
}

}  // namespace

void layer_norm_forward(LayerNormTypes t, const void* x, const void* weight, const void* bias,
                        void* y, void* mean, void* rstd, int64_t rows, int64_t n, float eps) {
  if (rows <= 0 || n <= 0) return;  // nothing to normalize (the glue sends these to ATen)
  const std::vector<float> w = param_as_float(t.wdtype, weight, n);
  const std::vector<float> b = param_as_float(t.wdtype, bias, n);
  runtime::parallel_for(0, rows, row_grain(n), rows * n, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(n));
    forward_chunk(t, x, weight ? w.data() : nullptr, bias ? b.data() : nullptr, y, mean, rstd,
                  begin, end, n, eps, row.data());
  });
}

void layer_norm_backward(LayerNormTypes t, const void* dy, const void* x, const void* mean,
                         const void* rstd, const void* weight, void* dx, void* dweight, void* dbias,
                         int64_t rows, int64_t n) {
  if (n <= 0) return;
  const std::vector<float> w = param_as_float(t.wdtype, weight, n);
  // Fixed row blocks: block i's partial sums live in partial[i]; summed in block order below.
  const int64_t block = std::max<int64_t>(row_grain(n), (rows + 255) / 256);
  const int64_t blocks = rows > 0 ? (rows + block - 1) / block : 0;
  const bool want_w = dweight != nullptr, want_b = dbias != nullptr;
  std::vector<float> pw(want_w ? static_cast<size_t>(blocks * n) : 0, 0.0f);
  std::vector<float> pb(want_b ? static_cast<size_t>(blocks * n) : 0, 0.0f);
  runtime::parallel_for(0, blocks, 1, rows * n, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(static_cast<size_t>(2 * n));
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t begin = bi * block, end = std::min(rows, begin + block);
      backward_chunk(t, dy, x, mean, rstd, weight ? w.data() : nullptr, dx,
                     want_w ? pw.data() + bi * n : nullptr, want_b ? pb.data() + bi * n : nullptr,
                     begin, end, n, buf.data(), buf.data() + n);
    }
  });
  std::vector<float> total(static_cast<size_t>(n));
  auto reduce = [&](const std::vector<float>& partial, void* out) {
    std::fill(total.begin(), total.end(), 0.0f);
    for (int64_t bi = 0; bi < blocks; ++bi)
      for (int64_t k = 0; k < n; ++k) total[k] += partial[bi * n + k];
    store_row(t.wdtype, total.data(), out, 0, n);
  };
  if (want_w) reduce(pw, dweight);
  if (want_b) reduce(pb, dbias);
}

}  // namespace openneuron::kernels
