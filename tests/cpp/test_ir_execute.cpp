// The kernel IR interpreter against a scalar reference that evaluates every element on its own
// (multi-index walk, one node at a time, rounding per dtype with frexp-based code independent of
// csrc/ir/numeric.h). Covers all dtypes, broadcasting, arbitrary/negative strides, reductions,
// odd/empty/0-d sizes, per-intermediate bf16/fp16 rounding, the parallel backend and math hooks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"
#include "runtime/parallel.h"

namespace openneuron::ir {
namespace {

// --- reference numerics ---------------------------------------------------------------------

// Rounds x (exactly a float) to a binary format with p significand bits, smallest normal
// exponent emin_e (x >= 2^(emin_e - 1) is normal) and largest finite value max_finite.
double round_format(double x, int p, int emin_e, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);
  double quantum = std::ldexp(1.0, std::max(e, emin_e) - p);
  double r = std::nearbyint(x / quantum) * quantum;
  if (std::fabs(r) > max_finite) return std::copysign(INFINITY, x);
  return r;
}
double ref_round(DType dt, double x) {
  switch (dt) {
    case DType::kBFloat16:
      return round_format(x, 8, -125, 0x1.FEp127);
    case DType::kFloat16:
      return round_format(x, 11, -13, 65504.0);
    case DType::kFloat32:
      return static_cast<float>(x);
    default:
      return x;
  }
}

bool is_float(DType dt) { return dtype_is_floating(dt); }

struct V {
  double f = 0;
  int64_t i = 0;
};

int64_t wrap(DType dt, int64_t v) {
  if (dt == DType::kInt32) return static_cast<int32_t>(static_cast<uint32_t>(v));
  if (dt == DType::kBool) return v != 0;
  return v;
}

template <class T>
T ref_float_unary(Op op, T x) {
  switch (op) {
    case Op::kNeg:
      return -x;
    case Op::kAbs:
      return std::fabs(x);
    case Op::kSign:
      return T(x > 0) - T(x < 0);
    case Op::kReciprocal:
      return T(1) / x;
    case Op::kExp:
      return std::exp(x);
    case Op::kExp2:
      return std::exp2(x);
    case Op::kExpm1:
      return std::expm1(x);
    case Op::kLog:
      return std::log(x);
    case Op::kLog2:
      return std::log2(x);
    case Op::kLog10:
      return std::log10(x);
    case Op::kLog1p:
      return std::log1p(x);
    case Op::kSqrt:
      return std::sqrt(x);
    case Op::kRsqrt:
      return T(1) / std::sqrt(x);
    case Op::kSin:
      return std::sin(x);
    case Op::kCos:
      return std::cos(x);
    case Op::kTan:
      return std::tan(x);
    case Op::kAtan:
      return std::atan(x);
    case Op::kTanh:
      return std::tanh(x);
    case Op::kSigmoid:
      return T(1) / (T(1) + std::exp(-x));
    case Op::kErf:
      return std::erf(x);
    case Op::kErfc:
      return std::erfc(x);
    case Op::kFloor:
      return std::floor(x);
    case Op::kCeil:
      return std::ceil(x);
    case Op::kTrunc:
      return std::trunc(x);
    case Op::kRound:
      return std::nearbyint(x);
    default:
      ADD_FAILURE() << "ref: unary " << op_name(op);
      return 0;
  }
}

template <class T>
T ref_float_binary(Op op, T a, T b) {
  switch (op) {
    case Op::kAdd:
      return a + b;
    case Op::kSub:
      return a - b;
    case Op::kMul:
      return a * b;
    case Op::kDiv:
      return a / b;
    case Op::kMax:
      return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b);
    case Op::kMin:
      return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b);
    case Op::kPow:
      return std::pow(a, b);
    case Op::kRemainder: {
      T m = std::fmod(a, b);
      return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
    }
    case Op::kFloorDiv: {
      if (b == 0) return a / b;
      T m = std::fmod(a, b);
      T d = (a - m) / b;
      if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
      if (d == 0) return std::copysign(T(0), a / b);
      T fl = std::floor(d);
      return d - fl > T(0.5) ? fl + 1 : fl;
    }
    default:
      ADD_FAILURE() << "ref: binary " << op_name(op);
      return 0;
  }
}

int64_t ref_int_binary(Op op, DType dt, int64_t a, int64_t b) {
  int64_t lo = dt == DType::kInt32 ? std::numeric_limits<int32_t>::min()
                                   : std::numeric_limits<int64_t>::min();
  auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  switch (op) {
    case Op::kAdd:
      return wrap(dt, static_cast<int64_t>(u(a) + u(b)));
    case Op::kSub:
      return wrap(dt, static_cast<int64_t>(u(a) - u(b)));
    case Op::kMul:
      return wrap(dt, static_cast<int64_t>(u(a) * u(b)));
    case Op::kDiv:
      return b == 0 ? 0 : (a == lo && b == -1) ? lo : a / b;
    case Op::kRemainder: {
      if (b == 0 || b == -1) return 0;
      int64_t r = a % b;
      return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
    }
    case Op::kFloorDiv: {
      if (b == 0) return 0;
      if (a == lo && b == -1) return lo;
      int64_t q = a / b;
      return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
    case Op::kMax:
      return std::max(a, b);
    case Op::kMin:
      return std::min(a, b);
    case Op::kPow: {
      if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
      uint64_t r = 1;
      for (int64_t j = 0; j < b; ++j) r *= u(a);
      return wrap(dt, static_cast<int64_t>(r));
    }
    case Op::kBitAnd:
      return a & b;
    case Op::kBitOr:
      return a | b;
    case Op::kBitXor:
      return a ^ b;
    default:
      ADD_FAILURE() << "ref: int binary " << op_name(op);
      return 0;
  }
}

int64_t ref_float_to_int(double x, DType dt) {
  double lim = dt == DType::kInt32 ? 2147483648.0 : 9223372036854775808.0;
  if (!(x >= -lim && x < lim))
    return dt == DType::kInt32 ? std::numeric_limits<int32_t>::min()
                               : std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(x);
}

// --- operands -------------------------------------------------------------------------------

struct Buf {
  DType dt;
  std::vector<int64_t> strides;
  std::vector<unsigned char> mem;
  int64_t offset = 0;  // element offset of index 0
  char* data() { return reinterpret_cast<char*>(mem.data()) + offset * dtype_size(dt); }
};

Buf make_buf(DType dt, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  Buf b;
  b.dt = dt;
  b.strides = strides;
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) continue;
    int64_t ext = (sizes[d] - 1) * strides[d];
    (ext < 0 ? lo : hi) += ext;
  }
  b.offset = -lo;
  b.mem.assign((hi - lo + 1) * dtype_size(dt), 0xAB);  // canary pattern
  return b;
}

