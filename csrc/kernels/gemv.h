// Matrix products with a few rows (m <= kGemvMaxRows): y = beta * c + alpha * (a @ b), the
// shape token-by-token decoding gives every weight of a model (a [1, k] activation times a
// [k, n] weight, or nn.Linear's [n, k] transposed). Memory-bound: each element of b is read once
// and used m times, so the kernel streams b at the rate the caches give, with no packing and no
// parallel region for small products (runtime::kMinParallelWork), in float32 (bfloat16 /
// float16 rows converted as they stream, each result rounded once). Every result's sum runs
// over k in one order fixed by b's layout, whatever the thread count, column split or SIMD
// variant: the same bits on every host.
#pragma once

#include <cstdint>

#include "ir/dtype.h"

namespace openneuron::kernels {

using ir::DType;

constexpr int64_t kGemvMaxRows = 4;

struct GemvArgs {
  DType dtype = DType::kFloat32;  // every operand's: float32, bfloat16 or float16
  int64_t m = 0, n = 0, k = 0;
  // Element strides: a[i, p] at a + i * a_rs + p * a_cs; b[p, j] at b + p * b_rs + j * b_cs
  // (b_cs == 1: rows of b contiguous; b_rs == 1: columns contiguous); c likewise (strides may
  // be 0: broadcast); y[i, j] at y + i * y_rs + j.
  const void* a = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const void* b = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  const void* c = nullptr;  // null: y = alpha * (a @ b), beta ignored (as ATen's beta == 0)
  int64_t c_rs = 0, c_cs = 0;
  void* y = nullptr;
  int64_t y_rs = 0;
  float alpha = 1, beta = 1;
};

// Whether gemv takes these arguments: a kernel dtype, 1 <= m <= kGemvMaxRows, one of b's two
// layouts, non-negative strides. Callers run ATen's product otherwise.
bool gemv_supported(const GemvArgs& g);

// y may be c (addmm_); y must not overlap a or b. Sums in float32; beta == 0 reads no c.
void gemv(const GemvArgs& g);

}  // namespace openneuron::kernels
