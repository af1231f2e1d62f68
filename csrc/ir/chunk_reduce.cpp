// The interpreter's reduction accumulators (see program.h): combine, identities, lane-wise
// partial accumulation and its finish, plus constant fills and bf16/f16 rounding of a buffer.
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

namespace openneuron::ir::detail {

// --- reductions -----------------------------------------------------------------------------

template <class T>
OPENNEURON_IR_INLINE T combine(Op op, T acc, T v) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case Op::kSum:
        return acc + v;
      case Op::kProd:
        return acc * v;
      case Op::kAmax:
        return (v != v || v > acc) ? v : acc;
      default:
        return (v != v || v < acc) ? v : acc;
    }
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return op == Op::kAmax ? T(acc | v) : T(acc & v);
  } else {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case Op::kSum:
        return T(U(acc) + U(v));
      case Op::kProd:
        return T(U(acc) * U(v));
      case Op::kAmax:
        return v > acc ? v : acc;
      default:
        return v < acc ? v : acc;
    }
  }
}

template <class T>
T identity(Op op) {
  switch (op) {
    case Op::kSum:
      return T(0);
    case Op::kProd:
      return T(1);
    case Op::kAmax:
      if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
      return std::numeric_limits<T>::lowest();
    default:
      if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
      return std::numeric_limits<T>::max();
  }
}

template <class T, class F>
OPENNEURON_IR_INLINE void acc_loop(T* __restrict acc, const T* __restrict v, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], v[i]);
}

// acc[i] = acc[i] (op) v[i], elementwise (mode B), or into kLanes lanes (mode A).
template <class T>
OPENNEURON_IR_INLINE void accumulate_t(Op op, bool lanes, void* accp, const void* vp, int64_t n) {
  T* acc = static_cast<T*>(accp);
  const T* v = static_cast<const T*>(vp);
  auto body = [&](auto f) {
    if (!lanes) {
      acc_loop(acc, v, n, f);
      return;
    }
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) acc_loop(acc, v + i, kLanes, f);
    acc_loop(acc, v + i, n - i, f);
  };
  switch (op) {
    case Op::kSum:
      body([](T x, T y) { return combine(Op::kSum, x, y); });
      break;
    case Op::kProd:
      body([](T x, T y) { return combine(Op::kProd, x, y); });
      break;
    case Op::kAmax:
      body([](T x, T y) { return combine(Op::kAmax, x, y); });
      break;
    default:
      body([](T x, T y) { return combine(Op::kAmin, x, y); });
      break;
  }
}

OPENNEURON_ISA_BODY void accumulate_body(Kind kind, Op op, bool lanes, void* acc, const void* v,
                                         int64_t n) {
  switch (kind) {
    case Kind::kF32:
      accumulate_t<float>(op, lanes, acc, v, n);
      break;
    case Kind::kF64:
      accumulate_t<double>(op, lanes, acc, v, n);
      break;
    case Kind::kI32:
      accumulate_t<int32_t>(op, lanes, acc, v, n);
      break;
    case Kind::kI64:
      accumulate_t<int64_t>(op, lanes, acc, v, n);
      break;
    case Kind::kB8:
      accumulate_t<uint8_t>(op, lanes, acc, v, n);
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, accumulate,
                        (Kind kind, Op op, bool lanes, void* acc, const void* v, int64_t n),
                        (kind, op, lanes, acc, v, n))

template <class T>
void fill_identity_t(Op op, void* acc, int64_t n) {
  T id = identity<T>(op);
  std::fill(static_cast<T*>(acc), static_cast<T*>(acc) + n, id);
}
void fill_identity(Kind kind, Op op, void* acc, int64_t n) {
  switch (kind) {
    case Kind::kF32:
      fill_identity_t<float>(op, acc, n);
      break;
    case Kind::kF64:
      fill_identity_t<double>(op, acc, n);
      break;
    case Kind::kI32:
      fill_identity_t<int32_t>(op, acc, n);
      break;
    case Kind::kI64:
      fill_identity_t<int64_t>(op, acc, n);
      break;
    case Kind::kB8:
      fill_identity_t<uint8_t>(op, acc, n);
      break;
  }
}

// Tree-combines kLanes lanes into out[index] (in the same kind).
template <class T>
void finish_lanes_t(Op op, void* lanes, void* out, int64_t index) {
  T* l = static_cast<T*>(lanes);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] = combine(op, l[i], l[i + w]);
  static_cast<T*>(out)[index] = l[0];
}
void finish_lanes(Kind kind, Op op, void* lanes, void* out, int64_t index) {
  switch (kind) {
    case Kind::kF32:
      finish_lanes_t<float>(op, lanes, out, index);
      break;
    case Kind::kF64:
      finish_lanes_t<double>(op, lanes, out, index);
      break;
    case Kind::kI32:
      finish_lanes_t<int32_t>(op, lanes, out, index);
      break;
    case Kind::kI64:
      finish_lanes_t<int64_t>(op, lanes, out, index);
      break;
    case Kind::kB8:
      finish_lanes_t<uint8_t>(op, lanes, out, index);
      break;
  }
}

void round_buffer(DType dt, void* buf, int64_t n) {
  float* y = static_cast<float*>(buf);
  if (dt == DType::kBFloat16)
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_bf16(y[i]);
  else if (dt == DType::kFloat16)
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_f16(y[i]);
}

template <class T>
void fill_constant_t(const Node& n, void* dst, int64_t count) {
  T v = dtype_is_floating(n.dtype) ? static_cast<T>(n.constant_double())
                                   : static_cast<T>(n.constant_int());
  std::fill(static_cast<T*>(dst), static_cast<T*>(dst) + count, v);
}
void fill_constant(const Node& n, void* dst, int64_t count) {
  switch (kind_of(n.dtype)) {
    case Kind::kF32:
      fill_constant_t<float>(n, dst, count);
      break;
    case Kind::kF64:
      fill_constant_t<double>(n, dst, count);
      break;
    case Kind::kI32:
      fill_constant_t<int32_t>(n, dst, count);
      break;
    case Kind::kI64:
      fill_constant_t<int64_t>(n, dst, count);
      break;
    case Kind::kB8:
      fill_constant_t<uint8_t>(n, dst, count);
      break;
  }
}

}  // namespace openneuron::ir::detail
