// Scalar conversions between float32 and bfloat16/float16 bit patterns, round to nearest even,
// written branch-free so loops over them auto-vectorize. Torch-free; the one implementation for
// csrc/ir and csrc/kernels (kernel_util.h). Always inlined, so per-ISA loop bodies
// (OPENNEURON_ISA_BODY) get them in their own instruction set. The half algorithms follow the
// public-domain FP16 library (Maratos Dukhan).
#pragma once

#include <cstdint>
#include <cstring>

#define OPENNEURON_NUMERIC_INLINE inline __attribute__((always_inline))

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
