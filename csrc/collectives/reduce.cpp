// The element-wise reductions of the collectives: reduce_into() (two buffers) and reduce_many()
// (k buffers, one rounding), plus the dtype and op names. One loop template per (element type,
// op), written so GCC vectorizes it; bf16/f16 go through float32 with ir::numeric's
// branch-free round-to-nearest-even conversions. The algorithms that call these are in
// shm_comm.cpp.
#include "reduce.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ir/dtype.h"
#include "shm_comm.h"

namespace openneuron::collectives {
namespace {

namespace num = ir::numeric;

// Element kinds: the storage type and how values combine. Floating kinds compute in `value`.
struct Bool {
  using storage = uint8_t;
};
struct BFloat16 {
  using storage = uint16_t;
  static float load(uint16_t h) { return num::f32_from_bf16(h); }
  static uint16_t store(float f) { return num::bf16_from_f32(f); }
};
struct Float16 {
  using storage = uint16_t;
  static float load(uint16_t h) { return num::f32_from_f16(h); }
  static uint16_t store(float f) { return num::f16_from_f32(f); }
};
template <class T>
struct Plain {
  using storage = T;
};

template <class K>
constexpr bool kIsHalf = std::is_same_v<K, BFloat16> || std::is_same_v<K, Float16>;

// NOTE: min/max propagate NaN (as torch.minimum/maximum); the selects are written so GCC
// if-converts and vectorizes them.
template <ReduceOp Op, class T>
OPENNEURON_NUMERIC_INLINE T combine_float(T a, T b) {
  if constexpr (Op == ReduceOp::kSum) return a + b;
  if constexpr (Op == ReduceOp::kProduct) return a * b;
  if constexpr (Op == ReduceOp::kMin) return (b < a || b != b) ? b : a;
  if constexpr (Op == ReduceOp::kMax) return (b > a || b != b) ? b : a;
  return a;
}

// NOTE: sums and products run in an unsigned type at least as wide as int: signed overflow is
// UB, and uint8/uint16 operands would promote to (signed) int.
template <ReduceOp Op, class T>
OPENNEURON_NUMERIC_INLINE T combine_int(T a, T b) {
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  if constexpr (Op == ReduceOp::kSum) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  if constexpr (Op == ReduceOp::kProduct) {
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  }
  if constexpr (Op == ReduceOp::kMin) return b < a ? b : a;
  if constexpr (Op == ReduceOp::kMax) return b > a ? b : a;
  if constexpr (Op == ReduceOp::kBand) return a & b;
  if constexpr (Op == ReduceOp::kBor) return a | b;
  if constexpr (Op == ReduceOp::kBxor) return a ^ b;
  return a;
}

// bool: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = xor; results are 0 or 1.
template <ReduceOp Op>
OPENNEURON_NUMERIC_INLINE uint8_t combine_bool(uint8_t a, uint8_t b) {
  const uint8_t x = a != 0, y = b != 0;
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kMax || Op == ReduceOp::kBor) {
    return x | y;
  }
  if constexpr (Op == ReduceOp::kBxor) return x ^ y;
  return x & y;
}

template <class K, ReduceOp Op>
OPENNEURON_NUMERIC_INLINE typename K::storage combine(typename K::storage a,
                                                      typename K::storage b) {
  using S = typename K::storage;
  if constexpr (std::is_same_v<K, Bool>) {
    return combine_bool<Op>(a, b);
  } else if constexpr (kIsHalf<K>) {
    return K::store(combine_float<Op>(K::load(a), K::load(b)));
  } else if constexpr (std::is_floating_point_v<S>) {
    return combine_float<Op>(a, b);
  } else {
    return combine_int<Op>(a, b);
  }
}

template <class K, ReduceOp Op>
void reduce_loop(void* a, const void* b, size_t n) {
  using S = typename K::storage;
  S* x = static_cast<S*>(a);
  const S* y = static_cast<const S*>(b);
  for (size_t i = 0; i < n; ++i) x[i] = combine<K, Op>(x[i], y[i]);
}

// bf16/f16 across k inputs: accumulate a tile in float32, round once.
constexpr size_t kTileElems = 2048;

template <class K, ReduceOp Op>
void reduce_many_half(void* out, const void* const* ins, int k, size_t n) {
  alignas(64) float acc[kTileElems];
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t base = 0; base < n; base += kTileElems) {
    const size_t m = n - base < kTileElems ? n - base : kTileElems;
    const uint16_t* in0 = static_cast<const uint16_t*>(ins[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = K::load(in0[i]);
    for (int r = 1; r < k; ++r) {
      const uint16_t* in = static_cast<const uint16_t*>(ins[r]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = combine_float<Op>(acc[i], K::load(in[i]));
    }
    for (size_t i = 0; i < m; ++i) o[base + i] = K::store(acc[i]);
  }
}

// Other kinds: combine into a tile (so that out may alias an input), then copy it out.
template <class K, ReduceOp Op>
void reduce_many_plain(void* out, const void* const* ins, int k, size_t n) {
  using S = typename K::storage;
  constexpr size_t kElems = kTileElems * sizeof(float) / sizeof(S);
  alignas(64) S tile[kElems];
  for (size_t base = 0; base < n; base += kElems) {
    const size_t m = n - base < kElems ? n - base : kElems;
    std::memcpy(tile, static_cast<const S*>(ins[0]) + base, m * sizeof(S));
    for (int r = 1; r < k; ++r) reduce_loop<K, Op>(tile, static_cast<const S*>(ins[r]) + base, m);
    std::memcpy(static_cast<S*>(out) + base, tile, m * sizeof(S));
  }
}

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<Kind>{}) for dt.
template <class F>
void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32:
      return f(Tag<Plain<float>>{});
    case DType::kFloat64:
      return f(Tag<Plain<double>>{});
    case DType::kBFloat16:
      return f(Tag<BFloat16>{});
    case DType::kFloat16:
      return f(Tag<Float16>{});
    case DType::kInt8:
      return f(Tag<Plain<int8_t>>{});
    case DType::kUInt8:
      return f(Tag<Plain<uint8_t>>{});
    case DType::kInt16:
      return f(Tag<Plain<int16_t>>{});
    case DType::kInt32:
      return f(Tag<Plain<int32_t>>{});
    case DType::kInt64:
      return f(Tag<Plain<int64_t>>{});
    case DType::kBool:
      return f(Tag<Bool>{});
  }
  throw std::invalid_argument("neuron collectives: unknown dtype " +
                              std::to_string(static_cast<int>(dt)));
}

