#include "kernels/adam.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

constexpr int64_t kChunk = 32768;

struct Coeffs {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, decay_mul, weight_decay, eps;
  float step_size, bc2_sqrt;
  float grad_scale, sign;
};

// The flags are template parameters so the element loop has no branches (it vectorizes).
template <class D, bool kScaled, bool kAmsgrad, bool kAdamW>
OPENNEURON_INLINE void step_range(const Coeffs& k, const AdamTensor& t, int64_t begin,
                                  int64_t end) {
  using T = typename D::T;
  T* p = static_cast<T*>(t.param);
  T* g = static_cast<T*>(t.grad);
  T* m = static_cast<T*>(t.exp_avg);
  T* v = static_cast<T*>(t.exp_avg_sq);
  T* vmax = static_cast<T*>(t.max_exp_avg_sq);
  for (int64_t i = begin; i < end; ++i) {
    float gi = D::load(g[i]);
    if constexpr (kScaled) {
      gi = gi / k.grad_scale;
      g[i] = D::store(gi);
    }
    gi = gi * k.sign;  // -1 when maximizing (exact)
    float pi = D::load(p[i]);
    if constexpr (kAdamW) {
      pi = pi * k.decay_mul;
    } else {
      gi = gi + pi * k.weight_decay;
    }
    float mi = D::load(m[i]);
    mi = mi + k.one_minus_beta1 * (gi - mi);
    float vi = D::load(v[i]) * k.beta2 + k.one_minus_beta2 * gi * gi;
    m[i] = D::store(mi);
    v[i] = D::store(vi);
    if constexpr (kAmsgrad) {
      const float old = D::load(vmax[i]);
      const float vm = old > vi ? old : vi;
      vmax[i] = D::store(vm);
      vi = vm;
    }
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    pi = pi - k.step_size * mi / denom;
    p[i] = D::store(pi);
  }
}

template <class D>
OPENNEURON_INLINE void step_flags(const AdamConfig& c, const Coeffs& k, const AdamTensor& t,
                                  int64_t begin, int64_t end) {
  const int flags = (c.grad_scale ? 4 : 0) | (c.amsgrad ? 2 : 0) | (c.adamw ? 1 : 0);
  switch (flags) {
    case 0:
      step_range<D, false, false, false>(k, t, begin, end);
      break;
    case 1:
      step_range<D, false, false, true>(k, t, begin, end);
      break;
    case 2:
      step_range<D, false, true, false>(k, t, begin, end);
      break;
    case 3:
      step_range<D, false, true, true>(k, t, begin, end);
      break;
    case 4:
      step_range<D, true, false, false>(k, t, begin, end);
      break;
    case 5:
      step_range<D, true, false, true>(k, t, begin, end);
      break;
    case 6:
      step_range<D, true, true, false>(k, t, begin, end);
      break;
    default:
      step_range<D, true, true, true>(k, t, begin, end);
      break;
  }
}

OPENNEURON_ISA_BODY void step_chunk_body(const AdamConfig& c, const Coeffs& k, const AdamTensor& t,
                                         int64_t begin, int64_t end) {
  switch (c.dtype) {
    case DType::kFloat32:
      step_flags<F32>(c, k, t, begin, end);
      break;
    case DType::kBFloat16:
      step_flags<BF16>(c, k, t, begin, end);
      break;
    case DType::kFloat16:
      step_flags<F16>(c, k, t, begin, end);
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, step_chunk,
                        (const AdamConfig& c, const Coeffs& k, const AdamTensor& t, int64_t begin,
                         int64_t end),
                        (c, k, t, begin, end))

}  // namespace

void adam_step(const AdamConfig& c, const AdamTensor* tensors, size_t count) {
  if (c.found_inf && *c.found_inf == 1.0f) return;
  const double lr = c.lr_ptr ? static_cast<double>(*c.lr_ptr) : c.lr;
  std::vector<Coeffs> coeffs(count);
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < count; ++i) {
    const double step = static_cast<double>(*tensors[i].step);
    const double bc1 = 1 - std::pow(c.beta1, step);
    const double bc2 = 1 - std::pow(c.beta2, step);
    Coeffs& k = coeffs[i];
    k.lr = static_cast<float>(lr);
    k.beta1 = static_cast<float>(c.beta1);
    k.beta2 = static_cast<float>(c.beta2);
    k.one_minus_beta1 = static_cast<float>(1 - c.beta1);
    k.one_minus_beta2 = static_cast<float>(1 - c.beta2);
    k.weight_decay = static_cast<float>(c.weight_decay);
    k.decay_mul = static_cast<float>(1 - lr * c.weight_decay);
    k.eps = static_cast<float>(c.eps);
    k.step_size = static_cast<float>(lr / bc1);
    k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    k.grad_scale = c.grad_scale ? *c.grad_scale : 1.0f;
    k.sign = c.maximize ? -1.0f : 1.0f;
    for (int64_t b = 0; b < tensors[i].numel; b += kChunk)
      chunks.push_back({i, b, std::min(tensors[i].numel, b + kChunk)});
  }
  int64_t work = 0;
  for (const Chunk& ch : chunks) work += ch.end - ch.begin;
  runtime::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, work, [&](int64_t b, int64_t e) {
    for (int64_t x = b; x < e; ++x) {
      const Chunk& ch = chunks[static_cast<size_t>(x)];
      step_chunk(c, coeffs[ch.tensor], tensors[ch.tensor], ch.begin, ch.end);
    }
  });
}

}  // namespace openneuron::kernels
