// Shared pieces of the hand-written kernels (csrc/kernels): element types and their float
// conversions (bf16/fp16 round to nearest even, as c10 does), a vectorizable exp, lane-wise
// reductions; hot loops are compiled per SIMD variant through runtime/isa.h. No torch includes.
// Compute is always float32, as ATen's CPU kernels do for low-precision inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ir/dtype.h"
#include "runtime/isa.h"

namespace openneuron::kernels {

// Element types: the IR's (ir/dtype.h); kernels take kFloat32, kBFloat16 and kFloat16.
using ir::DType;

// Hot loops are OPENNEURON_ISA_BODY functions with an OPENNEURON_ISA_DISPATCH (runtime/isa.h):
// compiled for x86-64-v4 (AVX-512), v3 (AVX2 + FMA) and the baseline; OPENNEURON_ISA or the CPU
// picks one. FMA is only used where a file allows contraction (attention.cpp).
#define OPENNEURON_INLINE __attribute__((always_inline)) inline
// The same for a lambda: [&](auto x) OPENNEURON_LAMBDA_INLINE { ... }.
#define OPENNEURON_LAMBDA_INLINE __attribute__((always_inline))

OPENNEURON_INLINE uint32_t bits_of(float f) { return ir::numeric::f32_bits(f); }
OPENNEURON_INLINE float float_of(uint32_t u) { return ir::numeric::f32_from_bits(u); }

// bf16/fp16 <-> float, round to nearest even: the one implementation is ir/dtype.h.
OPENNEURON_INLINE float bf16_to_float(uint16_t h) { return ir::numeric::f32_from_bf16(h); }
OPENNEURON_INLINE uint16_t float_to_bf16(float f) { return ir::numeric::bf16_from_f32(f); }
OPENNEURON_INLINE float f16_to_float(uint16_t h) { return ir::numeric::f32_from_f16(h); }
OPENNEURON_INLINE uint16_t float_to_f16(float f) { return ir::numeric::f16_from_f32(f); }

// Element access by dtype: T is the stored type.
struct F32 {
  using T = float;
  static OPENNEURON_INLINE float load(T v) { return v; }
  static OPENNEURON_INLINE T store(float f) { return f; }
};
struct BF16 {
  using T = uint16_t;
  static OPENNEURON_INLINE float load(T v) { return bf16_to_float(v); }
  static OPENNEURON_INLINE T store(float f) { return float_to_bf16(f); }
};
struct F16 {
  using T = uint16_t;
  static OPENNEURON_INLINE float load(T v) { return f16_to_float(v); }
  static OPENNEURON_INLINE T store(float f) { return float_to_f16(f); }
};

// One element of any storage dtype as float, and back (i in elements).
OPENNEURON_INLINE float load_any(DType d, const void* p, int64_t i) {
  switch (d) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat16:
      return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:  // not a kernel dtype: callers take only these three
      break;
  }
  return 0;
}

OPENNEURON_INLINE void store_any(DType d, void* p, int64_t i, float v) {
  switch (d) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(p)[i] = float_to_f16(v);
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}

// Rows of any storage dtype to and from float buffers (offset and n in elements).
template <class D>
OPENNEURON_INLINE void to_float(const void* src, int64_t offset, int64_t n, float* dst) {
  const typename D::T* s = static_cast<const typename D::T*>(src) + offset;
  for (int64_t j = 0; j < n; ++j) dst[j] = D::load(s[j]);
}

template <class D>
OPENNEURON_INLINE void from_float(const float* src, void* dst, int64_t offset, int64_t n) {
  typename D::T* d = static_cast<typename D::T*>(dst) + offset;
  for (int64_t j = 0; j < n; ++j) d[j] = D::store(src[j]);
}