// Row-major contiguous strides (a broadcast dim gets stride 0 if listed in bcast).
std::vector<int64_t> contiguous(const std::vector<int64_t>& sizes, uint64_t bcast = 0) {
  std::vector<int64_t> st(sizes.size());
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    st[d] = (bcast >> d & 1) ? 0 : s;
    if (!(bcast >> d & 1)) s *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

void write_elem(Buf& b, int64_t off, V v) {
  char* p = b.data() + off * static_cast<int64_t>(dtype_size(b.dt));
  switch (b.dt) {
    case DType::kFloat32: {
      float f = static_cast<float>(v.f);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(p, &v.f, 8);
      break;
    case DType::kBFloat16:
    case DType::kFloat16: {
      // v.f is exactly representable: encode by searching the 16-bit pattern space lazily.
      float f = static_cast<float>(v.f);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h;
      if (b.dt == DType::kBFloat16) {
        h = std::isnan(f) ? 0x7FC0 : static_cast<uint16_t>(u >> 16);
      } else {
        // Half encode for exactly representable values.
        uint16_t sign = (u >> 16) & 0x8000;
        double a = std::fabs(v.f);
        if (std::isnan(v.f))
          h = 0x7E00;
        else if (std::isinf(a))
          h = sign | 0x7C00;
        else if (a < std::ldexp(1.0, -14))
          h = sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24));
        else {
          int e;
          double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
          h = sign | static_cast<uint16_t>((e + 14) << 10) |
              static_cast<uint16_t>((m * 2 - 1) * 1024);
        }
      }
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kInt32: {
      int32_t x = static_cast<int32_t>(v.i);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kInt64:
      std::memcpy(p, &v.i, 8);
      break;
    case DType::kBool:
      *reinterpret_cast<uint8_t*>(p) = v.i != 0;
      break;
  }
}

V read_elem(const Buf& b, int64_t off) {
  const char* p = reinterpret_cast<const char*>(b.mem.data()) +
                  (b.offset + off) * static_cast<int64_t>(dtype_size(b.dt));
  V v;
  switch (b.dt) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      v.f = f;
      break;
    }
    case DType::kFloat64:
      std::memcpy(&v.f, p, 8);
      break;
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      v.f = f;
      break;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      int e = (h >> 10) & 0x1F, m = h & 0x3FF;
      double a = e == 0    ? std::ldexp(m, -24)
                 : e == 31 ? (m ? NAN : INFINITY)
                           : std::ldexp(1024 + m, e - 25);
      v.f = (h & 0x8000) ? -a : a;
      break;
    }
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case DType::kInt64:
      std::memcpy(&v.i, p, 8);
      break;
    case DType::kBool:
      v.i = *reinterpret_cast<const uint8_t*>(p) != 0;
      break;
  }
  return v;
}

int64_t offset_of(const Buf& b, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * b.strides[d];
  return off;
}

