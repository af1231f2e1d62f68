// Which ATen ops adaptive eager records, and what they compute: the fusible-op table and the
// entry points the op hooks call (boxed fallback, pointwise fast path, copy_). Type promotion
// is resolved here exactly as TensorIterator does; the recorder (recorder.cpp) decides when
// a group closes.
//
// Bitwise identity with eager, op by op (each verified against eager with torch.equal in
// tests/python/test_fusion.py; the numbers are from exhaustive bf16/fp16 sweeps):
//   + - * / neg abs compare where cast relu: exact IEEE, so any order/layout matches. Ints
//     wrap like ATen; integer true division promotes to float first, as ATen.
//   add/sub with alpha != 1: NOT fused (ATen uses fma in the vector path and a*b+c in the
//     scalar tail, so eager itself depends on the element's position).
//   bf16/fp16 mul/div with a scalar second operand: computed in float with the scalar's float
//     value, rounded once (ATen's binary_op_scalar); add/sub round the scalar to bf16/fp16
//     first (measured); a scalar FIRST operand in bf16/fp16 arithmetic: not fused.
//   tanh exp log cos sqrt reciprocal (f32, bf16, f16), rsqrt and erf (f32 only): ATen's own
//     kernels run as the IR's math hooks (math_hooks.cpp), float32's for f32 values and the
//     bf16/fp16 kernel itself for bf16/fp16 values (VML's float32 sqrt is not correctly rounded
//     on every CPU / MKL code path, so float-then-round is not eager's bf16/fp16 result
//     everywhere); eager's results for these do not depend on position or layout (vector
//     tails). bf16/fp16 rsqrt rounds sqrt first in its scalar tail, so eager depends on
//     position: not fused there; bf16/fp16 erf: not fused (not needed by any model measured).
//   pow(x, 2) / pow(x, 3): ATen multiplies (x*x, x*x*x, each product rounded) for f32, f64,
//     bf16; fp16 pow calls std::pow: not fused.
//   addcmul / addcdiv / lerp (scalar weight), f32 only: measured forms, position-independent
//     in eager: addcmul = fma(value * t1, t2, self) (the compiler contracts it), addcdiv =
//     self + (value * t1) / t2, lerp = fma(w, end - self, self) for |w| < 0.5 else
//     fma(w - 1, end - self, end) (ATen's lerp_vec). Those fma forms are ATen's AVX2/AVX-512
//     kernels; with ATEN_CPU_CAPABILITY=default (or a CPU without AVX2) eager rounds the
//     product first, so addcmul and lerp are not fused there (found by make test-isa).
//   In-place ops: on a pending result, or on a group input whose every load has exactly the
//     written geometry (the kernel reads each element before writing it); else a boundary.
//   NOT fused: sigmoid, silu, gelu, log1p (scalar tails: eager differs by position),
//     maximum/minimum (eager's signed-zero result differs between vector and scalar paths),
//     sin in fp16, every reduction (ATen's sum order is not reproducible; amax is, but a
//     reduction closes the group here for simplicity), in-place ops, f64 transcendentals.
#include <ATen/Version.h>
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

#include "aten/dtype.h"
#include "aten/fusion/fusion.h"
#include "aten/fusion/recorder.h"
#include "aten/ops/host_views.h"
#include "aten/ops/meta_cache.h"