template <ReduceOp Op>
using OpTag = std::integral_constant<ReduceOp, Op>;

// Calls f(OpTag<op>{}).
template <class F>
void dispatch_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum:
      return f(OpTag<ReduceOp::kSum>{});
    case ReduceOp::kProduct:
      return f(OpTag<ReduceOp::kProduct>{});
    case ReduceOp::kMin:
      return f(OpTag<ReduceOp::kMin>{});
    case ReduceOp::kMax:
      return f(OpTag<ReduceOp::kMax>{});
    case ReduceOp::kBand:
      return f(OpTag<ReduceOp::kBand>{});
    case ReduceOp::kBor:
      return f(OpTag<ReduceOp::kBor>{});
    case ReduceOp::kBxor:
      return f(OpTag<ReduceOp::kBxor>{});
  }
  throw std::invalid_argument("neuron collectives: unknown reduce op " +
                              std::to_string(static_cast<int>(op)));
}

void check_valid(DType dt, ReduceOp op) {
  if (!reduce_op_valid(dt, op)) {
    throw std::invalid_argument(std::string("neuron collectives: reduce op ") + reduce_op_name(op) +
                                " is not defined for " + dtype_name(dt) +
                                " (bitwise ops take integer and bool dtypes)");
  }
}

bool is_floating(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kBFloat16 ||
         dt == DType::kFloat16;
}

}  // namespace

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
    case DType::kInt16:
      return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "unknown-dtype";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
  }
  return "unknown-op";
}

bool reduce_op_valid(DType dt, ReduceOp op) {
  if (dtype_size(dt) == 0 || static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::kBxor)) {
    return false;
  }
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  return !(bitwise && is_floating(dt));
}

void reduce_into(void* a, const void* b, size_t n, DType dt, ReduceOp op) {
  check_valid(dt, op);
  dispatch_dtype(dt, [&](auto kind) {
    using K = typename decltype(kind)::type;
    dispatch_op(op, [&](auto o) {
      if constexpr (!kIsHalf<K> && !std::is_floating_point_v<typename K::storage>) {
        reduce_loop<K, decltype(o)::value>(a, b, n);
      } else if constexpr (decltype(o)::value <= ReduceOp::kMax) {
        reduce_loop<K, decltype(o)::value>(a, b, n);
      }
    });
  });
}

void reduce_many(void* out, const void* const* ins, int k, size_t n, DType dt, ReduceOp op) {
  check_valid(dt, op);
  if (k == 1) {
    if (out != ins[0]) std::memmove(out, ins[0], n * dtype_size(dt));
    return;
  }
  dispatch_dtype(dt, [&](auto kind) {
    using K = typename decltype(kind)::type;
    dispatch_op(op, [&](auto o) {
      constexpr ReduceOp kOp = decltype(o)::value;
      if constexpr (kIsHalf<K>) {
        if constexpr (kOp <= ReduceOp::kMax) reduce_many_half<K, kOp>(out, ins, k, n);
      } else if constexpr (std::is_floating_point_v<typename K::storage>) {
        if constexpr (kOp <= ReduceOp::kMax) reduce_many_plain<K, kOp>(out, ins, k, n);
      } else {
        reduce_many_plain<K, kOp>(out, ins, k, n);
      }
    });
  });
}

}  // namespace openneuron::collectives
