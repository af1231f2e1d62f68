// c10::ScalarType -> the torch-free element types: ir::DType (ir/dtype.h) for the fusion
// recorder and op hooks (every IR dtype) and the hand-written kernels (their three floating
// dtypes); collectives::DType for the distributed backend. The one place for these mappings.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "collectives/shm_comm.h"
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

// The collectives' element type of t; complex types travel as their real type (two elements
// each; *pairs = 2). nullopt for types collectives do not move (float8, quantized, ...).
constexpr std::optional<collectives::DType> comm_dtype(c10::ScalarType t, int* pairs = nullptr) {
  using collectives::DType;
  if (pairs != nullptr) *pairs = c10::isComplexType(t) ? 2 : 1;
  switch (t) {
    case c10::ScalarType::Float:
    case c10::ScalarType::ComplexFloat:
      return DType::kFloat32;
    case c10::ScalarType::Double:
    case c10::ScalarType::ComplexDouble:
      return DType::kFloat64;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    case c10::ScalarType::Half:
    case c10::ScalarType::ComplexHalf:
      return DType::kFloat16;
    case c10::ScalarType::Char:
      return DType::kInt8;
    case c10::ScalarType::Byte:
      return DType::kUInt8;
    case c10::ScalarType::Short:
      return DType::kInt16;
    case c10::ScalarType::Int:
      return DType::kInt32;
    case c10::ScalarType::Long:
      return DType::kInt64;
    case c10::ScalarType::Bool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

// The torch type of a collectives element type (the Gloo leg's views).
constexpr c10::ScalarType scalar_type_of(collectives::DType dt) {
  using collectives::DType;
  switch (dt) {
    case DType::kFloat32:
      return c10::ScalarType::Float;
    case DType::kFloat64:
      return c10::ScalarType::Double;
    case DType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case DType::kFloat16:
      return c10::ScalarType::Half;
    case DType::kInt8:
      return c10::ScalarType::Char;
    case DType::kUInt8:
      return c10::ScalarType::Byte;
    case DType::kInt16:
      return c10::ScalarType::Short;
    case DType::kInt32:
      return c10::ScalarType::Int;
    case DType::kInt64:
      return c10::ScalarType::Long;
    case DType::kBool:
      return c10::ScalarType::Bool;
  }
  return c10::ScalarType::Undefined;
}

}  // namespace openneuron::aten
