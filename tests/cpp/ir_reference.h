// The scalar reference the IR interpreter's tests compare against: it evaluates every element
// on its own (multi-index walk, one node at a time, rounding per dtype with frexp-based code
// independent of csrc/ir/dtype.h), plus operand buffers in every dtype and small kernel
// builders. Reusable by any test of code that lowers to the IR (fusion, custom kernels).
// NOTE: test-only and header-only; its anonymous namespace gives each test binary's file its
// own copy.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"

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

}  // namespace
}  // namespace openneuron::ir
