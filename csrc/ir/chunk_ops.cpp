// The interpreter's per-chunk pointwise loops (see program.h): every op kernel over a chunk of
// values in its compute kind, strided row loads and stores with dtype conversion, and the math
// hooks (vector transcendentals the ATen glue installs so results match eager bit for bit). The
// loops are compiled for AVX-512, AVX2 and baseline x86-64 (OPENNEURON_ISA_DISPATCH).
// NOTE: errno is never read by the interpreter; without it GCC vectorizes sqrt/floor/etc.
#pragma GCC optimize("no-math-errno")

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/program.h"
#include "runtime/isa.h"

namespace openneuron::ir {
namespace detail {

// --- math hooks -----------------------------------------------------------------------------

// Float unary hooks by storage: [0] float32, [1] bfloat16, [2] float16 (Instr::round's codes).
std::array<std::array<std::atomic<VecMathFn>, kNumOps>, 3> g_f32_unary{};
std::array<std::atomic<VecMathFn2>, kNumOps> g_f32_binary{};
std::array<std::atomic<VecMathFnF64>, kNumOps> g_f64_unary{};
std::array<std::atomic<VecMathFn2F64>, kNumOps> g_f64_binary{};

bool hookable_unary(Op op) { return op_arity(op) == 1 && op_traits(op).has(kMathHook); }

template <class T>
struct Hooks;
template <>
struct Hooks<float> {
  // round: the storage dtype's code; a bf16/f16 op without its own hook uses the float32 one.
  static VecMathFn unary(Op op, uint8_t round) {
    if (round != 0)
      if (VecMathFn h = g_f32_unary[round][static_cast<int>(op)].load(std::memory_order_relaxed))
        return h;
    return g_f32_unary[0][static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  static VecMathFn2 binary(Op op) {
    return g_f32_binary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
};
template <>
struct Hooks<double> {
  static VecMathFnF64 unary(Op op, uint8_t /*round*/) {
    return g_f64_unary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  static VecMathFn2F64 binary(Op op) {
    return g_f64_binary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
};

// --- chunk loops ----------------------------------------------------------------------------

template <class T>
OPENNEURON_IR_INLINE T max_nan(T a, T b) {
  return (a != a) ? a : (b != b) ? b : (a > b ? a : b);
}
template <class T>
OPENNEURON_IR_INLINE T min_nan(T a, T b) {
  return (a != a) ? a : (b != b) ? b : (a < b ? a : b);
}

template <class T, class R, class F>
OPENNEURON_IR_INLINE void map1(const void* a, void* y, int64_t n, F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  R* __restrict py = static_cast<R*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i]);
}
template <class T, class R, class F>
OPENNEURON_IR_INLINE void map2(const void* a, const void* b, void* y, int64_t n, F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  R* __restrict py = static_cast<R*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i], pb[i]);
}
template <class T, class F>
OPENNEURON_IR_INLINE void map3(const void* a, const void* b, const void* c, void* y, int64_t n,
                               F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  const T* __restrict pc = static_cast<const T*>(c);
  T* __restrict py = static_cast<T*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i], pb[i], pc[i]);
}
template <class T>
OPENNEURON_IR_INLINE void where_loop(const void* c, const void* a, const void* b, void* y,
                                     int64_t n) {
  const uint8_t* __restrict pc = static_cast<const uint8_t*>(c);
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  T* __restrict py = static_cast<T*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = pc[i] ? pa[i] : pb[i];
}

// Compare/logical ops shared by every kind. Returns false if op is not one of them.
template <class T>
OPENNEURON_IR_INLINE bool compare_op(const Instr& in, void* const* p, int64_t n) {
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kEq:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x == z); });
      break;
    case Op::kNe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x != z); });
      break;
    case Op::kLt:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x < z); });
      break;
    case Op::kLe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x <= z); });
      break;
    case Op::kGt:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x > z); });
      break;
    case Op::kGe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x >= z); });
      break;
    case Op::kLogicalAnd:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) & (z != T(0))); });
      break;
    case Op::kLogicalOr:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) | (z != T(0))); });
      break;
    case Op::kLogicalXor:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) ^ (z != T(0))); });
      break;
    case Op::kLogicalNot:
      map1<T, uint8_t>(a, y, n, [](T x) { return uint8_t(x == T(0)); });
      break;
    case Op::kWhere:
      where_loop<T>(a, b, p[in.c], y, n);
      break;
    default:
      return false;
  }
  return true;
}