// Calls f(idx) for every index of sizes (row-major).
void for_each_index(const std::vector<int64_t>& sizes,
                    const std::function<void(std::vector<int64_t>&)>& f) {
  for (int64_t s : sizes)
    if (s == 0) return;
  std::vector<int64_t> idx(sizes.size(), 0);
  while (true) {
    f(idx);
    int d = static_cast<int>(sizes.size()) - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

enum class Fill { kDyadic, kSpecial, kPositive, kSmallInt, kWideInt };

void fill_random(Buf& b, const std::vector<int64_t>& sizes, std::mt19937& rng, Fill fill) {
  std::uniform_int_distribution<int> q(-16, 16);
  std::uniform_int_distribution<int> pick(0, 15);
  const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 1e-30, 65504.0, 70000.0};
  for_each_index(sizes, [&](std::vector<int64_t>& idx) {
    V v;
    if (is_float(b.dt)) {
      v.f = q(rng) / 4.0;
      if (fill == Fill::kPositive) v.f = std::fabs(v.f) + 0.25;
      if (fill == Fill::kSpecial && pick(rng) == 0) v.f = specials[pick(rng) % 8];
      if (fill == Fill::kSpecial && pick(rng) == 1) v.f = q(rng) / 3.0 + 0.001 * q(rng);
      v.f = ref_round(b.dt, v.f);
    } else if (b.dt == DType::kBool) {
      v.i = pick(rng) & 1;
    } else {
      v.i = q(rng);
      if (fill == Fill::kWideInt && pick(rng) < 3)
        v.i = static_cast<int64_t>(rng()) * (b.dt == DType::kInt64 ? int64_t{1} << 31 : 1);
      if (fill == Fill::kPositive) v.i = std::abs(v.i) + 1;
      v.i = wrap(b.dt, v.i);
    }
    write_elem(b, offset_of(b, idx), v);
  });
}

// --- the reference evaluator ----------------------------------------------------------------

struct Ref {
  const Kernel& k;
  std::vector<int64_t> sizes;
  std::vector<Buf>& in;

  V op(const Node& n, const V* a) {
    DType adt = n.args[0] >= 0 ? k.node(n.args[n.op == Op::kWhere ? 1 : 0]).dtype : n.dtype;
    V r;
    if (n.op == Op::kCast) {
      DType s = k.node(n.args[0]).dtype;
      if (n.dtype == DType::kBool) {
        r.i = is_float(s) ? (a[0].f != 0) : (a[0].i != 0);
      } else if (is_float(n.dtype)) {
        double x = is_float(s) ? a[0].f : static_cast<double>(a[0].i);
        if (!is_float(s))
          x = n.dtype == DType::kFloat64 ? static_cast<double>(a[0].i) : static_cast<float>(a[0].i);
        if (n.dtype != DType::kFloat64) x = static_cast<float>(x);
        r.f = ref_round(n.dtype, x);
      } else {
        r.i = is_float(s) ? ref_float_to_int(a[0].f, n.dtype) : wrap(n.dtype, a[0].i);
      }
      return r;
    }
    switch (n.op) {
      case Op::kEq:
      case Op::kNe:
      case Op::kLt:
      case Op::kLe:
      case Op::kGt:
      case Op::kGe: {
        bool f = is_float(adt);
        double x = f ? a[0].f : a[0].i, y = f ? a[1].f : a[1].i;
        if (!f && adt == DType::kInt64) {  // exact int64 compare
          int64_t xi = a[0].i, yi = a[1].i;
          r.i = n.op == Op::kEq   ? xi == yi
                : n.op == Op::kNe ? xi != yi
                : n.op == Op::kLt ? xi < yi
                : n.op == Op::kLe ? xi <= yi
                : n.op == Op::kGt ? xi > yi
                                  : xi >= yi;
          return r;
        }
        r.i = n.op == Op::kEq   ? x == y
              : n.op == Op::kNe ? x != y
              : n.op == Op::kLt ? x < y
              : n.op == Op::kLe ? x <= y
              : n.op == Op::kGt ? x > y
                                : x >= y;
        return r;
      }
      case Op::kLogicalAnd:
      case Op::kLogicalOr:
      case Op::kLogicalXor: {
        bool f = is_float(adt);
        bool x = f ? a[0].f != 0 : a[0].i != 0, y = f ? a[1].f != 0 : a[1].i != 0;
        r.i = n.op == Op::kLogicalAnd ? (x && y) : n.op == Op::kLogicalOr ? (x || y) : (x != y);
        return r;
      }
      case Op::kLogicalNot:
        r.i = is_float(adt) ? a[0].f == 0 : a[0].i == 0;
        return r;
      case Op::kIsNan:
        r.i = std::isnan(a[0].f);
        return r;
      case Op::kWhere:
        return a[0].i ? a[1] : a[2];
      default:
        break;
    }
    if (n.dtype == DType::kFloat64) {
      if (n.op == Op::kFma)
        r.f = std::fma(a[0].f, a[1].f, a[2].f);
      else if (op_arity(n.op) == 2)
        r.f = ref_float_binary<double>(n.op, a[0].f, a[1].f);
      else
        r.f = ref_float_unary<double>(n.op, a[0].f);
      return r;
    }
    if (is_float(n.dtype)) {
      float x = static_cast<float>(a[0].f);
      float y = static_cast<float>(a[1].f);
      float res;
      if (n.op == Op::kFma)
        res = std::fma(x, y, static_cast<float>(a[2].f));
      else if (op_arity(n.op) == 2)
        res = ref_float_binary<float>(n.op, x, y);
      else
        res = ref_float_unary<float>(n.op, x);
      r.f = ref_round(n.dtype, res);
      return r;
    }
    if (n.dtype == DType::kBool) {
      int64_t x = a[0].i, y = a[1].i;
      switch (n.op) {
        case Op::kMax:
        case Op::kBitOr:
          r.i = x | y;
          break;
        case Op::kMin:
        case Op::kBitAnd:
          r.i = x & y;
          break;
        case Op::kBitXor:
          r.i = x ^ y;
          break;
        case Op::kBitNot:
          r.i = !x;
          break;
        default:
          ADD_FAILURE() << "ref: bool " << op_name(n.op);
      }
      return r;
    }
    auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    switch (n.op) {
      case Op::kNeg:
        r.i = wrap(n.dtype, static_cast<int64_t>(0 - u(a[0].i)));
        break;
      case Op::kAbs:
        r.i = a[0].i < 0 ? wrap(n.dtype, static_cast<int64_t>(0 - u(a[0].i))) : a[0].i;
        break;
      case Op::kSign:
        r.i = (a[0].i > 0) - (a[0].i < 0);
        break;
      case Op::kBitNot:
        r.i = ~a[0].i;
        break;
      case Op::kFma:
        r.i = wrap(n.dtype, static_cast<int64_t>(u(a[0].i) * u(a[1].i) + u(a[2].i)));
        break;
      default:
        r.i = ref_int_binary(n.op, n.dtype, a[0].i, a[1].i);
    }
    return r;
  }

  V eval(ValueId v, std::vector<int64_t>& idx, std::map<ValueId, V>& memo) {
    auto it = memo.find(v);
    if (it != memo.end()) return it->second;
    const Node& n = k.node(v);
    V r;
    if (n.op == Op::kLoad) {
      r = read_elem(in[n.index], offset_of(in[n.index], idx));
    } else if (n.op == Op::kConstant) {
      if (is_float(n.dtype))
        r.f = n.constant_double();
      else
        r.i = n.constant_int();
    } else if (op_is_reduction(n.op)) {
      r = reduce(n, idx);
    } else {
      V a[3];
      for (int j = 0; j < 3; ++j)
        if (n.args[j] >= 0) a[j] = eval(n.args[j], idx, memo);
      r = op(n, a);
    }
    memo[v] = r;
    return r;
  }

  V reduce(const Node& n, const std::vector<int64_t>& at) {
    uint64_t mask = n.payload;
    std::vector<int64_t> rs;
    std::vector<int> rd;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (mask >> d & 1) {
        rs.push_back(sizes[d]);
        rd.push_back(static_cast<int>(d));
      }
    DType dt = n.dtype;
    double facc = n.op == Op::kSum    ? 0
                  : n.op == Op::kProd ? 1
                  : n.op == Op::kAmax ? -INFINITY
                                      : INFINITY;
    int64_t lo = dt == DType::kInt32 ? std::numeric_limits<int32_t>::min()
                                     : std::numeric_limits<int64_t>::min();
    int64_t hi = dt == DType::kInt32 ? std::numeric_limits<int32_t>::max()
                                     : std::numeric_limits<int64_t>::max();
    if (dt == DType::kBool) {
      lo = 0;
      hi = 1;
    }
    int64_t iacc = n.op == Op::kSum ? 0 : n.op == Op::kProd ? 1 : n.op == Op::kAmax ? lo : hi;
    std::vector<int64_t> idx = at;
    for_each_index(rs, [&](std::vector<int64_t>& ri) {
      for (size_t j = 0; j < rd.size(); ++j) idx[rd[j]] = ri[j];
      std::map<ValueId, V> memo;
      V x = eval(n.args[0], idx, memo);
      if (is_float(dt)) {
        double y = x.f;
        if (n.op == Op::kSum)
          facc += y;
        else if (n.op == Op::kProd)
          facc *= y;
        else if (std::isnan(y) || std::isnan(facc))
          facc = NAN;
        else
          facc = n.op == Op::kAmax ? std::max(facc, y) : std::min(facc, y);
        if (dt != DType::kFloat64) facc = static_cast<float>(facc);
      } else {
        auto u = [](int64_t z) { return static_cast<uint64_t>(z); };
        if (n.op == Op::kSum)
          iacc = wrap(dt, static_cast<int64_t>(u(iacc) + u(x.i)));
        else if (n.op == Op::kProd)
          iacc = wrap(dt, static_cast<int64_t>(u(iacc) * u(x.i)));
        else
          iacc = n.op == Op::kAmax ? std::max(iacc, x.i) : std::min(iacc, x.i);
      }
    });
    V r;
    if (is_float(dt))
      r.f = ref_round(dt, facc);
    else
      r.i = iacc;
    return r;
  }
};

struct Layout {
  std::vector<int64_t> strides;  // empty: contiguous
};

bool same_bits(const Buf& a, const Buf& b, int64_t off, std::string* why, double rtol) {
  V x = read_elem(a, off), y = read_elem(b, off);
  if (is_float(a.dt)) {
    if (std::isnan(x.f) && std::isnan(y.f)) return true;
    if (x.f == y.f && std::signbit(x.f) == std::signbit(y.f)) return true;
    if (rtol > 0 && std::fabs(x.f - y.f) <= rtol * std::fabs(y.f)) return true;
    char buf[128];
    std::snprintf(buf, sizeof(buf), "got %.9g want %.9g", x.f, y.f);
    *why = buf;
    return false;
  }
  if (x.i == y.i) return true;
  *why = "got " + std::to_string(x.i) + " want " + std::to_string(y.i);
  return false;
}

// Runs k over sizes with the given operand layouts (empty = contiguous), random inputs, and
// checks every output element bitwise against the reference. Returns the executed outputs.
std::vector<Buf> check(const Kernel& k, const std::vector<int64_t>& sizes,
                       std::vector<Layout> in_layouts = {}, std::vector<Layout> out_layouts = {},
                       Fill fill = Fill::kSpecial, uint32_t seed = 1, double rtol = 0) {
  int nd = static_cast<int>(sizes.size());
  uint64_t mask = k.reduce_mask();
  std::mt19937 rng(seed);
  in_layouts.resize(k.num_inputs());
  out_layouts.resize(k.num_outputs());
  std::vector<Buf> in, out, want;
  for (int i = 0; i < k.num_inputs(); ++i) {
    auto st = in_layouts[i].strides.empty() ? contiguous(sizes) : in_layouts[i].strides;
    in.push_back(make_buf(k.input_dtype(i), sizes, st));
    fill_random(in.back(), sizes, rng, fill);
  }
  for (int o = 0; o < k.num_outputs(); ++o) {
    bool red = k.is_reduced(k.output_value(o));
    auto st =
        out_layouts[o].strides.empty() ? contiguous(sizes, red ? mask : 0) : out_layouts[o].strides;
    out.push_back(make_buf(k.output_dtype(o), sizes, st));
    want.push_back(out.back());
  }
  std::vector<Operand> ins, outs;
  for (auto& b : in) ins.push_back({b.data(), b.strides.data()});
  for (auto& b : out) outs.push_back({b.data(), b.strides.data()});
  execute(k, sizes.data(), nd, ins.data(), outs.data());
  Ref ref{k, sizes, in};
  for (int o = 0; o < k.num_outputs(); ++o) {
    bool red = k.is_reduced(k.output_value(o));
    std::vector<int64_t> osz = sizes;
    if (red)
      for (int d = 0; d < nd; ++d)
        if (mask >> d & 1) osz[d] = 1;
    bool empty_red = false;
    if (red)
      for (int d = 0; d < nd; ++d) empty_red |= (mask >> d & 1) && sizes[d] == 0;
    if (empty_red)
      for (int d = 0; d < nd; ++d) osz[d] = (mask >> d & 1) ? 1 : sizes[d];
    int bad = 0;
    for_each_index(osz, [&](std::vector<int64_t>& idx) {
      std::map<ValueId, V> memo;
      V v = ref.eval(k.output_value(o), idx, memo);
      int64_t off = offset_of(want[o], idx);
      write_elem(want[o], off, v);
      std::string why;
      if (!same_bits(out[o], want[o], off, &why, rtol) && bad++ < 5) {
        std::string at;
        for (int64_t x : idx) at += std::to_string(x) + ",";
        ADD_FAILURE() << "output " << o << " at [" << at << "]: " << why << "\n" << k.to_text();
      }
    });
  }
  return out;
}

// --- kernels --------------------------------------------------------------------------------

std::shared_ptr<const Kernel> unary_kernel(Op op, DType dt) {
  KernelBuilder b;
  int x = b.add_input(dt);
  ValueId v = b.unary(op, b.load(x));
  b.store(b.add_output(b.dtype(v)), v);
  return b.build();
}

std::shared_ptr<const Kernel> binary_kernel(Op op, DType dt) {
  KernelBuilder b;
  int x = b.add_input(dt), y = b.add_input(dt);
  ValueId v = b.binary(op, b.load(x), b.load(y));
  b.store(b.add_output(b.dtype(v)), v);
  return b.build();
}

const DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                            DType::kInt32,   DType::kInt64,    DType::kBool};
const DType kFloatDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};

