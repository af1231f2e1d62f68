#include "kernels/cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

// logsumexp of row[0..n) (row is overwritten with exp(row - max)).
OPENNEURON_ISA_BODY float row_lse_body(float* row, int64_t n) {
  const float m = max_f32(row, n);
  if (std::isinf(m)) return m;  // all -inf: -inf; any +inf: +inf (as ATen)
  for (int64_t k = 0; k < n; ++k) row[k] = exp_f32(row[k] - m);
  return m + std::log(sum_f32(row, n));
}
OPENNEURON_ISA_DISPATCH(float, row_lse, (float* row, int64_t n), (row, n))

OPENNEURON_ISA_BODY void backward_row_body(float* row, int64_t n, float lse, float s) {
  for (int64_t k = 0; k < n; ++k) row[k] = exp_f32(row[k] - lse) * s;
}
OPENNEURON_ISA_DISPATCH(void, backward_row, (float* row, int64_t n, float lse, float s),
                        (row, n, lse, s))

}  // namespace

void store_floats(DType dtype, const float* src, void* dst, int64_t n) {
  store_row(dtype, src, dst, 0, n);
}

int64_t cross_entropy_forward(DType dtype, const void* x, const int64_t* target, float* loss,
                              float* lse, int64_t rows, int64_t classes, int64_t ignore_index) {
  if (rows <= 0 || classes <= 0) return 0;
  std::atomic<int64_t> bad{0};
  runtime::parallel_for(
      0, rows, row_grain(classes), rows * classes, [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(classes));
        int64_t nbad = 0;
        for (int64_t r = begin; r < end; ++r) {
          const int64_t t = target[r];
          load_row(dtype, x, r * classes, classes, row.data());
          const float xt = t >= 0 && t < classes ? row[static_cast<size_t>(t)] : 0.0f;
          const float l = row_lse(row.data(), classes);
          lse[r] = l;
          if (t == ignore_index) {
            loss[r] = 0.0f;
          } else if (t < 0 || t >= classes) {
            ++nbad;
            loss[r] = NAN;
          } else {
            loss[r] = l - xt;
          }
        }
        if (nbad) bad.fetch_add(nbad, std::memory_order_relaxed);
      });
  return bad.load();
}

void cross_entropy_backward(DType dtype, const void* x, const int64_t* target, const float* lse,
                            const void* scale, int64_t scale_stride, float scale_mul, void* dx,
                            int64_t rows, int64_t classes, int64_t ignore_index) {
  if (rows <= 0 || classes <= 0) return;
  runtime::parallel_for(0, rows, row_grain(classes), rows * classes,
                        [&](int64_t begin, int64_t end) {
                          std::vector<float> row(static_cast<size_t>(classes));
                          for (int64_t r = begin; r < end; ++r) {
                            const int64_t t = target[r];
                            if (t == ignore_index || t < 0 || t >= classes) {
                              std::fill(row.begin(), row.end(), 0.0f);
                            } else {
                              float s = 0.0f;
                              load_row(dtype, scale, r * scale_stride, 1, &s);
                              s = s * scale_mul;
                              load_row(dtype, x, r * classes, classes, row.data());
                              backward_row(row.data(), classes, lse[r], s);
                              row[static_cast<size_t>(t)] -= s;
                            }
                            store_row(dtype, row.data(), dx, r * classes, classes);
                          }
                        });
}

}  // namespace openneuron::kernels