template <class T, T (*F)(T)>
OPENNEURON_IR_INLINE void std_or_hook(Op op, uint8_t round, const void* a, void* y, int64_t n) {
  if (auto h = Hooks<T>::unary(op, round)) {
    h(static_cast<const T*>(a), static_cast<T*>(y), n);
    return;
  }
  map1<T, T>(a, y, n, [](T x) { return F(x); });
}

template <class T>
T f_exp(T x) {
  return std::exp(x);
}
template <class T>
T f_exp2(T x) {
  return std::exp2(x);
}
template <class T>
T f_expm1(T x) {
  return std::expm1(x);
}
template <class T>
T f_log(T x) {
  return std::log(x);
}
template <class T>
T f_log2(T x) {
  return std::log2(x);
}
template <class T>
T f_log10(T x) {
  return std::log10(x);
}
template <class T>
T f_log1p(T x) {
  return std::log1p(x);
}
template <class T>
T f_sqrt(T x) {
  return std::sqrt(x);
}
template <class T>
T f_rsqrt(T x) {
  return T(1) / std::sqrt(x);
}
template <class T>
T f_sin(T x) {
  return std::sin(x);
}
template <class T>
T f_cos(T x) {
  return std::cos(x);
}
template <class T>
T f_tan(T x) {
  return std::tan(x);
}
template <class T>
T f_atan(T x) {
  return std::atan(x);
}
template <class T>
T f_tanh(T x) {
  return std::tanh(x);
}
template <class T>
T f_sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
T f_erf(T x) {
  return std::erf(x);
}
template <class T>
T f_erfc(T x) {
  return std::erfc(x);
}
template <class T>
T f_reciprocal(T x) {
  return T(1) / x;
}

// torch.remainder / floor_divide for floating types (ATen's scalar formulas).
template <class T>
T f_remainder(T a, T b) {
  T mod = std::fmod(a, b);
  if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
  return mod;
}
template <class T>
T f_floor_div(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div != 0) {
    T fl = std::floor(div);
    if (div - fl > T(0.5)) fl += T(1);
    return fl;
  }
  return std::copysign(T(0), a / b);
}

template <class T>
OPENNEURON_IR_INLINE void float_op(const Instr& in, void* const* p, int64_t n) {
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kNeg:
      map1<T, T>(a, y, n, [](T x) { return -x; });
      break;
    case Op::kAbs:
      map1<T, T>(a, y, n, [](T x) { return std::fabs(x); });
      break;
    case Op::kSign:
      map1<T, T>(a, y, n, [](T x) { return T(T(0) < x) - T(x < T(0)); });
      break;
    case Op::kReciprocal:
      std_or_hook<T, f_reciprocal<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExp:
      std_or_hook<T, f_exp<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExp2:
      std_or_hook<T, f_exp2<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExpm1:
      std_or_hook<T, f_expm1<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog:
      std_or_hook<T, f_log<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog2:
      std_or_hook<T, f_log2<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog10:
      std_or_hook<T, f_log10<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog1p:
      std_or_hook<T, f_log1p<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSqrt:
      std_or_hook<T, f_sqrt<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kRsqrt:
      std_or_hook<T, f_rsqrt<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSin:
      std_or_hook<T, f_sin<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kCos:
      std_or_hook<T, f_cos<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kTan:
      std_or_hook<T, f_tan<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kAtan:
      std_or_hook<T, f_atan<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kTanh:
      std_or_hook<T, f_tanh<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSigmoid:
      std_or_hook<T, f_sigmoid<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kErf:
      std_or_hook<T, f_erf<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kErfc:
      std_or_hook<T, f_erfc<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kFloor:
      map1<T, T>(a, y, n, [](T x) { return std::floor(x); });
      break;
    case Op::kCeil:
      map1<T, T>(a, y, n, [](T x) { return std::ceil(x); });
      break;
    case Op::kTrunc:
      map1<T, T>(a, y, n, [](T x) { return std::trunc(x); });
      break;
    case Op::kRound:
      map1<T, T>(a, y, n, [](T x) { return std::nearbyint(x); });
      break;
    case Op::kIsNan:
      map1<T, uint8_t>(a, y, n, [](T x) { return uint8_t(x != x); });
      break;
    case Op::kAdd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x + z; });
      break;
    case Op::kSub:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x - z; });
      break;
    case Op::kMul:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x * z; });
      break;
    case Op::kDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x / z; });
      break;
    case Op::kMax:
      map2<T, T>(a, b, y, n, [](T x, T z) { return max_nan(x, z); });
      break;
    case Op::kMin:
      map2<T, T>(a, b, y, n, [](T x, T z) { return min_nan(x, z); });
      break;
    case Op::kPow:
      if (auto h = Hooks<T>::binary(in.op)) {
        h(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n);
      } else {
        map2<T, T>(a, b, y, n, [](T x, T z) { return std::pow(x, z); });
      }
      break;
    case Op::kRemainder:
      map2<T, T>(a, b, y, n, [](T x, T z) { return f_remainder(x, z); });
      break;
    case Op::kFloorDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) { return f_floor_div(x, z); });
      break;
    case Op::kFma:
      map3<T>(a, b, p[in.c], y, n, [](T x, T z, T w) { return std::fma(x, z, w); });
      break;
    default:
      break;  // rejected by the builder
  }
}