namespace openneuron::aten::fusion {
namespace {

// One bit per ir::DType (bit i = DType i).
enum DtMask : uint16_t {
  kF32 = 1 << static_cast<int>(ir::DType::kFloat32),
  kBF16 = 1 << static_cast<int>(ir::DType::kBFloat16),
  kF16 = 1 << static_cast<int>(ir::DType::kFloat16),
  kF64 = 1 << static_cast<int>(ir::DType::kFloat64),
  kI32 = 1 << static_cast<int>(ir::DType::kInt32),
  kI64 = 1 << static_cast<int>(ir::DType::kInt64),
  kBool = 1 << static_cast<int>(ir::DType::kBool),
  kFloats = kF32 | kBF16 | kF16 | kF64,
  kNumeric = kFloats | kI32 | kI64,
  kAll = kNumeric | kBool,
  kHooked = kF32 | kBF16 | kF16,  // float math hooks (bf16/fp16 via float)
};

uint16_t mask_of(c10::ScalarType t) {
  const std::optional<ir::DType> d = ir_dtype(t);
  return d ? static_cast<uint16_t>(1u << static_cast<int>(*d)) : 0;
}

enum class Result : uint8_t { kCompute, kBool, kFloat };  // result dtype rule

struct Spec {
  const char* name;
  Fn fn;
  int8_t nin;       // operands are args 0..nin-1
  int8_t alpha;     // arg index of alpha (-1: none); only alpha == 1 is fused
  int8_t exponent;  // pow: arg index of the exponent
  bool functional;  // no out= arg: the result is allocated here
  uint16_t dtypes;  // allowed compute dtypes
  Result result;
  int8_t param = -1;  // arg index of addcmul/addcdiv's value or lerp's weight
};

// ATen's CPU kernels for addcmul / lerp contract to fma only at its AVX2 / AVX-512 levels.
bool aten_vectorized_fma() {
  static const bool yes = at::get_cpu_capability() != "DEFAULT";  // "AVX2", "AVX512", ...
  return yes;
}

const Spec kSpecs[] = {
    {"aten::neg.out", Fn::kNeg, 1, -1, -1, false, kNumeric, Result::kCompute},
    {"aten::abs.out", Fn::kAbs, 1, -1, -1, false, kNumeric, Result::kCompute},
    {"aten::reciprocal.out", Fn::kReciprocal, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::sqrt.out", Fn::kSqrt, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::rsqrt.out", Fn::kRsqrt, 1, -1, -1, false, kF32, Result::kCompute},
    {"aten::exp.out", Fn::kExp, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::log.out", Fn::kLog, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::cos.out", Fn::kCos, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::tanh.out", Fn::kTanh, 1, -1, -1, false, kHooked, Result::kCompute},
    {"aten::erf.out", Fn::kErf, 1, -1, -1, false, kF32, Result::kCompute},
    {"aten::pow.Tensor_Scalar_out", Fn::kSquare, 1, -1, 1, false, kF32 | kF64 | kBF16,
     Result::kCompute},
    {"aten::relu", Fn::kRelu, 1, -1, -1, true, kNumeric, Result::kCompute},
    {"aten::add.out", Fn::kAdd, 2, 2, -1, false, kNumeric, Result::kCompute},
    {"aten::sub.out", Fn::kSub, 2, 2, -1, false, kNumeric, Result::kCompute},
    {"aten::mul.out", Fn::kMul, 2, -1, -1, false, kNumeric, Result::kCompute},
    {"aten::div.out", Fn::kDiv, 2, -1, -1, false, kFloats, Result::kFloat},
    {"aten::eq.Tensor_out", Fn::kEq, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::ne.Tensor_out", Fn::kNe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::lt.Tensor_out", Fn::kLt, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::le.Tensor_out", Fn::kLe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::gt.Tensor_out", Fn::kGt, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::ge.Tensor_out", Fn::kGe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::eq.Scalar_out", Fn::kEq, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::ne.Scalar_out", Fn::kNe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::lt.Scalar_out", Fn::kLt, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::le.Scalar_out", Fn::kLe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::gt.Scalar_out", Fn::kGt, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::ge.Scalar_out", Fn::kGe, 2, -1, -1, false, kAll, Result::kBool},
    {"aten::where.self", Fn::kWhere, 3, -1, -1, true, kAll, Result::kCompute},
    {"aten::addcmul.out", Fn::kAddcmul, 3, -1, -1, false, kF32, Result::kCompute, 3},
    {"aten::addcdiv.out", Fn::kAddcdiv, 3, -1, -1, false, kF32, Result::kCompute, 3},
    {"aten::lerp.Scalar_out", Fn::kLerp, 2, -1, -1, false, kF32, Result::kCompute, 2},
};
constexpr int kNumSpecs = sizeof(kSpecs) / sizeof(kSpecs[0]);

}  // namespace

std::vector<std::string> fused_op_names() {
  std::vector<std::string> names;
  for (const Spec& s : kSpecs) names.emplace_back(s.name);
  for (const char* n : {"aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor",
                        "aten::div.Tensor", "aten::copy_"})
    names.emplace_back(n);
  return names;
}

namespace {

const Spec* spec_of(OpInfo& info) {
  int16_t s = info.fusion_spec.load(std::memory_order_relaxed);
  if (s == -1) {
    s = -2;
    for (int i = 0; i < kNumSpecs; ++i)
      if (std::strcmp(kSpecs[i].name, info.name) == 0) s = static_cast<int16_t>(i);
    info.fusion_spec.store(s, std::memory_order_relaxed);
  }
  return s >= 0 ? &kSpecs[s] : nullptr;
}

bool is_reduced(c10::ScalarType t) {
  return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half;
}

// The value of a CPU 0-dim tensor, read directly (no dispatch).
bool scalar_of(const at::Tensor& t, c10::Scalar* out) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      *out = *static_cast<const double*>(p);
      return true;
    case c10::ScalarType::Float:
      *out = static_cast<double>(*static_cast<const float*>(p));
      return true;
    case c10::ScalarType::BFloat16:
      *out = static_cast<double>(static_cast<float>(*static_cast<const c10::BFloat16*>(p)));
      return true;
    case c10::ScalarType::Half:
      *out = static_cast<double>(static_cast<float>(*static_cast<const c10::Half*>(p)));
      return true;
    case c10::ScalarType::Long:
      *out = *static_cast<const int64_t*>(p);
      return true;
    case c10::ScalarType::Int:
      *out = static_cast<int64_t>(*static_cast<const int32_t*>(p));
      return true;
    case c10::ScalarType::Bool:
      *out = *static_cast<const bool*>(p);
      return true;
    default:
      return false;
  }
}

// Operand i from an IValue: a neuron tensor on `device`, a CPU 0-dim tensor or a Scalar.
bool operand_of(const c10::IValue& v, c10::Device device, Arg* a,
                at::native::ResultTypeState* state, bool* is_scalar) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.is_conj() || t.is_neg() || mask_of(t.scalar_type()) == 0) return false;
    if (t.device() == device) {
      a->tensor = &t;
      *is_scalar = false;
    } else if (t.device().is_cpu() && t.dim() == 0) {
      if (!scalar_of(t, &a->scalar)) return false;
      *is_scalar = true;
    } else {
      return false;
    }
    *state = at::native::update_result_type_state(t, *state);
    return true;
  }
  if (v.isDouble() || v.isInt() || v.isBool()) {
    a->scalar = v.toScalar();
    *is_scalar = true;
    *state = at::native::update_result_type_state(a->scalar, *state);
    return true;
  }
  return false;
}

