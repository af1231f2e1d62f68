// The element types of csrc/ir and csrc/kernels and their conversions: DType, its size/name/
// class, and float32 <-> bfloat16/float16 bit patterns, round to nearest even, written
// branch-free so loops over them auto-vectorize. Torch-free; the one definition for both (the
// ATen side maps c10::ScalarType to it in aten/dtype.h). Always inlined, so per-ISA loop bodies
// (OPENNEURON_ISA_BODY) get them in their own instruction set. The half algorithms follow the
// public-domain FP16 library (Maratos Dukhan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#define OPENNEURON_NUMERIC_INLINE inline __attribute__((always_inline))

namespace openneuron::ir {

// Value types. bf16/fp16 values compute in float32 and are rounded (nearest-even) to their dtype
// after every op, as eager ATen does op by op. The hand-written kernels take the three floating
// types kFloat32, kBFloat16 and kFloat16.
enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64, kBool };
constexpr int kNumDTypes = 7;

// bytes per element in memory
constexpr size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}
// "f32", "bf16", "f16", "f64", "i32", "i64", "bool" (the IR's text form)
constexpr const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return "f32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "f16";
    case DType::kFloat64:
      return "f64";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}
constexpr bool dtype_is_floating(DType dt) {  // f32, bf16, f16, f64
  return dt == DType::kFloat32 || dt == DType::kBFloat16 || dt == DType::kFloat16 ||
         dt == DType::kFloat64;
}
constexpr bool dtype_is_integral(DType dt) {  // i32, i64 (not bool)
  return dt == DType::kInt32 || dt == DType::kInt64;
}

}  // namespace openneuron::ir

namespace openneuron::ir::numeric {

OPENNEURON_NUMERIC_INLINE uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
OPENNEURON_NUMERIC_INLINE float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> bf16 bits, nearest even; NaN -> 0x7FC0 (as c10::BFloat16).
OPENNEURON_NUMERIC_INLINE uint16_t bf16_from_f32(float f) {
  uint32_t u = f32_bits(f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7FC0u : r);
}
OPENNEURON_NUMERIC_INLINE float f32_from_bf16(uint16_t h) {
  return f32_from_bits(static_cast<uint32_t>(h) << 16);
}
// The float nearest (even) to f that a bf16 can hold.
OPENNEURON_NUMERIC_INLINE float round_bf16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return f32_from_bits(f != f ? 0x7FC00000u : r);
}

// float -> IEEE half bits, nearest even (c10::Half's algorithm).
OPENNEURON_NUMERIC_INLINE uint16_t f16_from_f32(float f) {
  const float scale_to_inf = f32_from_bits(UINT32_C(0x77800000));   // 2^112
  const float scale_to_zero = f32_from_bits(UINT32_C(0x08800000));  // 2^-110
  float a = f < 0 ? -f : f;
  a = f != f ? f : a;
  float base = (a * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & UINT32_C(0x80000000);
  uint32_t bias = shl1_w & UINT32_C(0xFF000000);
  bias = bias < UINT32_C(0x71000000) ? UINT32_C(0x71000000) : bias;
  base = f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
  const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
}
OPENNEURON_NUMERIC_INLINE float f32_from_f16(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & UINT32_C(0x80000000);
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = UINT32_C(0xE0) << 23;
  const float exp_scale = f32_from_bits(UINT32_C(0x7800000));  // 2^-112
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = UINT32_C(126) << 23;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
  const uint32_t cutoff = UINT32_C(1) << 27;
  return f32_from_bits(sign | (two_w < cutoff ? f32_bits(denormalized) : f32_bits(normalized)));
}
OPENNEURON_NUMERIC_INLINE float round_f16(float f) { return f32_from_f16(f16_from_f32(f)); }

}  // namespace openneuron::ir::numeric