// --- tests ----------------------------------------------------------------------------------

TEST(IrExecute, UnaryOpsAllFloatDTypes) {
  const Op ops[] = {
      Op::kNeg,   Op::kAbs,  Op::kSign,  Op::kReciprocal, Op::kExp,     Op::kExp2,      Op::kExpm1,
      Op::kLog,   Op::kLog2, Op::kLog10, Op::kLog1p,      Op::kSqrt,    Op::kRsqrt,     Op::kSin,
      Op::kCos,   Op::kTan,  Op::kAtan,  Op::kTanh,       Op::kSigmoid, Op::kErf,       Op::kErfc,
      Op::kFloor, Op::kCeil, Op::kTrunc, Op::kRound,      Op::kIsNan,   Op::kLogicalNot};
  for (DType dt : kFloatDTypes)
    for (Op op : ops) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*unary_kernel(op, dt), {1031});
    }
}

TEST(IrExecute, BinaryOpsAllDTypes) {
  const Op float_ops[] = {Op::kAdd,        Op::kSub,       Op::kMul,       Op::kDiv,      Op::kMax,
                          Op::kMin,        Op::kPow,       Op::kRemainder, Op::kFloorDiv, Op::kEq,
                          Op::kNe,         Op::kLt,        Op::kLe,        Op::kGt,       Op::kGe,
                          Op::kLogicalAnd, Op::kLogicalOr, Op::kLogicalXor};
  const Op int_ops[] = {
      Op::kAdd,        Op::kSub,       Op::kMul,       Op::kDiv,    Op::kMax,   Op::kMin,
      Op::kPow,        Op::kRemainder, Op::kFloorDiv,  Op::kBitAnd, Op::kBitOr, Op::kBitXor,
      Op::kEq,         Op::kNe,        Op::kLt,        Op::kLe,     Op::kGt,    Op::kGe,
      Op::kLogicalAnd, Op::kLogicalOr, Op::kLogicalXor};
  const Op bool_ops[] = {Op::kMax, Op::kMin, Op::kBitAnd, Op::kBitOr,      Op::kBitXor,    Op::kEq,
                         Op::kNe,  Op::kLt,  Op::kGe,     Op::kLogicalAnd, Op::kLogicalXor};
  for (DType dt : kAllDTypes) {
    std::vector<Op> ops;
    if (is_float(dt))
      ops.assign(std::begin(float_ops), std::end(float_ops));
    else if (dt == DType::kBool)
      ops.assign(std::begin(bool_ops), std::end(bool_ops));
    else
      ops.assign(std::begin(int_ops), std::end(int_ops));
    for (Op op : ops) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*binary_kernel(op, dt), {3, 347}, {}, {}, Fill::kSpecial, 3);
      if (!is_float(dt) && dt != DType::kBool && op != Op::kPow)
        check(*binary_kernel(op, dt), {1000}, {}, {}, Fill::kWideInt, 4);
    }
  }
}

TEST(IrExecute, IntUnaryAndTernary) {
  for (DType dt : {DType::kInt32, DType::kInt64}) {
    for (Op op : {Op::kNeg, Op::kAbs, Op::kSign, Op::kBitNot, Op::kLogicalNot}) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*unary_kernel(op, dt), {777}, {}, {}, Fill::kWideInt);
    }
  }
  check(*unary_kernel(Op::kBitNot, DType::kBool), {77});
  check(*unary_kernel(Op::kLogicalNot, DType::kBool), {77});
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    KernelBuilder b;
    int c = b.add_input(DType::kBool), x = b.add_input(dt), y = b.add_input(dt);
    b.store(b.add_output(dt), b.where(b.load(c), b.load(x), b.load(y)));
    check(*b.build(), {5, 201});
    if (dt == DType::kBool) continue;
    KernelBuilder f;
    x = f.add_input(dt);
    y = f.add_input(dt);
    int z = f.add_input(dt);
    f.store(f.add_output(dt), f.fma(f.load(x), f.load(y), f.load(z)));
    check(*f.build(), {1100});
  }
}

TEST(IrExecute, CastsBetweenAllDTypes) {
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      if (from == to) continue;
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      KernelBuilder b;
      int x = b.add_input(from);
      ValueId v = b.load(x);
      if (is_float(from)) v = b.binary(Op::kMul, v, b.constant(1000.5, from));  // wide range
      b.store(b.add_output(to), b.cast(v, to));
      check(*b.build(), {1029}, {}, {}, is_float(from) ? Fill::kSpecial : Fill::kWideInt);
    }
}

// A chain of ops in each dtype: the typical fused elementwise kernel.
std::shared_ptr<const Kernel> chain_kernel(DType dt) {
  KernelBuilder b;
  int x = b.add_input(dt), y = b.add_input(dt);
  int o = b.add_output(dt), m = b.add_output(DType::kBool);
  ValueId vx = b.load(x), vy = b.load(y);
  ValueId r;
  if (dt == DType::kBool) {
    r = b.binary(Op::kBitXor, b.binary(Op::kMax, vx, vy), b.unary(Op::kBitNot, vy));
  } else {
    ValueId two = b.constant(2, dt);
    ValueId t = b.binary(Op::kAdd, b.binary(Op::kMul, vx, two), vy);
    t = b.binary(Op::kSub, b.binary(Op::kMax, t, vx), b.unary(Op::kAbs, vy));
    if (is_float(dt)) t = b.binary(Op::kMul, b.unary(Op::kTanh, t), b.unary(Op::kExp, vy));
    r = b.where(b.binary(Op::kGt, vx, vy), t, b.unary(Op::kNeg, vx));
  }
  b.store(o, r);
  b.store(m, b.binary(Op::kNe, r, vx));
  return b.build();
}