OPENNEURON_INLINE void load_row(DType d, const void* src, int64_t offset, int64_t n, float* dst) {
  switch (d) {
    case DType::kFloat32:
      to_float<F32>(src, offset, n, dst);
      break;
    case DType::kBFloat16:
      to_float<BF16>(src, offset, n, dst);
      break;
    case DType::kFloat16:
      to_float<F16>(src, offset, n, dst);
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}

OPENNEURON_INLINE void store_row(DType d, const float* src, void* dst, int64_t offset, int64_t n) {
  switch (d) {
    case DType::kFloat32:
      from_float<F32>(src, dst, offset, n);
      break;
    case DType::kBFloat16:
      from_float<BF16>(src, dst, offset, n);
      break;
    case DType::kFloat16:
      from_float<F16>(src, dst, offset, n);
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}

// Calls f(Tag{}) with the element tag for d.
template <class F>
void dispatch_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kFloat32:
      f(F32{});
      break;
    case DType::kBFloat16:
      f(BF16{});
      break;
    case DType::kFloat16:
      f(F16{});
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}

// exp(x) in float without branches (vectorizes): Cody-Waite range reduction and a degree-6
// polynomial, within 2 ulp of std::exp on [-87, 88]; exp(-inf) = 0, exp(+inf) = inf, NaN stays.
OPENNEURON_INLINE float exp_f32(float x) {
  const float hi = 88.7228391f, lo = -87.3365479f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n = round(x / ln2) through the 1.5 * 2^23 trick (no float -> int conversion).
  const float magic = 12582912.0f;
  const float t = xc * 1.44269504088896341f + magic;
  const float n = t - magic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from n's integer bits, as two factors so n in [-126, 128] stays in range.
  const int32_t ni = static_cast<int32_t>(bits_of(t) - bits_of(magic));
  const int32_t half = ni / 2;
  const float s1 = float_of(static_cast<uint32_t>(half + 127) << 23);
  const float s2 = float_of(static_cast<uint32_t>(ni - half + 127) << 23);
  float res = p * s1 * s2;
  res = x < lo ? 0.0f : res;
  res = x > hi ? INFINITY : res;
  return x != x ? x : res;
}

constexpr int kLanes = 16;

// 16 floats as one GCC vector: one AVX-512 register. NOTE: an AVX2 or baseline clone lowers it
// to register pairs (quads) but keeps it in memory between operations, moving it through
// general registers: 2-3x slower loops. Loops that also run on those variants use the
// variant's own width (Vec8, Vec4) through with_native_vec, as kLanes / lanes vectors, so that
// every variant adds the same terms in the same order (the same bits).
typedef float VecF __attribute__((vector_size(64)));
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));
template <class V>
constexpr int64_t kLanesOf = static_cast<int64_t>(sizeof(V) / sizeof(float));
// NOTE: helpers take vectors by reference: returning one by value warns (-Wpsabi) in the
// baseline clone.
OPENNEURON_INLINE void loadv(VecF* v, const float* p) { std::memcpy(v, p, sizeof(VecF)); }
template <class V>
OPENNEURON_INLINE void load_n(V* v, const float* p) {
  std::memcpy(v, p, sizeof(V));
}
template <class V>
OPENNEURON_INLINE void store_n(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

template <class V>
struct VecTag {
  using type = V;
};
// f(VecTag<V>{}) with the active variant's register-wide float vector V (VecF, Vec8, Vec4).
// f must be always inlined (OPENNEURON_INLINE) to be compiled for the caller's variant.
template <class F>
OPENNEURON_INLINE auto with_native_vec(F&& f) {
  switch (runtime::isa()) {
    case runtime::Isa::kAvx512:
      return f(VecTag<VecF>{});
    case runtime::Isa::kAvx2:
      return f(VecTag<Vec8>{});
    default:
      return f(VecTag<Vec4>{});
  }
}

// Lane-wise max / sum / dot over float arrays in 16 lanes (the order differs from a serial loop;
// it is the same in every variant): lane l takes elements l, l + 16, ...; then the tail, then
// the lanes in order.
template <class V>
OPENNEURON_INLINE float max_f32_v(const float* x, int64_t n) {
  constexpr int64_t L = kLanesOf<V>, P = kLanes / L;
  V acc[P];
  for (int64_t p = 0; p < P; ++p) acc[p] = V{} - INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 4
    for (int64_t p = 0; p < P; ++p) {
      V v;
      load_n(&v, x + i + p * L);
      acc[p] = v > acc[p] ? v : acc[p];
    }
  }
  float m = -INFINITY;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  float lanes[kLanes];
  for (int64_t p = 0; p < P; ++p) store_n(lanes + p * L, acc[p]);
  for (int l = 0; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

template <class V>
OPENNEURON_INLINE float dot_f32_v(const float* x, const float* y, int64_t n) {
  constexpr int64_t L = kLanesOf<V>, P = kLanes / L;
  V acc[P] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 4
    for (int64_t p = 0; p < P; ++p) {
      V a;
      load_n(&a, x + i + p * L);
      if (y) {
        V b;
        load_n(&b, y + i + p * L);
        a = a * b;
      }
      acc[p] += a;
    }
  }
  float s = 0;
  for (; i < n; ++i) s += y ? x[i] * y[i] : x[i];
  float lanes[kLanes];
  for (int64_t p = 0; p < P; ++p) store_n(lanes + p * L, acc[p]);
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

OPENNEURON_INLINE float max_f32(const float* x, int64_t n) {
  return with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    return max_f32_v<typename decltype(tag)::type>(x, n);
  });
}
OPENNEURON_INLINE float sum_f32(const float* x, int64_t n) {
  return with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    return dot_f32_v<typename decltype(tag)::type>(x, nullptr, n);
  });
}
OPENNEURON_INLINE float dot_f32(const float* x, const float* y, int64_t n) {
  return with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    return dot_f32_v<typename decltype(tag)::type>(x, y, n);
  });
}

// Rows per parallel chunk so that a chunk holds at least ~16K elements.
inline int64_t row_grain(int64_t row_len) {
  const int64_t g = (16384 + row_len - 1) / (row_len > 0 ? row_len : 1);
  return g > 0 ? g : 1;
}

}  // namespace openneuron::kernels
