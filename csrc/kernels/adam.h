// One fused Adam / AdamW step over a list of parameters (the math of aten::_fused_adam_ and
// _fused_adamw_): per element, in float32,
//   g = grad / grad_scale (stored back to grad when grad_scale is given); maximize: g = -g
//   Adam: g += weight_decay * p          AdamW: p *= 1 - lr * weight_decay
//   m = m + (1 - beta1) * (g - m)         v = beta2 * v + (1 - beta2) * g * g
//   amsgrad: vmax = max(vmax, v), v' = vmax
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v') / sqrt(1 - beta2^step) + eps)
// step is read from each parameter's state_step (float32) when the step runs; nothing is done
// when found_inf is given and equals 1. Parallel over fixed chunks of all tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

struct AdamTensor {
  void* param = nullptr;
  void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // amsgrad only
  const float* step = nullptr;
  int64_t numel = 0;
};

struct AdamConfig {
  DType dtype =
      DType::kFloat32;  // every tensor of the list (ATen's fused kernels require one dtype)
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0, eps = 1e-8;
  bool amsgrad = false, maximize = false, adamw = false;
  const float* lr_ptr = nullptr;      // a tensor lr (overrides lr)
  const float* grad_scale = nullptr;  // optional
  const float* found_inf = nullptr;   // optional
};

void adam_step(const AdamConfig& config, const AdamTensor* tensors, size_t count);

}  // namespace openneuron::kernels
