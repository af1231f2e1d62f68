// RMS normalization over the last n elements of each row of a [rows, n] row-major array (the
// math of aten::rms_norm): rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd [* weight].
// Input/output dtype `dtype`; weight / dweight dtype `wdtype` (float32 allowed for bf16/fp16
// input, as ATen multiplies in float32); rstd is always float32. float32 compute. Parallel over
// rows; dweight is reduced over fixed row blocks in a fixed order (deterministic, independent of
// the thread count).
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

struct RmsNormTypes {
  DType dtype = DType::kFloat32;   // x, y, dy, dx
  DType wdtype = DType::kFloat32;  // weight, dweight
};

// weight may be null. rstd: rows float32 values (may be null: not wanted).
void rms_norm_forward(RmsNormTypes t, const void* x, const void* weight, void* y, float* rstd,
                      int64_t rows, int64_t n, float eps);

// dx and dweight may be null (not wanted); weight may be null (ones).
void rms_norm_backward(RmsNormTypes t, const void* dy, const void* x, const float* rstd,
                       const void* weight, void* dx, void* dweight, int64_t rows, int64_t n);

}  // namespace openneuron::kernels
