// Fused cross-entropy over a [rows, classes] row-major array of logits with int64 class-index
// targets (the math of log_softmax + nll_loss, no class weights, no label smoothing).
// float32 compute; logits / dlogits dtype `dtype`. Rows whose target == ignore_index get loss 0
// and gradient 0. Parallel over rows.
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

// loss[r] = logsumexp(x[r]) - x[r, target[r]] (0 for ignored rows); lse[r] = logsumexp(x[r]).
// Returns the number of targets out of [0, classes) that are not ignore_index (0 = all valid).
int64_t cross_entropy_forward(DType dtype, const void* x, const int64_t* target, float* loss,
                              float* lse, int64_t rows, int64_t classes, int64_t ignore_index);

// dx[r] = (softmax(x[r]) - onehot(target[r])) * scale[r * scale_stride] * scale_mul; zero for
// ignored rows. scale: the incoming gradient, dtype `dtype` (one value: stride 0, or per row).
void cross_entropy_backward(DType dtype, const void* x, const int64_t* target, const float* lse,
                            const void* scale, int64_t scale_stride, float scale_mul, void* dx,
                            int64_t rows, int64_t classes, int64_t ignore_index);

// dst[0..n) = src converted to dtype.
void store_floats(DType dtype, const float* src, void* dst, int64_t n);

}  // namespace openneuron::kernels
