// The NKI executor's storage conversions: each tile/HBM dtype (program.h's table) to and from
// the float32 that every instruction computes in. Integers saturate and truncate toward zero
// (NaN -> 0, as numpy's astype does on this host); float8 rounds to nearest even with the
// overflow rules of torch's tensor conversions (torch 2.13: e4m3fn saturates, e5m2 overflows to
// infinity). Also the bitwise operations on a lane's int32 value. Not the loops (execute.cpp,
// matmul.cpp, gather_scan.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ir/dtype.h"
#include "nki/program.h"

namespace openneuron::nki {

template <class T>
inline T to_int(float x, float lo, float hi) {
  float c = x > hi ? hi : x;
  c = c < lo ? lo : c;
  c = c != c ? 0.0f : c;
  return static_cast<T>(c);
}

// Bitwise operations on the int32 values of float lanes; shifts by a count taken modulo 32,
// right shifts arithmetic (int32's sign), as numpy's on int32.
inline float bits_op(Op op, float a, float b) {
  const int32_t x = to_int<int32_t>(a, -2147483648.0f, 2147483520.0f);
  const int32_t y = to_int<int32_t>(b, -2147483648.0f, 2147483520.0f);
  const uint32_t ux = static_cast<uint32_t>(x);
  int32_t r = 0;
  switch (op) {
    case Op::k_bitwise_and:
      r = x & y;
      break;
    case Op::k_bitwise_or:
      r = x | y;
      break;
    case Op::k_bitwise_xor:
      r = x ^ y;
      break;
    case Op::k_left_shift:
      r = static_cast<int32_t>(ux << (static_cast<uint32_t>(y) & 31u));
      break;
    case Op::k_right_shift:  // arithmetic, without right-shifting a negative int (UB-free)
      r = x >= 0 ? static_cast<int32_t>(ux >> (static_cast<uint32_t>(y) & 31u))
                 : ~static_cast<int32_t>(~ux >> (static_cast<uint32_t>(y) & 31u));
      break;
    default:  // invert
      r = ~x;
      break;
  }
  return static_cast<float>(r);
}

// float8_e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, 0x7F/0xFF NaN. As
// torch converts tensors: a magnitude that would round past the largest finite (448), an
// infinity among them, saturates to +-448; NaN stays NaN.
inline uint8_t fp8_e4m3_from_f32(float f) {
  constexpr uint32_t kInf = UINT32_C(255) << 23;
  constexpr uint32_t kPastMax = UINT32_C(1087) << 20;  // 480.0f
  constexpr uint32_t kDenormMask = UINT32_C(141) << 23;
  uint32_t bits = ir::numeric::f32_bits(f);
  const uint32_t sign = bits & UINT32_C(0x80000000);
  bits ^= sign;
  uint8_t r;
  if (bits > kInf) {
    r = 0x7F;
  } else if (bits >= kPastMax) {
    r = 0x7E;
  } else if (bits < (UINT32_C(121) << 23)) {  // below 2^-6: subnormal, rounded by the FPU's add
    const float g = ir::numeric::f32_from_bits(bits) + ir::numeric::f32_from_bits(kDenormMask);
    r = static_cast<uint8_t>(ir::numeric::f32_bits(g) - kDenormMask);
  } else {
    const uint32_t odd = (bits >> 20) & 1;
    bits += (static_cast<uint32_t>(7 - 127) << 23) + UINT32_C(0x7FFFF) + odd;
    r = static_cast<uint8_t>(bits >> 20);
    r = r == 0x7F ? 0x7E : r;  // rounded up past 448: saturated
  }
  return static_cast<uint8_t>(r | (sign >> 24));
}

inline float f32_from_fp8_e4m3(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xF, m = b & 0x7;
  if (e == 0xF && m == 0x7) return ir::numeric::f32_from_bits(sign | UINT32_C(0x7FC00000));
  if (e == 0) {  // m * 2^-9
    const float v = static_cast<float>(m) * 0.001953125f;
    return sign ? -v : v;
  }
  return ir::numeric::f32_from_bits(sign | ((e + 120) << 23) | (m << 20));
}

// float8_e5m2: IEEE-like (bias 15, 2 mantissa bits, infinities): a float16's top byte. A
// magnitude of 65536 or more becomes infinity (57344 is the largest finite), NaN stays NaN.
inline uint8_t fp8_e5m2_from_f32(float f) {
  constexpr uint32_t kInf = UINT32_C(255) << 23;
  constexpr uint32_t kInfFrom = UINT32_C(143) << 23;  // 65536.0f
  constexpr uint32_t kDenormMask = UINT32_C(134) << 23;
  uint32_t bits = ir::numeric::f32_bits(f);
  const uint32_t sign = bits & UINT32_C(0x80000000);
  bits ^= sign;
  uint8_t r;
  if (bits >= kInfFrom) {
    r = bits > kInf ? 0x7F : 0x7C;
  } else if (bits < (UINT32_C(113) << 23)) {  // below 2^-14: subnormal
    const float g = ir::numeric::f32_from_bits(bits) + ir::numeric::f32_from_bits(kDenormMask);
    r = static_cast<uint8_t>(ir::numeric::f32_bits(g) - kDenormMask);
  } else {
    const uint32_t odd = (bits >> 21) & 1;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + UINT32_C(0xFFFFF) + odd;
    r = static_cast<uint8_t>(bits >> 21);
  }
  return static_cast<uint8_t>(r | (sign >> 24));
}

inline float f32_from_fp8_e5m2(uint8_t b) {
  return ir::numeric::f32_from_f16(static_cast<uint16_t>(b << 8));
}

// One element i of a buffer of dtype dt, as float32 (the loops' scalar fallback).
inline float load_one(DType dt, const char* base, int64_t i) {
  switch (dt) {
    case DType::k_float32:
      return reinterpret_cast<const float*>(base)[i];
    case DType::k_bfloat16:
      return ir::numeric::f32_from_bf16(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::k_float16:
      return ir::numeric::f32_from_f16(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::k_int32:
      return static_cast<float>(reinterpret_cast<const int32_t*>(base)[i]);
    case DType::k_uint8:
      return static_cast<float>(reinterpret_cast<const uint8_t*>(base)[i]);
    case DType::k_int8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(base)[i]);
    case DType::k_uint16:
      return static_cast<float>(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::k_int16:
      return static_cast<float>(reinterpret_cast<const int16_t*>(base)[i]);
    case DType::k_uint32:
      return static_cast<float>(reinterpret_cast<const uint32_t*>(base)[i]);
    case DType::k_float8_e4m3:
      return f32_from_fp8_e4m3(reinterpret_cast<const uint8_t*>(base)[i]);
    case DType::k_float8_e5m2:
      return f32_from_fp8_e5m2(reinterpret_cast<const uint8_t*>(base)[i]);
    default:
      return 0.0f;
  }
}

// An element of an integer tile, exactly (a float32 read would round past 2^24).
inline int64_t load_integer(DType dt, const char* base, int64_t i) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  switch (dt) {
    case DType::k_int32:
      return reinterpret_cast<const int32_t*>(base)[i];
    case DType::k_uint32:
      return reinterpret_cast<const uint32_t*>(base)[i];
    case DType::k_int16:
      return reinterpret_cast<const int16_t*>(base)[i];
    case DType::k_uint16:
      return reinterpret_cast<const uint16_t*>(base)[i];
    case DType::k_int8:
      return reinterpret_cast<const int8_t*>(base)[i];
    case DType::k_uint8:
      return reinterpret_cast<const uint8_t*>(base)[i];
    default: {  // float types: the value truncated toward zero (NaN 0, huge ones +-2^62)
      const float v = load_one(dt, base, i);
      if (!(std::fabs(v) < 4.0e18f)) return v > 0.0f ? kHuge : (v < 0.0f ? -kHuge : 0);
      return static_cast<int64_t>(v);
    }
  }
}

// The 32-bit integers' saturating conversions. NOTE: 2147483520 and 4294967040 are the largest
// floats below 2^31 and 2^32; a value at or past 2^31 / 2^32 saturates to the type's maximum
// (INT32_MAX / UINT32_MAX, which no float32 holds exactly: nc_find_index8's all-ones "not
// found" reads 2^32 as a float and stores 0xFFFFFFFF).
inline int32_t to_int32(float v) {
  return v >= 2147483648.0f ? INT32_MAX : to_int<int32_t>(v, -2147483648.0f, 2147483520.0f);
}
inline uint32_t to_uint32(float v) {
  return v >= 4294967296.0f ? UINT32_MAX : to_int<uint32_t>(v, 0.0f, 4294967040.0f);
}

inline void store_one(DType dt, char* base, int64_t i, float v) {
  switch (dt) {
    case DType::k_float32:
      reinterpret_cast<float*>(base)[i] = v;
      break;
    case DType::k_bfloat16:
      reinterpret_cast<uint16_t*>(base)[i] = ir::numeric::bf16_from_f32(v);
      break;
    case DType::k_float16:
      reinterpret_cast<uint16_t*>(base)[i] = ir::numeric::f16_from_f32(v);
      break;
    case DType::k_int32:
      reinterpret_cast<int32_t*>(base)[i] = to_int32(v);
      break;
    case DType::k_uint8:
      reinterpret_cast<uint8_t*>(base)[i] = to_int<uint8_t>(v, 0.0f, 255.0f);
      break;
    case DType::k_int8:
      reinterpret_cast<int8_t*>(base)[i] = to_int<int8_t>(v, -128.0f, 127.0f);
      break;
    case DType::k_uint16:
      reinterpret_cast<uint16_t*>(base)[i] = to_int<uint16_t>(v, 0.0f, 65535.0f);
      break;
    case DType::k_int16:
      reinterpret_cast<int16_t*>(base)[i] = to_int<int16_t>(v, -32768.0f, 32767.0f);
      break;
    case DType::k_uint32:
      reinterpret_cast<uint32_t*>(base)[i] = to_uint32(v);
      break;
    case DType::k_float8_e4m3:
      reinterpret_cast<uint8_t*>(base)[i] = fp8_e4m3_from_f32(v);
      break;
    case DType::k_float8_e5m2:
      reinterpret_cast<uint8_t*>(base)[i] = fp8_e5m2_from_f32(v);
      break;
    default:
      break;
  }
}

// v as stored in dtype dt and read back (the value a later read of the element sees).
inline float round_to(DType dt, float v) {
  alignas(8) char cell[8];
  store_one(dt, cell, 0, v);
  return load_one(dt, cell, 0);
}

}  // namespace openneuron::nki