TEST(IrExecute, ChainsAllDTypesOddSizes) {
  for (DType dt : kAllDTypes)
    for (int64_t n : {1, 7, 1023, 1024, 1025, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      check(*chain_kernel(dt), {n});
    }
}

TEST(IrExecute, BroadcastingStrideZero) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    auto k = chain_kernel(dt);
    std::vector<int64_t> s = {37, 53};
    check(*k, s, {{{0, 1}}, {{1, 0}}});  // row vector, column vector
    check(*k, s, {{{0, 0}}, {}});        // scalar broadcast
    check(*k, {3, 5, 700}, {{{0, 700, 1}}, {{1, 0, 0}}});
    check(*k, {600, 3}, {{{0, 1}}, {}});  // short inner dim with broadcast
  }
}

TEST(IrExecute, ArbitraryAndNegativeStrides) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32}) {
    auto k = chain_kernel(dt);
    std::vector<int64_t> s = {41, 67};
    check(*k, s, {{{1, 41}}, {{-67, -1}}});                   // transposed, reversed
    check(*k, s, {{{134, 2}}, {{-1, 41}}}, {{{1, 41}}, {}});  // gaps, transposed output
    check(*k, s, {{{67, -1}}, {}}, {{{-67, 1}}, {{-1, -41}}});
    check(*k, {5, 4, 3, 2}, {{{1, 5, 20, 60}}, {{-24, 6, -2, 1}}});
  }
}

TEST(IrExecute, EmptyAndZeroDim) {
  auto k = chain_kernel(DType::kFloat32);
  check(*k, {});  // 0-d: one element
  check(*k, {0});
  check(*k, {5, 0, 3});
  // Nothing is written for an empty space.
  float out = 7.f;
  uint8_t m = 9;
  float in = 1.f;
  int64_t sz = 0, st = 1;
  Operand ins[2] = {{&in, &st}, {&in, &st}};
  Operand outs[2] = {{&out, &st}, {&m, &st}};
  execute(*k, &sz, 1, ins, outs);
  EXPECT_EQ(out, 7.f);
  EXPECT_EQ(m, 9);
}

std::shared_ptr<const Kernel> reduce_kernel(Op rop, DType dt, uint64_t mask, bool epilogue) {
  KernelBuilder b;
  int x = b.add_input(dt);
  ValueId v = b.load(x);
  if (dt != DType::kBool) v = b.binary(Op::kMul, v, v);
  if (is_float(dt)) v = b.binary(Op::kSub, v, b.constant(1.5, dt));
  ValueId r = b.reduce(rop, v, mask);
  int o = b.add_output(dt);
  if (epilogue && dt != DType::kBool) {
    int bias = b.add_input(dt);
    r = b.binary(Op::kAdd, b.binary(Op::kMul, r, b.constant(3, dt)), b.load(bias));
  }
  b.store(o, r);
  return b.build();
}

TEST(IrExecute, ReductionsOverAxes) {
  std::vector<int64_t> s = {5, 7, 9};
  for (DType dt : kAllDTypes)
    for (Op rop : {Op::kSum, Op::kProd, Op::kAmax, Op::kAmin}) {
      if (dt == DType::kBool && (rop == Op::kSum || rop == Op::kProd)) continue;
      for (uint64_t mask = 1; mask < 8; ++mask) {
        SCOPED_TRACE(std::string(op_name(rop)) + " " + dtype_name(dt) + " mask " +
                     std::to_string(mask));
        // Sums of dyadic values are exact in any order; products are not (relative tolerance:
        // the accumulation order differs from the reference's).
        Fill fill = Fill::kDyadic;
        double rtol = rop != Op::kProd || !is_float(dt) ? 0
                      : dt == DType::kFloat32           ? 1e-5
                      : dt == DType::kFloat64           ? 1e-13
                                                        : 1e-2;
        check(*reduce_kernel(rop, dt, mask, false), s, {}, {}, fill, 5, rtol);
        // Transposed input: the reduced dims move inside/outside.
        check(*reduce_kernel(rop, dt, mask, false), s, {{{1, 5, 35}}}, {}, fill, 6, rtol);
        // Epilogue with an input broadcast along the reduced axes.
        if (dt != DType::kBool)
          check(*reduce_kernel(rop, dt, mask, true), s, {{}, {contiguous(s, mask)}}, {}, fill, 7,
                rtol);
      }
    }
}

TEST(IrExecute, ReductionsLongAndOddExtents) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    for (int64_t n : {1, 7, 1023, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      check(*reduce_kernel(Op::kSum, dt, 1, false), {n}, {}, {}, Fill::kDyadic);
      check(*reduce_kernel(Op::kAmax, dt, 2, false), {3, n}, {}, {}, Fill::kSpecial);
      check(*reduce_kernel(Op::kSum, dt, 1, false), {n, 5}, {}, {}, Fill::kDyadic);
      check(*reduce_kernel(Op::kAmin, dt, 2, false), {n, 3}, {}, {}, Fill::kSpecial);
      check(*reduce_kernel(Op::kSum, dt, 0b101, true), {n, 3, 2},
            {{}, {contiguous({n, 3, 2}, 0b101)}}, {}, Fill::kDyadic);
    }
  }
  // Many short rows (a tile holds several rows) and a column reduction of a narrow matrix.
  check(*reduce_kernel(Op::kSum, DType::kFloat32, 2, false), {3000, 5}, {}, {}, Fill::kDyadic);
  check(*reduce_kernel(Op::kAmax, DType::kFloat16, 1, false), {3000, 3}, {}, {}, Fill::kSpecial);
  // Reduced + full-domain outputs together, several reductions sharing axes.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId v = b.binary(Op::kMul, b.load(x), b.constant(2.0, DType::kFloat32));
  b.store(b.add_output(DType::kFloat32), v);
  ValueId s = b.reduce(Op::kSum, v, 0b10);
  ValueId mx = b.reduce(Op::kAmax, v, 0b10);
  b.store(b.add_output(DType::kFloat32), b.binary(Op::kSub, mx, s));
  b.store(b.add_output(DType::kBool), b.binary(Op::kGt, mx, b.constant(1.0, DType::kFloat32)));
  auto k = b.build();
  check(*k, {33, 2050}, {}, {}, Fill::kDyadic);
  check(*k, {2050, 33}, {{{1, 2050}}}, {}, Fill::kDyadic);
}

