// Layer normalization over the last n elements of each row of a [rows, n] row-major array
// (the math of aten::native_layer_norm and native_layer_norm_backward). The input/output dtype
// `dtype`; weight/bias dtype `wdtype` (float32 when ATen runs it "mixed": bf16/fp16 input with
// float32 weights); mean/rstd dtype `sdtype`. float32 compute, biased variance,
// rstd = 1 / sqrt(var + eps). Parallel over rows; the weight/bias gradients are reduced over
// fixed row blocks in a fixed order (deterministic, independent of the thread count).
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

struct LayerNormTypes {
  DType dtype = DType::kFloat32;   // x, y, dy, dx
  DType wdtype = DType::kFloat32;  // weight, bias, dweight, dbias
  DType sdtype = DType::kFloat32;  // mean, rstd
};

// weight / bias may be null. mean / rstd: rows elements each. n must be positive (n == 0 writes
// nothing).
void layer_norm_forward(LayerNormTypes t, const void* x, const void* weight, const void* bias,
                        void* y, void* mean, void* rstd, int64_t rows, int64_t n, float eps);

// Any of dx, dweight, dbias may be null (not wanted). weight may be null (ones).
void layer_norm_backward(LayerNormTypes t, const void* dy, const void* x, const void* mean,
                         const void* rstd, const void* weight, void* dx, void* dweight, void* dbias,
                         int64_t rows, int64_t n);

}  // namespace openneuron::kernels