// bf16/fp16 add/sub/mul/div with the rounding in the same loop (the hot ops of autocast
// chains; other ops round in a second pass over the L1-resident chunk).
template <int RM>
OPENNEURON_IR_INLINE float round_rm(float v) {
  if constexpr (RM == 1) {
    return numeric::round_bf16(v);
  } else {
    return numeric::round_f16(v);
  }
}
template <int RM>
OPENNEURON_IR_INLINE bool arith_rounded(const Instr& in, void* const* p, int64_t n) {
  if (in.op != Op::kAdd && in.op != Op::kSub && in.op != Op::kMul && in.op != Op::kDiv)
    return false;  // NOTE: before reading p[in.b]: unary ops have b == -1
  const void* a = p[in.a];
  const void* b = p[in.b];
  void* y = p[in.out];
  switch (in.op) {
    case Op::kAdd:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x + z); });
      return true;
    case Op::kSub:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x - z); });
      return true;
    case Op::kMul:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x * z); });
      return true;
    case Op::kDiv:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x / z); });
      return true;
    default:
      return false;
  }
}

template <class T, class U>
T int_pow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? T(-1) : T(1);
    return 0;
  }
  U result = 1, b = static_cast<U>(base);
  while (exp) {
    if (exp & 1) result *= b;
    b *= b;
    exp >>= 1;
  }
  return static_cast<T>(result);
}

template <class T, class U>
OPENNEURON_IR_INLINE void int_op(const Instr& in, void* const* p, int64_t n) {
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  constexpr T kMin = std::numeric_limits<T>::min();
  switch (in.op) {
    case Op::kNeg:
      map1<T, T>(a, y, n, [](T x) { return T(U(0) - U(x)); });
      break;
    case Op::kAbs:
      map1<T, T>(a, y, n, [](T x) { return x < 0 ? T(U(0) - U(x)) : x; });
      break;
    case Op::kSign:
      map1<T, T>(a, y, n, [](T x) { return T(T(0 < x) - T(x < 0)); });
      break;
    case Op::kBitNot:
      map1<T, T>(a, y, n, [](T x) { return T(~x); });
      break;
    case Op::kAdd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) + U(z)); });
      break;
    case Op::kSub:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) - U(z)); });
      break;
    case Op::kMul:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) * U(z)); });
      break;
    case Op::kDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        return z == 0 ? T(0) : (x == kMin && z == -1) ? kMin : T(x / z);
      });
      break;
    case Op::kRemainder:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        if (z == 0 || z == -1) return T(0);
        T r = x % z;
        return (r != 0 && ((r < 0) != (z < 0))) ? T(r + z) : r;
      });
      break;
    case Op::kFloorDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        if (z == 0) return T(0);
        if (x == kMin && z == -1) return kMin;
        T q = x / z;
        return (x % z != 0 && ((x < 0) != (z < 0))) ? T(q - 1) : q;
      });
      break;
    case Op::kMax:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x > z ? x : z; });
      break;
    case Op::kMin:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x < z ? x : z; });
      break;
    case Op::kPow:
      map2<T, T>(a, b, y, n, [](T x, T z) { return int_pow<T, U>(x, z); });
      break;
    case Op::kBitAnd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x & z); });
      break;
    case Op::kBitOr:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x | z); });
      break;
    case Op::kBitXor:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x ^ z); });
      break;
    case Op::kFma:
      map3<T>(a, b, p[in.c], y, n, [](T x, T z, T w) { return T(U(x) * U(z) + U(w)); });
      break;
    default:
      break;
  }
}