TEST(IrExecute, ReductionOverEmptyAxesStoresIdentity) {
  for (Op rop : {Op::kSum, Op::kProd, Op::kAmax, Op::kAmin}) {
    KernelBuilder b;
    int x = b.add_input(DType::kFloat32);
    b.store(b.add_output(DType::kFloat32), b.reduce(rop, b.load(x), 0b10));
    auto k = b.build();
    std::vector<float> out(4, 42.f);
    float in = 0;
    int64_t sizes[2] = {4, 0};
    int64_t ist[2] = {0, 1}, ost[2] = {1, 0};
    Operand ins[1] = {{&in, ist}};
    Operand outs[1] = {{out.data(), ost}};
    execute(*k, sizes, 2, ins, outs);
    float want = rop == Op::kSum    ? 0.f
                 : rop == Op::kProd ? 1.f
                 : rop == Op::kAmax ? -INFINITY
                                    : INFINITY;
    for (float o : out) EXPECT_EQ(o, want) << op_name(rop);
  }
}

TEST(IrExecute, HalfPrecisionRoundsEveryIntermediate) {
  // (x + 1) - x with x = 2^p (p = significand bits): x + 1 is a tie that rounds to x, so the
  // stepwise result is 0; rounding only at the end would give 1.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    KernelBuilder b;
    int x = b.add_input(dt);
    ValueId vx = b.load(x);
    ValueId t = b.binary(Op::kAdd, vx, b.constant(1.0, dt));
    b.store(b.add_output(dt), b.binary(Op::kSub, t, vx));
    auto k = b.build();
    double big = dt == DType::kBFloat16 ? 256 : 2048;
    Buf in = make_buf(dt, {1}, {1});
    Buf out = make_buf(dt, {1}, {1});
    write_elem(in, 0, V{big, 0});
    int64_t sz = 1;
    Operand ins[1] = {{in.data(), in.strides.data()}};
    Operand outs[1] = {{out.data(), out.strides.data()}};
    execute(*k, &sz, 1, ins, outs);
    double once = ref_round(dt, (big + 1) - big);
    double stepwise = ref_round(dt, ref_round(dt, big + 1) - big);
    EXPECT_EQ(once, 1.0);
    EXPECT_EQ(stepwise, 0.0);
    EXPECT_EQ(read_elem(out, 0).f, stepwise) << dtype_name(dt);
    check(*k, {4099}, {}, {}, Fill::kSpecial);
  }
  // bf16 sum accumulates in float and rounds once at the end.
  KernelBuilder b;
  int x = b.add_input(DType::kBFloat16);
  b.store(b.add_output(DType::kBFloat16), b.reduce(Op::kSum, b.load(x), 1));
  auto k = b.build();
  std::vector<uint16_t> ones(300, 0x3F80);  // 1.0
  uint16_t out = 0;
  int64_t sz = 300, st = 1, ost = 0;
  Operand ins[1] = {{ones.data(), &st}};
  Operand outs[1] = {{&out, &ost}};
  execute(*k, &sz, 1, ins, outs);
  EXPECT_EQ(out, 0x4396);  // 300 exactly (bf16 sums would stall at 256)
}

TEST(IrExecute, ParallelBackendMatchesSerial) {
  runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body, void* ctx) {
        int64_t mid = begin + std::max(grain, (end - begin) / 2);
        if (mid >= end) {
          body(ctx, begin, end);
          return;
        }
        std::thread t([&] { body(ctx, begin, mid); });
        body(ctx, mid, end);
        t.join();
      });
  check(*chain_kernel(DType::kBFloat16), {300, 1000});
  check(*chain_kernel(DType::kFloat32), {200001});
  check(*reduce_kernel(Op::kSum, DType::kFloat32, 2, true), {500, 301},
        {{}, {contiguous({500, 301}, 2)}}, {}, Fill::kDyadic);
  check(*reduce_kernel(Op::kAmax, DType::kFloat32, 1, false), {301, 500}, {}, {}, Fill::kSpecial);
  runtime::set_parallel_backend(nullptr);
}

TEST(IrExecute, FullReductionsSplitIntoBlocksDeterministically) {
  // Reductions to one element over more than 32 tiles run as fixed blocks (in parallel when a
  // backend is set); the result must not depend on the backend.
  auto two_threads = [](int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                        void* ctx) {
    int64_t mid = begin + std::max(grain, (end - begin) / 2);
    if (mid >= end) {
      body(ctx, begin, end);
      return;
    }
    std::thread t([&] { body(ctx, begin, mid); });
    body(ctx, mid, end);
    t.join();
  };
  struct Case {
    std::vector<int64_t> sizes;
    uint64_t mask;
    Op op;
    DType dt;
    Fill fill;
  };
  const Case cases[] = {{{40000}, 1, Op::kSum, DType::kFloat32, Fill::kDyadic},
                        {{300, 301}, 3, Op::kSum, DType::kBFloat16, Fill::kDyadic},
                        {{70, 3, 1100}, 7, Op::kAmax, DType::kFloat16, Fill::kSpecial},
                        {{50001}, 1, Op::kSum, DType::kInt64, Fill::kWideInt}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)) + " " + dtype_name(c.dt));
    auto k = reduce_kernel(c.op, c.dt, c.mask, false);
    runtime::set_parallel_backend(nullptr);
    std::vector<Buf> serial = check(*k, c.sizes, {}, {}, c.fill, 11);
    runtime::set_parallel_backend(two_threads);
    std::vector<Buf> parallel = check(*k, c.sizes, {}, {}, c.fill, 11);
    runtime::set_parallel_backend(nullptr);
    EXPECT_EQ(serial[0].mem, parallel[0].mem);
  }
  // A float sum with rounding (not dyadic): serial and parallel still agree bit for bit.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  b.store(b.add_output(DType::kFloat32), b.reduce(Op::kSum, b.unary(Op::kSin, b.load(x)), 1));
  auto k = b.build();
  std::vector<float> in(100003);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.001f * static_cast<float>(i);
  float out1 = 0, out2 = 0;
  int64_t n = static_cast<int64_t>(in.size()), st = 1, ost = 0;
  Operand ins[1] = {{in.data(), &st}};
  Operand o1[1] = {{&out1, &ost}};
  Operand o2[1] = {{&out2, &ost}};
  execute(*k, &n, 1, ins, o1);
  runtime::set_parallel_backend(two_threads);
  execute(*k, &n, 1, ins, o2);
  runtime::set_parallel_backend(nullptr);
  EXPECT_EQ(std::memcmp(&out1, &out2, 4), 0) << out1 << " vs " << out2;
  double ref = 0;
  for (float v : in) ref += std::sin(v);
  EXPECT_NEAR(out1, ref, 1e-3 * std::fabs(ref) + 1e-2);
}

TEST(IrExecute, ConcurrentCallsShareOneKernel) {
  // The plan is built once (first call races with the others); per-thread scratch is separate.
  auto k = chain_kernel(DType::kFloat16);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<uint16_t> x(2000 + t), y(2000 + t), out(2000 + t);
        std::vector<uint8_t> m(2000 + t);
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = static_cast<uint16_t>(0x3C00 + (i % 50));  // 1.0 .. 1.05
          y[i] = static_cast<uint16_t>(0x3C00 + (i % 7));
        }
        int64_t n = static_cast<int64_t>(x.size()), st = 1;
        Operand ins[2] = {{x.data(), &st}, {y.data(), &st}};
        Operand outs[2] = {{out.data(), &st}, {m.data(), &st}};
        execute(*k, &n, 1, ins, outs);
        for (size_t i = 0; i < x.size(); ++i)
          if (m[i] != (out[i] != x[i])) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

