// NOTE: FP exceptions are never inspected: without trapping math GCC if-converts the selects
// of exp_f32 and the max reductions, so those loops vectorize. Results are unchanged.
#pragma GCC optimize("no-trapping-math")

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
  float inv_scale;
};

template <class D>
OPENNEURON_INLINE void step_range(const AdamConfig& c, const Coeffs& k, const AdamTensor& t,
                                  int64_t begin, int64_t end) {
  using T = typename D::T;
  T* p = static_cast<T*>(t.param);
  T* g = static_cast<T*>(t.grad);
  T* m = static_cast<T*>(t.exp_avg);
  T* v = static_cast<T*>(t.exp_avg_sq);
  T* vmax = static_cast<T*>(t.max_exp_avg_sq);
  const bool scaled = c.grad_scale != nullptr;
  for (int64_t i = begin; i < end; ++i) {
    float gi = D::load(g[i]);
    if (scaled) {
      gi = gi * k.inv_scale;
      g[i] = D::store(gi);
    }
    if (c.maximize) gi = -gi;
    float pi = D::load(p[i]);
    if (c.adamw) {
      pi = pi * k.decay_mul;
    } else {
      gi = gi + pi * k.weight_decay;
    }
    float mi = D::load(m[i]);
    mi = mi + k.one_minus_beta1 * (gi - mi);
    float vi = D::load(v[i]) * k.beta2 + k.one_minus_beta2 * gi * gi;
    m[i] = D::store(mi);
    v[i] = D::store(vi);
    if (c.amsgrad) {
      const float vm = std::max(D::load(vmax[i]), vi);
      vmax[i] = D::store(vm);
      vi = vm;
    }
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    pi = pi - k.step_size * mi / denom;
    p[i] = D::store(pi);
  }
}

OPENNEURON_KERNEL_TARGETS
void step_chunk(const AdamConfig& c, const Coeffs& k, const AdamTensor& t, int64_t begin,
                int64_t end) {
  switch (c.dtype) {
    case DType::F32:
      step_range<F32>(c, k, t, begin, end);
      break;
    case DType::BF16:
      step_range<BF16>(c, k, t, begin, end);
      break;
    case DType::F16:
      step_range<F16>(c, k, t, begin, end);
      break;
  }
}

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
    k.inv_scale = c.grad_scale ? 1.0f / *c.grad_scale : 1.0f;
    for (int64_t b = 0; b < tensors[i].numel; b += kChunk)
      chunks.push_back({i, b, std::min(tensors[i].numel, b + kChunk)});
  }
  runtime::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t x = b; x < e; ++x) {
      const Chunk& ch = chunks[static_cast<size_t>(x)];
      step_chunk(c, coeffs[ch.tensor], tensors[ch.tensor], ch.begin, ch.end);
    }
  });
}

}  // namespace openneuron::kernels