// out must have the operands' broadcast shape (no resize), be dense and not overlap itself.
bool out_ok(const at::Tensor& out, const OpRecord& r) {
  if (!out.defined() || !out.device().is_privateuseone() || out.numel() == 0 || out.is_conj() ||
      out.is_neg() || !out.is_non_overlapping_and_dense())
    return false;
  if (out.dim() > 16) return false;
  c10::DimVector shape;
  bool any = false;
  try {
    for (int i = 0; i < r.nargs; ++i) {
      const at::Tensor* t = r.args[i].tensor;
      if (!t) continue;
      shape = any ? at::infer_size_dimvector(shape, t->sizes()) : c10::DimVector(t->sizes());
      any = true;
    }
  } catch (const std::exception&) {
    return false;
  }
  return any && out.sizes().equals(shape);
}

}  // namespace

bool try_record_boxed(const c10::OperatorHandle& op, OpInfo& info, torch::jit::Stack* stack) {
  const Spec* spec = spec_of(info);
  if (!spec) {
    flush(info.name);
    return false;
  }
  const size_t n = info.num_args;
  const size_t first = stack->size() - n;
  c10::IValue* args = stack->data() + first;
  OpRecord r;
  r.fn = spec->fn;
  r.name = info.name;
  r.nargs = spec->nin;
  // The device: the out tensor's, else the first neuron operand's.
  c10::Device device(c10::DeviceType::PrivateUse1);
  bool have_device = false;
  if (!spec->functional) {
    const c10::IValue& o = args[n - 1];
    if (!o.isTensor() || !o.toTensor().defined()) return false;
    device = o.toTensor().device();
    have_device = device.is_privateuseone();
  } else {
    for (int i = 0; i < spec->nin && !have_device; ++i) {
      if (args[i].isTensor() && args[i].toTensor().defined() &&
          args[i].toTensor().device().is_privateuseone()) {
        device = args[i].toTensor().device();
        have_device = true;
      }
    }
  }
  auto decline = [&] {
    flush(info.name);
    return false;
  };
  if (!have_device) return decline();
  at::native::ResultTypeState state;
  bool scalar[3] = {false, false, false};
  for (int i = 0; i < spec->nin; ++i) {
    // where's condition does not take part in type promotion
    at::native::ResultTypeState* st = &state;
    at::native::ResultTypeState ignored;
    if (spec->fn == Fn::kWhere && i == 0) st = &ignored;
    if (!operand_of(args[i], device, &r.args[i], st, &scalar[i])) return decline();
  }
  if (!r.args[0].tensor && !(spec->nin > 1 && r.args[1].tensor) &&
      !(spec->nin > 2 && r.args[2].tensor))
    return decline();
  if (spec->alpha >= 0) {
    const c10::IValue& a = args[spec->alpha];
    if (!(a.isInt() && a.toInt() == 1) && !(a.isDouble() && a.toDouble() == 1.0)) return decline();
  }
  if (spec->exponent >= 0) {
    const c10::IValue& e = args[spec->exponent];
    double x = e.isInt() ? static_cast<double>(e.toInt()) : e.isDouble() ? e.toDouble() : 0;
    if (x == 2.0) {
      r.fn = Fn::kSquare;
    } else if (x == 3.0) {
      r.fn = Fn::kCube;
    } else {
      return decline();
    }
  }
  if (spec->param >= 0) {
    const c10::IValue& p = args[spec->param];
    if (!p.isDouble() && !p.isInt()) return decline();
    r.param = p.toScalar();
  }
  c10::ScalarType ct = at::native::result_type(state);
  if (spec->fn == Fn::kWhere) {
    const at::Tensor* c = r.args[0].tensor;
    if (!c || c->scalar_type() != c10::ScalarType::Bool) return decline();
  }
  if (spec->result == Result::kFloat && !at::isFloatingType(ct))
    ct = c10::typeMetaToScalarType(c10::get_default_dtype());
  if ((mask_of(ct) & spec->dtypes) == 0) return decline();
  if ((spec->fn == Fn::kAddcmul || spec->fn == Fn::kLerp) && !aten_vectorized_fma())
    return decline();
  if (is_reduced(ct) && spec->nin == 2 && spec->result != Result::kBool) {
    if (scalar[0]) return decline();
    r.scalar_opmath = scalar[1] && (r.fn == Fn::kMul || r.fn == Fn::kDiv);
  }
  r.compute = ct;
  const c10::ScalarType rt = spec->result == Result::kBool ? c10::ScalarType::Bool : ct;
  at::Tensor fresh;
  if (spec->functional) {
    std::shared_ptr<const MetaResult> meta;
    try {
      meta = meta_result(op, info, c10::ArrayRef<c10::IValue>(args, n));
    } catch (const std::exception&) {
      return decline();
    }
    if (meta->returns.empty() || meta->returns[0].empty() || !meta->returns[0][0].defined ||
        meta->returns[0][0].dtype != rt)
      return decline();
    fresh = device_empty(meta->returns[0][0], device);
    r.out = &fresh;
  } else {
    r.out = &args[n - 1].toTensor();
    if (r.out->scalar_type() != rt) return decline();
  }
  if (!out_ok(*r.out, r)) return decline();
  if (!record(r)) return false;
  if (spec->functional) {
    torch::jit::drop(*stack, n);
    stack->push_back(c10::IValue(std::move(fresh)));
  } else {
    c10::IValue out = args[n - 1];
    torch::jit::drop(*stack, n);
    stack->push_back(std::move(out));
  }
  info.async_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool try_record_binary(Fn fn, const char* name, const at::Tensor& out, const at::Tensor& self,
                       const at::Tensor& other, const c10::Scalar& alpha) {
  if ((fn == Fn::kAdd || fn == Fn::kSub) &&
      !(alpha.isIntegral(true) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0))
    return false;
  OpRecord r;
  r.fn = fn;
  r.name = name;
  r.nargs = 2;
  r.args[0].tensor = &self;
  const c10::ScalarType ct = self.scalar_type();
  if ((mask_of(ct) & kNumeric) == 0) return false;
  if (other.device().is_cpu()) {
    if (!scalar_of(other, &r.args[1].scalar)) return false;
    r.scalar_opmath = is_reduced(ct) && (fn == Fn::kMul || fn == Fn::kDiv);
  } else {
    r.args[1].tensor = &other;
  }
  r.compute = ct;
  r.out = &out;
  if (!out_ok(out, r)) return false;
  return record(r);
}

bool try_record_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.scalar_type() == src.scalar_type() || mask_of(dst.scalar_type()) == 0 ||
      mask_of(src.scalar_type()) == 0 || src.is_conj() || src.is_neg() ||
      src.device() != dst.device())
    return false;
  OpRecord r;
  r.fn = Fn::kCast;
  r.name = "aten::copy_";
  r.nargs = 1;
  r.args[0].tensor = &src;
  r.compute = dst.scalar_type();
  r.out = &dst;
  if (!out_ok(dst, r)) return false;
  return record(r);
}

}  // namespace openneuron::aten::fusion