std::atomic<int64_t> g_hook_calls{0};
std::atomic<int64_t> g_hook_max_n{0};
void fake_tanh(const float* x, float* y, int64_t n) {
  g_hook_calls++;
  int64_t m = g_hook_max_n.load();
  while (n > m && !g_hook_max_n.compare_exchange_weak(m, n)) {
  }
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + 0.25f;
}

TEST(IrExecute, MathHooksGetWholeChunks) {
  set_float_math(Op::kTanh, fake_tanh);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    g_hook_calls = 0;
    g_hook_max_n = 0;
    auto k = unary_kernel(Op::kTanh, dt);
    std::vector<float> x(5000, 1.0f), y(5000);
    std::vector<uint16_t> xb(5000, 0x3F80), yb(5000);
    int64_t sz = 5000, st = 1;
    Operand ins[1] = {{dt == DType::kFloat32 ? static_cast<void*>(x.data()) : xb.data(), &st}};
    Operand outs[1] = {{dt == DType::kFloat32 ? static_cast<void*>(y.data()) : yb.data(), &st}};
    execute(*k, &sz, 1, ins, outs);
    EXPECT_EQ(g_hook_calls.load(), (5000 + kChunkElems - 1) / kChunkElems);
    EXPECT_EQ(g_hook_max_n.load(), kChunkElems);
    if (dt == DType::kFloat32)
      EXPECT_EQ(y[4999], 1.25f);
    else
      EXPECT_EQ(yb[4999], 0x3FA0);  // 1.25 in bf16
  }
  set_float_math(Op::kTanh, nullptr);
  EXPECT_THROW(set_float_math(Op::kAdd, fake_tanh), std::invalid_argument);
  check(*unary_kernel(Op::kTanh, DType::kFloat32), {100});  // default restored
}

TEST(IrExecute, BadArgumentsThrow) {
  auto k = reduce_kernel(Op::kSum, DType::kFloat32, 0b10, true);
  std::vector<float> x(12), bias(12), out(12);
  int64_t sizes[2] = {3, 4};
  int64_t cst[2] = {4, 1}, bst[2] = {1, 0};
  Operand ins[2] = {{x.data(), cst}, {bias.data(), bst}};
  Operand good_out[1] = {{out.data(), bst}};
  Operand bad_out[1] = {{out.data(), cst}};  // reduced value, stride 1 along reduced axis
  EXPECT_NO_THROW(execute(*k, sizes, 2, ins, good_out));
  EXPECT_THROW(execute(*k, sizes, 2, ins, bad_out), std::invalid_argument);
  Operand bad_in[2] = {{x.data(), cst}, {bias.data(), cst}};  // epilogue input not broadcast
  try {
    execute(*k, sizes, 2, bad_in, good_out);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("input 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(execute(*k, sizes, 1, ins, good_out), std::invalid_argument);  // axis 1 >= ndim
  EXPECT_THROW(execute(*k, sizes, 65, ins, good_out), std::invalid_argument);
  int64_t neg[2] = {3, -1};
  EXPECT_THROW(execute(*k, neg, 2, ins, good_out), std::invalid_argument);
}

TEST(IrExecute, InPlaceExactAliasing) {
  // y = x * 2 + 1 written over x itself, as an in-place op does.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId v = b.binary(Op::kMul, b.load(x), b.constant(2.0, DType::kFloat32));
  b.store(b.add_output(DType::kFloat32), b.binary(Op::kAdd, v, b.constant(1.0, DType::kFloat32)));
  auto k = b.build();
  std::vector<float> data(3001);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  int64_t sz = 3001, st = 1;
  Operand io[1] = {{data.data(), &st}};
  execute(*k, &sz, 1, io, io);
  for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], 2.f * i + 1) << i;
}

TEST(IrExecute, ValueStoredToSeveralOutputsAndReusedAfterStore) {
  // v = x * 2 stored to out0 and out1, w = v + x (uses v after its store) to out2, tanh(w) (a
  // hooked op) to out3; contiguous, gapped (out1), row-tiled (300 x 7) and in-place (out0 over
  // x) layouts.
  set_float_math(Op::kTanh, &fake_tanh);
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId lx = b.load(x);
  ValueId v = b.binary(Op::kMul, lx, b.constant(2.0, DType::kFloat32));
  ValueId w = b.binary(Op::kAdd, v, lx);
  b.store(b.add_output(DType::kFloat32), v);
  b.store(b.add_output(DType::kFloat32), v);
  b.store(b.add_output(DType::kFloat32), w);
  b.store(b.add_output(DType::kFloat32), b.unary(Op::kTanh, w));
  auto k = b.build();
  for (std::vector<int64_t> sizes :
       {std::vector<int64_t>{3001}, std::vector<int64_t>{300, 7}, std::vector<int64_t>{5, 2049}}) {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    std::vector<int64_t> st(sizes.size()), gap(sizes.size());
    int64_t a = 1;
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      st[d] = a;
      gap[d] = 2 * a;
      a *= sizes[d];
    }
    for (bool in_place : {false, true}) {
      std::vector<float> xs(n), o0(n), o1(2 * n), o2(n), o3(n);
      for (int64_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 97) * 0.25f - 7.f;
      std::vector<float> x0 = xs;
      Operand in[1] = {{xs.data(), st.data()}};
      Operand out[4] = {{in_place ? xs.data() : o0.data(), st.data()},
                        {o1.data(), gap.data()},
                        {o2.data(), st.data()},
                        {o3.data(), st.data()}};
      execute(*k, sizes.data(), static_cast<int>(sizes.size()), in, out);
      const std::vector<float>& r0 = in_place ? xs : o0;
      for (int64_t i = 0; i < n; ++i) {
        float ev = x0[i] * 2.f, ew = ev + x0[i];
        ASSERT_EQ(r0[i], ev) << i;
        ASSERT_EQ(o1[2 * i], ev) << i;
        ASSERT_EQ(o2[i], ew) << i;
        float et;
        fake_tanh(&ew, &et, 1);
        ASSERT_EQ(o3[i], et) << i;
      }
    }
  }
  set_float_math(Op::kTanh, nullptr);
}

