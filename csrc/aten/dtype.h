// c10::ScalarType -> ir::DType (ir/dtype.h): the one mapping, for the fusion recorder and op
// hooks (every IR dtype) and the hand-written kernels (their three floating dtypes).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "ir/dtype.h"

namespace openneuron::aten {

// The IR dtype of t; nullopt for types the IR has no values of (complex, uint8, float8, ...).
constexpr std::optional<ir::DType> ir_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return ir::DType::kFloat32;
    case c10::ScalarType::BFloat16:
      return ir::DType::kBFloat16;
    case c10::ScalarType::Half:
      return ir::DType::kFloat16;
    case c10::ScalarType::Double:
      return ir::DType::kFloat64;
    case c10::ScalarType::Int:
      return ir::DType::kInt32;
    case c10::ScalarType::Long:
      return ir::DType::kInt64;
    case c10::ScalarType::Bool:
      return ir::DType::kBool;
    default:
      return std::nullopt;
  }
}

// The dtypes csrc/kernels takes: float32, bfloat16, float16.
constexpr std::optional<ir::DType> kernel_dtype(c10::ScalarType t) {
  const std::optional<ir::DType> d = ir_dtype(t);
  if (d && (*d == ir::DType::kFloat32 || *d == ir::DType::kBFloat16 || *d == ir::DType::kFloat16))
    return d;
  return std::nullopt;
}

}  // namespace openneuron::aten
