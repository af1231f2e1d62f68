// Scaled dot-product attention on [B, H, L, E] query, [B, H, S, E] key, [B, H, S, Ev] value
// (the math of aten::_scaled_dot_product_fused_attention_overrideable and its backward):
// out = softmax(q k^T * scale + mask, causal: j <= i) v, float32 compute, no dropout.
// Rows whose scores are all -inf (fully masked) give 0 (as ATen's math path, _safe_softmax).
// The forward keeps one row of scores at a time (no L x S matrix) and also returns the row
// log-sum-exp, which the backward uses to recompute the probabilities.
// Operands are strided (elements; the last dimension must be contiguous); the mask is
// broadcast through stride 0. Parallel over (batch, head, query block) forward (query row for
// up to 4 rows: a decode step, which reads K and V in place) and over (batch, head) backward.
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

struct Strides4 {
  int64_t s[4] = {0, 0, 0, 1};  // b, h, row, col (col must be 1 except for the mask)
  bool unset() const { return s[0] == 0 && s[1] == 0 && s[2] == 0; }
};

struct AttentionArgs {
  DType dtype = DType::kFloat32;  // q, k, v, out, grads
  int64_t B = 0, H = 0, L = 0, S = 0, E = 0, Ev = 0;
  Strides4 q, k, v;
  const void* mask = nullptr;  // additive, dtype mask_dtype, broadcast to [B, H, L, S]
  DType mask_dtype = DType::kFloat32;
  Strides4 m;
  bool causal = false;
  float scale = 1.0f;
  // Where the results go (elements): out [B, H, L, Ev]; dq, dk, dv like q, k, v's logical
  // shapes. All zero (the default): contiguous.
  Strides4 out, dq, dk, dv;
};

// out: [B, H, L, Ev] at a.out's strides; lse: contiguous float32 [B, H, L] (-inf for masked
// rows).
void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                       void* out, float* lse);

// grad_out / out strided as given; dq, dk, dv at a.dq, a.dk, a.dv's strides.
void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                        const void* out, Strides4 out_strides, const void* grad_out,
                        Strides4 grad_strides, const float* lse, void* dq, void* dk, void* dv);

}  // namespace openneuron::kernels