// Random kernels over random shapes and layouts (permuted, broadcast, reversed, gapped).
std::vector<int64_t> random_strides(const std::vector<int64_t>& sizes, std::mt19937& rng,
                                    bool allow_broadcast) {
  int nd = static_cast<int>(sizes.size());
  std::vector<int> perm(nd);
  for (int d = 0; d < nd; ++d) perm[d] = d;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> st(nd);
  int64_t s = 1 + (rng() % 3 == 0 ? 1 : 0);  // sometimes a gap between elements
  for (int i = nd - 1; i >= 0; --i) {
    int d = perm[i];
    bool bcast = allow_broadcast && rng() % 5 == 0;
    st[d] = bcast ? 0 : (rng() % 5 == 0 ? -s : s);
    if (!bcast) s *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

TEST(IrExecute, FuzzRandomKernelsAndLayouts) {
  std::mt19937 rng(20261202);
  const DType dts[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                       DType::kFloat64, DType::kInt32,    DType::kInt64};
  for (int iter = 0; iter < 300; ++iter) {
    DType dt = dts[rng() % 6];
    bool fl = is_float(dt);
    int nd = static_cast<int>(rng() % 5);
    std::vector<int64_t> sizes(nd);
    for (auto& x : sizes)
      x = rng() % 8 == 0 ? 1 + rng() % 300 : rng() % 12 == 0 ? 0 : 1 + rng() % 9;
    KernelBuilder b;
    std::vector<ValueId> pool;
    int nin = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < nin; ++i) pool.push_back(b.load(b.add_input(dt)));
    auto any = [&] { return pool[rng() % pool.size()]; };
    int nops = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < nops; ++i) {
      ValueId v;
      switch (rng() % 7) {
        case 0:
          v = b.unary(Op::kNeg, any());
          break;
        case 1:
          v = b.unary(Op::kAbs, any());
          break;
        case 2:
          v = b.binary(Op::kAdd, any(), any());
          break;
        case 3:
          v = b.binary(rng() % 2 ? Op::kMax : Op::kMin, any(), any());
          break;
        case 4:
          v = b.where(b.binary(Op::kLt, any(), any()), any(), any());
          break;
        case 5:
          v = b.binary(Op::kMul, any(), b.constant(fl && rng() % 2 ? 0.5 : -2.0, dt));
          break;
        default:
          v = fl ? b.unary(Op::kTanh, any()) : b.binary(Op::kSub, any(), any());
      }
      pool.push_back(v);
    }
    ValueId last = pool.back();
    bool full_out = true;
    uint64_t mask = 0;
    if (nd > 0 && rng() % 2) {
      mask = 1 + rng() % ((uint64_t{1} << nd) - 1);
      // Float sums depend on order: reduce floats with amax/amin only.
      Op rop = fl ? (rng() % 2 ? Op::kAmax : Op::kAmin)
                  : (rng() % 3 == 0 ? Op::kSum
                     : rng() % 2    ? Op::kAmax
                                    : Op::kAmin);
      ValueId r = b.reduce(rop, last, mask);
      if (rng() % 2) r = b.binary(Op::kAdd, r, b.constant(1, dt));
      b.store(b.add_output(dt), r);
      full_out = rng() % 2;
    }
    if (full_out) b.store(b.add_output(dt), pool[nin + rng() % nops]);
    auto k = b.build();
    std::vector<Layout> in_l(k->num_inputs()), out_l(k->num_outputs());
    for (auto& l : in_l) l.strides = random_strides(sizes, rng, true);
    for (int o = 0; o < k->num_outputs(); ++o) {
      if (k->is_reduced(k->output_value(o))) continue;  // keepdim contiguous
      out_l[o].strides = random_strides(sizes, rng, false);
    }
    std::string shape;
    for (int64_t x : sizes) shape += std::to_string(x) + " ";
    SCOPED_TRACE("iter " + std::to_string(iter) + " sizes [" + shape + "] mask " +
                 std::to_string(mask));
    check(*k, sizes, in_l, out_l, Fill::kSpecial, iter);
    if (::testing::Test::HasFailure()) break;
  }
}

// --- throughput (run by hand: --gtest_also_run_disabled_tests --gtest_filter='IrPerf.*') -----

// A vectorizable tanh stand-in for SLEEF (the ATen glue installs the real one): a rational
// approximation, accurate to a few ulp in [-9, 9], clamped outside, compiled for AVX-512 like
// SLEEF's vector functions.
// NOTE: no ifunc clones under sanitizers: the resolver runs before their runtime is up.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
__attribute__((optimize("O3")))
#else
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#endif
void fast_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = std::min(9.f, std::max(-9.f, x[i]));
    float v2 = v * v;
    float p = v * (135135.f + v2 * (17325.f + v2 * (378.f + v2)));
    float q = 135135.f + v2 * (62370.f + v2 * (3150.f + v2 * 28.f));
    y[i] = std::min(1.f, std::max(-1.f, p / q));
  }
}

double gbps(double bytes, double secs) { return bytes / secs / 1e9; }

template <class F>
double best_seconds(F f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

TEST(IrPerf, DISABLED_GeluTanhChainVsMemcpy) {
  // gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): 8 ops + tanh.
  KernelBuilder b;
  int xi = b.add_input(DType::kFloat32);
  auto c = [&](double v) { return b.constant(v, DType::kFloat32); };
  ValueId x = b.load(xi);
  ValueId x3 = b.binary(Op::kMul, b.binary(Op::kMul, x, x), x);
  ValueId inner = b.binary(Op::kAdd, x, b.binary(Op::kMul, c(0.044715), x3));
  ValueId t = b.unary(Op::kTanh, b.binary(Op::kMul, c(0.7978845608028654), inner));
  ValueId y = b.binary(Op::kMul, b.binary(Op::kMul, c(0.5), x), b.binary(Op::kAdd, c(1.0), t));
  b.store(b.add_output(DType::kFloat32), y);
  auto k = b.build();
  // The same chain with tanh replaced by abs: the interpreter's own cost, no transcendental.
  KernelBuilder a;
  xi = a.add_input(DType::kFloat32);
  auto ca = [&](double v) { return a.constant(v, DType::kFloat32); };
  x = a.load(xi);
  x3 = a.binary(Op::kMul, a.binary(Op::kMul, x, x), x);
  inner = a.binary(Op::kAdd, x, a.binary(Op::kMul, ca(0.044715), x3));
  t = a.unary(Op::kAbs, a.binary(Op::kMul, ca(0.7978845608028654), inner));
  y = a.binary(Op::kMul, a.binary(Op::kMul, ca(0.5), x), a.binary(Op::kAdd, ca(1.0), t));
  a.store(a.add_output(DType::kFloat32), y);
  auto ka = a.build();
  const int64_t n = 4 << 20;
  std::vector<float> in(n), out(n), dst(n);
  for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 2001) - 1000) / 250.f;
  int64_t st = 1;
  Operand ins[1] = {{in.data(), &st}};
  Operand outs[1] = {{out.data(), &st}};
  double bytes = 2.0 * n * sizeof(float);
  auto run_suite = [&](const char* label) {
    double t_memcpy = best_seconds([&] { std::memcpy(dst.data(), in.data(), n * 4); }, 10);
    set_float_math(Op::kTanh, nullptr);
    double t_std = best_seconds([&] { execute(*k, &n, 1, ins, outs); }, 5);
    set_float_math(Op::kTanh, fast_tanh);
    double t_fast = best_seconds([&] { execute(*k, &n, 1, ins, outs); }, 10);
    set_float_math(Op::kTanh, nullptr);
    double t_arith = best_seconds([&] { execute(*ka, &n, 1, ins, outs); }, 10);
    std::printf(
        "[%s] memcpy %.2f GB/s | gelu, std::tanh: %.2f GB/s (%.0f%%) | gelu, vector tanh "
        "hook: %.2f GB/s (%.0f%%) | same chain, tanh->abs: %.2f GB/s (%.0f%% of memcpy)\n",
        label, gbps(bytes, t_memcpy), gbps(bytes, t_std), 100 * t_memcpy / t_std,
        gbps(bytes, t_fast), 100 * t_memcpy / t_fast, gbps(bytes, t_arith),
        100 * t_memcpy / t_arith);
  };
  runtime::set_parallel_backend(nullptr);
  run_suite("1 thread");
  runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t, runtime::ParallelBody body, void* ctx) {
        int64_t mid = begin + (end - begin) / 2;
        std::thread th([&] { body(ctx, begin, mid); });
        body(ctx, mid, end);
        th.join();
      });
  run_suite("2 threads");
  runtime::set_parallel_backend(nullptr);
}

}  // namespace
}  // namespace openneuron::ir
