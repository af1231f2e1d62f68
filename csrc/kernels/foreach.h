// Element-wise ops over lists of tensors in one call (the math of the aten::_foreach_* ops that
// torch.optim's foreach implementations use), float32 compute:
//   MulScalar: a *= s        AddScalar: a += s        DivScalar: a /= s
//   Lerp: a = lerp(a, b, s)  (ATen's formula: |s| < 0.5 ? a + s (b - a) : b - (b - a)(1 - s))
//   Addcmul: a += s * b * c  Addcdiv: a += s * b / c   Sqrt: out = sqrt(a)
// s is per tensor (Scalar and ScalarList overloads alike). Parallel over fixed chunks of all
// tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

enum class ForeachOp : uint8_t { MulScalar, AddScalar, DivScalar, Lerp, Addcmul, Addcdiv, Sqrt };

struct ForeachTensor {
  void* out = nullptr;      // written (== a for in-place ops)
  const void* a = nullptr;  // self
  const void* b = nullptr;  // tensors1 (Lerp, Addcmul, Addcdiv)
  const void* c = nullptr;  // tensors2 (Addcmul, Addcdiv)
  float s = 0;
  int64_t numel = 0;
};

void foreach_apply(ForeachOp op, DType dtype, const ForeachTensor* tensors, size_t count);

}  // namespace openneuron::kernels