OPENNEURON_IR_INLINE void bool_op(const Instr& in, void* const* p, int64_t n) {
  using T = uint8_t;
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kBitNot:
      map1<T, T>(a, y, n, [](T x) { return T(x ^ 1); });
      break;
    case Op::kMax:
    case Op::kBitOr:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x | z); });
      break;
    case Op::kMin:
    case Op::kBitAnd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x & z); });
      break;
    case Op::kBitXor:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x ^ z); });
      break;
    default:
      break;
  }
}

// Float -> int without UB: out of range and NaN give the x86 "integer indefinite" (INT_MIN).
template <class S, class D>
OPENNEURON_IR_INLINE D float_to_int(S x) {
  constexpr S lo = -static_cast<S>(std::numeric_limits<D>::max()) - S(1);  // -2^k exactly
  bool ok = x >= lo && x < -lo;
  D r = static_cast<D>(ok ? x : S(0));
  return ok ? r : std::numeric_limits<D>::min();
}

template <class S, class D>
OPENNEURON_IR_INLINE D convert(S x) {
  if constexpr (std::is_same_v<D, uint8_t>) {
    return static_cast<uint8_t>(x != S(0));
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    return float_to_int<S, D>(x);
  } else {
    return static_cast<D>(x);
  }
}

template <class S>
OPENNEURON_IR_INLINE void cast_from(Kind to, const void* a, void* y, int64_t n) {
  switch (to) {
    case Kind::kF32:
      map1<S, float>(a, y, n, [](S x) { return convert<S, float>(x); });
      break;
    case Kind::kF64:
      map1<S, double>(a, y, n, [](S x) { return convert<S, double>(x); });
      break;
    case Kind::kI32:
      map1<S, int32_t>(a, y, n, [](S x) { return convert<S, int32_t>(x); });
      break;
    case Kind::kI64:
      map1<S, int64_t>(a, y, n, [](S x) { return convert<S, int64_t>(x); });
      break;
    case Kind::kB8:
      map1<S, uint8_t>(a, y, n, [](S x) { return convert<S, uint8_t>(x); });
      break;
  }
}

OPENNEURON_ISA_BODY void run_instr_body(const Instr& in, void* const* p, int64_t n) {
  if (in.op == Op::kCast) {
    switch (in.kind) {
      case Kind::kF32:
        cast_from<float>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kF64:
        cast_from<double>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kI32:
        cast_from<int32_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kI64:
        cast_from<int64_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kB8:
        cast_from<uint8_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
    }
  } else {
    switch (in.kind) {
      case Kind::kF32:
        if (in.round == 1 && arith_rounded<1>(in, p, n)) return;
        if (in.round == 2 && arith_rounded<2>(in, p, n)) return;
        float_op<float>(in, p, n);
        break;
      case Kind::kF64:
        float_op<double>(in, p, n);
        break;
      case Kind::kI32:
        int_op<int32_t, uint32_t>(in, p, n);
        break;
      case Kind::kI64:
        int_op<int64_t, uint64_t>(in, p, n);
        break;
      case Kind::kB8:
        bool_op(in, p, n);
        break;
    }
  }
  if (in.round == 1) {
    float* __restrict y = static_cast<float*>(p[in.out]);
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_bf16(y[i]);
  } else if (in.round == 2) {
    float* __restrict y = static_cast<float*>(p[in.out]);
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_f16(y[i]);
  }
}
OPENNEURON_ISA_DISPATCH(void, run_instr, (const Instr& in, void* const* p, int64_t n), (in, p, n))

// Strided row copy with conversion: stride 1 (vectorized), 0 (broadcast) or any.
template <class S, class D, class F>
OPENNEURON_IR_INLINE void gather(const S* __restrict s, int64_t st, D* __restrict d, int64_t n,
                                 F f) {
  if (st == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  } else if (st == 0) {
    D v = f(s[0]);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i * st]);
  }
}
template <class S, class D, class F>
OPENNEURON_IR_INLINE void scatter(const S* __restrict s, D* __restrict d, int64_t st, int64_t n,
                                  F f) {
  if (st == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  } else if (st == 0) {
    if (n > 0) d[0] = f(s[n - 1]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * st] = f(s[i]);
  }
}

template <class T>
T ident(T x) {
  return x;
}

