#include "kernels/softmax.h"

#include <type_traits>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

template <class D>
OPENNEURON_INLINE void forward_rows(const void* xv, void* yv, int64_t begin, int64_t end,
                                    int64_t n, bool log, float* t, float* e) {
  using T = typename D::T;
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(xv) + r * n;
    T* y = static_cast<T*>(yv) + r * n;
    const float* xf = t;
    if constexpr (std::is_same_v<D, F32>) {
      xf = x;  // float input: no staging copy
    } else {
      for (int64_t j = 0; j < n; ++j) t[j] = D::load(x[j]);
    }
    const float m = max_f32(xf, n);
    for (int64_t j = 0; j < n; ++j) e[j] = exp_f32(xf[j] - m);
    const float sum = sum_f32(e, n);
    if (log) {
      const float ls = std::log(sum);
      for (int64_t j = 0; j < n; ++j) y[j] = D::store((xf[j] - m) - ls);
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) y[j] = D::store(e[j] * inv);
    }
  }
}

template <class D>
OPENNEURON_INLINE void backward_rows(const void* gv, const void* ov, void* iv, int64_t begin,
                                     int64_t end, int64_t n, bool log, float* g, float* o) {
  using T = typename D::T;
  for (int64_t r = begin; r < end; ++r) {
    const T* gr = static_cast<const T*>(gv) + r * n;
    const T* orow = static_cast<const T*>(ov) + r * n;
    T* ir = static_cast<T*>(iv) + r * n;
    for (int64_t j = 0; j < n; ++j) g[j] = D::load(gr[j]);
    for (int64_t j = 0; j < n; ++j) o[j] = D::load(orow[j]);
    if (log) {
      const float s = sum_f32(g, n);
      for (int64_t j = 0; j < n; ++j) ir[j] = D::store(g[j] - exp_f32(o[j]) * s);
    } else {
      const float s = dot_f32(g, o, n);
      for (int64_t j = 0; j < n; ++j) ir[j] = D::store((g[j] - s) * o[j]);
    }
  }
}

OPENNEURON_KERNEL_TARGETS
void forward_chunk(DType dt, const void* x, void* y, int64_t begin, int64_t end, int64_t n,
                   bool log, float* t, float* e) {
  switch (dt) {
    case DType::F32:
      forward_rows<F32>(x, y, begin, end, n, log, t, e);
      break;
    case DType::BF16:
      forward_rows<BF16>(x, y, begin, end, n, log, t, e);
      break;
    case DType::F16:
      forward_rows<F16>(x, y, begin, end, n, log, t, e);
      break;
  }
}

OPENNEURON_KERNEL_TARGETS
void backward_chunk(DType dt, const void* g, const void* o, void* gi, int64_t begin, int64_t end,
                    int64_t n, bool log, float* gb, float* ob) {
  switch (dt) {
    case DType::F32:
      backward_rows<F32>(g, o, gi, begin, end, n, log, gb, ob);
      break;
    case DType::BF16:
      backward_rows<BF16>(g, o, gi, begin, end, n, log, gb, ob);
      break;
    case DType::F16:
      backward_rows<F16>(g, o, gi, begin, end, n, log, gb, ob);
      break;
  }
}

}  // namespace

void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t n, bool log) {
  if (rows <= 0 || n <= 0) return;
  runtime::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(2 * n));
    forward_chunk(dtype, x, y, begin, end, n, log, buf.data(), buf.data() + n);
  });
}

void softmax_backward(DType dtype, const void* grad_out, const void* out, void* grad_in,
                      int64_t rows, int64_t n, bool log) {
  if (rows <= 0 || n <= 0) return;
  runtime::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(2 * n));
    backward_chunk(dtype, grad_out, out, grad_in, begin, end, n, log, buf.data(), buf.data() + n);
  });
}

}  // namespace openneuron::kernels
