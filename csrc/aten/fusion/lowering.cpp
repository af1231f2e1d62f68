// Fusion lowering: what each recorded op (Fn) computes, as IR values on the pending group, with
// the roundings eager ATen does (compute dtype, bf16/fp16 scalar opmath, addcmul's fma, lerp's
// two forms). The group's boundaries and aliasing are recorder.cpp's.
#include <cmath>
#include <cstring>
#include <iterator>

#include "aten/fusion/group.h"

namespace openneuron::aten::fusion {

const char* fn_name(Fn fn) {
  static const char* names[] = {
      "neg",    "abs",  "reciprocal", "sqrt", "rsqrt", "exp",     "log",     "cos", "tanh", "erf",
      "square", "cube", "relu",       "cast", "add",   "sub",     "mul",     "div", "eq",   "ne",
      "lt",     "le",   "gt",         "ge",   "where", "addcmul", "addcdiv", "lerp"};
  static_assert(std::size(names) == kNumFns, "one name per Fn");
  return names[static_cast<int>(fn)];
}

namespace detail {

int32_t Recorder::constant(const c10::Scalar& s, DType dt) {
  GNode n{Op::kConstant, dt, -1, {-1, -1, -1}, 0};
  if (ir::dtype_is_floating(dt)) {
    double v = s.isBoolean()         ? (s.toBool() ? 1.0 : 0.0)
               : s.isIntegral(false) ? static_cast<double>(s.toLong())
                                     : s.toDouble();
    // NOTE: an int64 scalar converts to float directly (c10::convert), not through double.
    if (s.isIntegral(false) && dt != DType::kFloat64) {
      v = static_cast<double>(static_cast<float>(s.toLong()));
    }
    std::memcpy(&n.payload, &v, 8);
  } else {
    int64_t v = s.isBoolean()         ? (s.toBool() ? 1 : 0)
                : s.isIntegral(false) ? s.toLong()
                                      : static_cast<int64_t>(s.toDouble());
    if (dt == DType::kBool) v = s.isFloatingPoint() ? (s.toDouble() != 0) : (v != 0);
    std::memcpy(&n.payload, &v, 8);
  }
  return push(n);
}

// Fusion lowering: op r as IR values on the pending group, its operands cast to the compute
// dtype as TensorIterator does and the result to the output's dtype. Caller holds mu_.
int32_t Recorder::lower(const OpRecord& r) {
  const at::Tensor& out = *r.out;
  const DType ct = dtype_of(r.compute);
  const DType od = dtype_of(out.scalar_type());
  int32_t v[3] = {-1, -1, -1};
  for (int i = 0; i < r.nargs; ++i) {
    const Arg& a = r.args[i];
    if (a.tensor) {
      v[i] = value_of(*a.tensor);
      eager_bytes_ += a.tensor->numel() * static_cast<int64_t>(a.tensor->itemsize());
    } else {
      v[i] = -2;  // constant, made below in the right dtype
    }
  }
  auto operand = [&](int i, DType dt) {
    return v[i] == -2 ? constant(r.args[i].scalar, dt) : cast(v[i], dt);
  };
  int32_t res = -1;
  switch (r.fn) {
    case Fn::kNeg:
      res = unary(Op::kNeg, operand(0, ct));
      break;
    case Fn::kAbs:
      res = unary(Op::kAbs, operand(0, ct));
      break;
    case Fn::kReciprocal:
      res = unary(Op::kReciprocal, operand(0, ct));
      break;
    case Fn::kSqrt:
      res = unary(Op::kSqrt, operand(0, ct));
      break;
    case Fn::kRsqrt:
      res = unary(Op::kRsqrt, operand(0, ct));
      break;
    case Fn::kExp:
      res = unary(Op::kExp, operand(0, ct));
      break;
    case Fn::kLog:
      res = unary(Op::kLog, operand(0, ct));
      break;
    case Fn::kCos:
      res = unary(Op::kCos, operand(0, ct));
      break;
    case Fn::kTanh:
      res = unary(Op::kTanh, operand(0, ct));
      break;
    case Fn::kErf:
      res = unary(Op::kErf, operand(0, ct));
      break;
    case Fn::kSquare: {
      int32_t x = operand(0, ct);
      res = binary(Op::kMul, x, x, ct);
      break;
    }
    case Fn::kCube: {
      int32_t x = operand(0, ct);
      res = binary(Op::kMul, binary(Op::kMul, x, x, ct), x, ct);
      break;
    }
    case Fn::kRelu: {
      int32_t x = operand(0, ct);
      int32_t zero = constant(c10::Scalar(int64_t{0}), ct);
      int32_t neg = binary(Op::kLt, x, zero, DType::kBool);
      res = push({Op::kWhere, ct, -1, {neg, zero, x}, 0});
      break;
    }
    case Fn::kCast:
      res = operand(0, od);
      break;
    case Fn::kAdd:
    case Fn::kSub:
    case Fn::kMul:
    case Fn::kDiv: {
      const Op op = r.fn == Fn::kAdd   ? Op::kAdd
                    : r.fn == Fn::kSub ? Op::kSub
                    : r.fn == Fn::kMul ? Op::kMul
                                       : Op::kDiv;
      if (r.scalar_opmath) {
        int32_t a = cast(operand(0, ct), DType::kFloat32);
        int32_t b = constant(r.args[1].scalar, DType::kFloat32);
        res = cast(binary(op, a, b, DType::kFloat32), ct);
      } else {
        res = binary(op, operand(0, ct), operand(1, ct), ct);
      }
      break;
    }
    case Fn::kEq:
    case Fn::kNe:
    case Fn::kLt:
    case Fn::kLe:
    case Fn::kGt:
    case Fn::kGe: {
      static const Op ops[] = {Op::kEq, Op::kNe, Op::kLt, Op::kLe, Op::kGt, Op::kGe};
      const Op op = ops[static_cast<int>(r.fn) - static_cast<int>(Fn::kEq)];
      res = binary(op, operand(0, ct), operand(1, ct), DType::kBool);
      break;
    }
    case Fn::kWhere: {
      int32_t c = operand(0, DType::kBool);
      res = push({Op::kWhere, ct, -1, {c, operand(1, ct), operand(2, ct)}, 0});
      break;
    }
    case Fn::kAddcmul:
    case Fn::kAddcdiv: {
      int32_t self = operand(0, ct), t1 = operand(1, ct), t2 = operand(2, ct);
      int32_t p = binary(Op::kMul, constant(r.param, ct), t1, ct);
      res = r.fn == Fn::kAddcmul ? push({Op::kFma, ct, -1, {p, t2, self}, 0})
                                 : binary(Op::kAdd, self, binary(Op::kDiv, p, t2, ct), ct);
      break;
    }
    case Fn::kLerp: {
      int32_t self = operand(0, ct), end = operand(1, ct);
      int32_t d = binary(Op::kSub, end, self, ct);
      const float w = static_cast<float>(r.param.toDouble());
      const bool small = std::abs(w) < 0.5f;
      int32_t c = constant(c10::Scalar(static_cast<double>(small ? w : w - 1.0f)), ct);
      res = push({Op::kFma, ct, -1, {c, d, small ? self : end}, 0});
      break;
    }
  }
  return cast(res, od);
}

}  // namespace detail
}  // namespace openneuron::aten::fusion