// Loads n elements of dtype dt at src (element stride st) into a compute-kind buffer.
OPENNEURON_ISA_BODY void load_row_body(DType dt, const char* src, int64_t st, void* dst,
                                       int64_t n) {
  switch (dt) {
    case DType::kFloat32:
      gather(reinterpret_cast<const float*>(src), st, static_cast<float*>(dst), n, ident<float>);
      break;
    case DType::kBFloat16:
      gather(reinterpret_cast<const uint16_t*>(src), st, static_cast<float*>(dst), n,
             [](uint16_t h) { return numeric::f32_from_bf16(h); });
      break;
    case DType::kFloat16:
      gather(reinterpret_cast<const uint16_t*>(src), st, static_cast<float*>(dst), n,
             [](uint16_t h) { return numeric::f32_from_f16(h); });
      break;
    case DType::kFloat64:
      gather(reinterpret_cast<const double*>(src), st, static_cast<double*>(dst), n, ident<double>);
      break;
    case DType::kInt32:
      gather(reinterpret_cast<const int32_t*>(src), st, static_cast<int32_t*>(dst), n,
             ident<int32_t>);
      break;
    case DType::kInt64:
      gather(reinterpret_cast<const int64_t*>(src), st, static_cast<int64_t*>(dst), n,
             ident<int64_t>);
      break;
    case DType::kBool:
      gather(reinterpret_cast<const uint8_t*>(src), st, static_cast<uint8_t*>(dst), n,
             [](uint8_t b) { return uint8_t(b != 0); });
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, load_row,
                        (DType dt, const char* src, int64_t st, void* dst, int64_t n),
                        (dt, src, st, dst, n))

// Stores n compute-kind elements to dtype dt at dst (element stride st).
OPENNEURON_ISA_BODY void store_row_body(DType dt, const void* src, char* dst, int64_t st,
                                        int64_t n) {
  switch (dt) {
    case DType::kFloat32:
      scatter(static_cast<const float*>(src), reinterpret_cast<float*>(dst), st, n, ident<float>);
      break;
    case DType::kBFloat16:
      scatter(static_cast<const float*>(src), reinterpret_cast<uint16_t*>(dst), st, n,
              [](float f) { return numeric::bf16_from_f32(f); });
      break;
    case DType::kFloat16:
      scatter(static_cast<const float*>(src), reinterpret_cast<uint16_t*>(dst), st, n,
              [](float f) { return numeric::f16_from_f32(f); });
      break;
    case DType::kFloat64:
      scatter(static_cast<const double*>(src), reinterpret_cast<double*>(dst), st, n,
              ident<double>);
      break;
    case DType::kInt32:
      scatter(static_cast<const int32_t*>(src), reinterpret_cast<int32_t*>(dst), st, n,
              ident<int32_t>);
      break;
    case DType::kInt64:
      scatter(static_cast<const int64_t*>(src), reinterpret_cast<int64_t*>(dst), st, n,
              ident<int64_t>);
      break;
    case DType::kBool:
      scatter(static_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst), st, n,
              ident<uint8_t>);
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, store_row,
                        (DType dt, const void* src, char* dst, int64_t st, int64_t n),
                        (dt, src, dst, st, n))

}  // namespace detail

using detail::g_f32_binary;
using detail::g_f32_unary;
using detail::g_f64_binary;
using detail::g_f64_unary;
using detail::hookable_unary;

void set_float_math(Op op, VecMathFn fn, DType storage) {
  if (!hookable_unary(op))
    throw std::invalid_argument(std::string("ir::set_float_math: ") + op_name(op) +
                                " has no math hook");
  const int slot = storage == DType::kFloat32    ? 0
                   : storage == DType::kBFloat16 ? 1
                   : storage == DType::kFloat16  ? 2
                                                 : -1;
  if (slot < 0)
    throw std::invalid_argument(std::string("ir::set_float_math: storage dtype ") +
                                dtype_name(storage) + " is not float32, bfloat16 or float16");
  g_f32_unary[slot][static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_float_math2(Op op, VecMathFn2 fn) {
  if (op != Op::kPow)
    throw std::invalid_argument(std::string("ir::set_float_math2: ") + op_name(op) +
                                " has no math hook");
  g_f32_binary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_double_math(Op op, VecMathFnF64 fn) {
  if (!hookable_unary(op))
    throw std::invalid_argument(std::string("ir::set_double_math: ") + op_name(op) +
                                " has no math hook");
  g_f64_unary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_double_math2(Op op, VecMathFn2F64 fn) {
  if (op != Op::kPow)
    throw std::invalid_argument(std::string("ir::set_double_math2: ") + op_name(op) +
                                " has no math hook");
  g_f64_binary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}

}  // namespace openneuron::ir
