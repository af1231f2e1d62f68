// Native fast paths for the hottest small ops: fill_/zero_ of contiguous tensors, and
// add/sub/mul/div (Tensor overloads, functional and in-place) on contiguous floating tensors of
// one shape (or with a CPU scalar) without type promotion. They skip the meta dispatch and the
// boxed fallback; other cases take ATen's structured wrappers (then fallback.cpp) as they
// would without these kernels.
#include <ATen/ATen.h>
#include <ATen/ops/add_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/div_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sub_compositeexplicitautogradnonfunctional_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/errors.h"
#include "aten/fusion/fusion.h"
#include "aten/ops/enqueue.h"
#include "aten/ops/fallback.h"
#include "aten/ops/host_views.h"
#include "aten/ops/op_table.h"
#include "aten/origin_capture.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace openneuron::aten {
namespace {

enum class Binary { Add, Sub, Mul, Div };
constexpr fusion::Fn kFusionFn[4] = {fusion::Fn::kAdd, fusion::Fn::kSub, fusion::Fn::kMul,
                                     fusion::Fn::kDiv};

// A contiguous operand seen as a flat range of its storage (not owned: host_views.h).
struct Flat {
  DeviceBuffer buffer;
  int64_t offset = 0;
};

at::Tensor flat_cpu(const Flat& f, int64_t numel, c10::ScalarType dtype) {
  TensorGeom g;
  g.sizes = {numel};
  g.strides = {1};
  g.offset = f.offset;
  g.dtype = dtype;
  return host_view_fresh(f.buffer, g);
}

// Makes `device` current for the guard's lifetime, as c10::DeviceGuard does, but costs one
// thread-local read when it already is (the common case: the guard's two virtual calls and
// device check were a measurable part of a small op).
void make_current(c10::OptionalDeviceGuard& guard, c10::Device device) {
  if (device.index() != runtime::device_current()) guard.reset_device(device);
}

bool is_cpu_scalar(const at::Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

// Whether (self, other) qualify; out dtype must equal self's. Floating dtypes only: for bool
// and integer tensors ATen rejects some argument combinations at dispatch (bool subtraction,
// a float alpha), which must stay synchronous errors.
bool eligible(const at::Tensor& self, const at::Tensor& other) {
  if (!self.device().is_privateuseone() || !at::isFloatingType(self.scalar_type()) ||
      !self.is_contiguous() || self.is_conj() || self.is_neg())
    return false;
  if (is_cpu_scalar(other)) {
    if (other.is_conj() || other.is_neg()) return false;
    return at::result_type(self, other) == self.scalar_type();
  }
  if (other.device() != self.device() || !other.is_contiguous() ||
      !other.sizes().equals(self.sizes()) || other.scalar_type() != self.scalar_type() ||
      other.is_conj() || other.is_neg()) {
    return false;
  }
  return true;  // same dtype, same shape: no promotion
}

void enqueue(Binary kind, const char* name, const at::Tensor& out, const at::Tensor& self,
             const at::Tensor& other, const c10::Scalar& alpha) {
  const int64_t numel = self.numel();
  const c10::ScalarType dtype = self.scalar_type();
  Flat o{buffer_of(out), out.storage_offset()};
  Flat a{buffer_of(self), self.storage_offset()};
  std::optional<Flat> b;
  // NOTE: a CPU scalar operand keeps its own dtype (and wrapped-number flag), as ATen's CPU
  // kernel sees it: rounding 0.1 to half first would make x * 0.1 differ from CPU by an ulp.
  at::Tensor scalar;
  if (is_cpu_scalar(other)) {
    scalar = other.clone();
    scalar.unsafeGetTensorImpl()->set_wrapped_number(
        other.unsafeGetTensorImpl()->is_wrapped_number());
  } else {
    b = Flat{buffer_of(other), other.storage_offset()};
  }
  // NOTE: alpha is copied into a non-const capture so the closure moves without throwing and
  // fits WorkFn's inline buffer (a const member would be copied, and the copy may throw).
  enqueue_op(self.device(), name,
             [kind, numel, dtype, o, a, b, scalar, alpha = c10::Scalar(alpha)] {
               at::AutoDispatchBelowADInplaceOrView below_autograd;
               at::Tensor out_c = flat_cpu(o, numel, dtype);
               at::Tensor self_c = flat_cpu(a, numel, dtype);
               at::Tensor other_c = b ? flat_cpu(*b, numel, dtype) : scalar;
               switch (kind) {
                 case Binary::Add:
                   at::add_out(out_c, self_c, other_c, alpha);
                   break;
                 case Binary::Sub:
                   at::sub_out(out_c, self_c, other_c, alpha);
                   break;
                 case Binary::Mul:
                   at::mul_out(out_c, self_c, other_c);
                   break;
                 case Binary::Div:
                   at::div_out(out_c, self_c, other_c);
                   break;
               }
             });
}

template <Binary kKind>
OpInfo& info_of(bool in_place) {
  static const char* names[4] = {"aten::add", "aten::sub", "aten::mul", "aten::div"};
  static const char* in_place_names[4] = {"aten::add_", "aten::sub_", "aten::mul_", "aten::div_"};
  static OpInfo& functional = op_info(names[static_cast<int>(kKind)], "Tensor");
  static OpInfo& inplace = op_info(in_place_names[static_cast<int>(kKind)], "Tensor");
  return in_place ? inplace : functional;
}

template <Binary kKind>
at::Tensor binary(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  if (!eligible(self, other)) {
    switch (kKind) {
      case Binary::Add:
        return at::compositeexplicitautogradnonfunctional::add(self, other, alpha);
      case Binary::Sub:
        return at::compositeexplicitautogradnonfunctional::sub(self, other, alpha);
      case Binary::Mul:
        return at::compositeexplicitautogradnonfunctional::mul(self, other);
      case Binary::Div:
        return at::compositeexplicitautogradnonfunctional::div(self, other);
    }
  }
  OpInfo& info = info_of<kKind>(false);
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  c10::OptionalDeviceGuard guard;
  make_current(guard, self.device());
  TensorGeom g = geom_of(self);
  g.offset = 0;
  if (fusion::enabled()) fusion::release_dead();  // dead pending results free their blocks
  at::Tensor out = device_empty(g, self.device());
  // Adaptive eager: recorded into the pending group instead of enqueued.
  if (fusion::enabled() && fusion::try_record_binary(kFusionFn[static_cast<int>(kKind)], info.name,
                                                     out, self, other, alpha))
    return out;
  enqueue(kKind, info.name, out, self, other, alpha);
  return out;
}

template <Binary kKind>
at::Tensor& binary_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  if (!eligible(self, other)) {
    switch (kKind) {
      case Binary::Add:
        return at::compositeexplicitautogradnonfunctional::add_(self, other, alpha);
      case Binary::Sub:
        return at::compositeexplicitautogradnonfunctional::sub_(self, other, alpha);
      case Binary::Mul:
        return at::compositeexplicitautogradnonfunctional::mul_(self, other);
      case Binary::Div:
        return at::compositeexplicitautogradnonfunctional::div_(self, other);
    }
  }
  OpInfo& info = info_of<kKind>(true);
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  c10::OptionalDeviceGuard guard;
  make_current(guard, self.device());
  // Adaptive eager: in-place on a pending result is recorded too.
  if (fusion::enabled() && fusion::try_record_binary(kFusionFn[static_cast<int>(kKind)], info.name,
                                                     self, self, other, alpha))
    return self;
  enqueue(kKind, info.name, self, self, other, alpha);
  return self;
}

at::Tensor add(const at::Tensor& s, const at::Tensor& o, const c10::Scalar& a) {
  return binary<Binary::Add>(s, o, a);
}
at::Tensor sub(const at::Tensor& s, const at::Tensor& o, const c10::Scalar& a) {
  return binary<Binary::Sub>(s, o, a);
}
at::Tensor mul(const at::Tensor& s, const at::Tensor& o) { return binary<Binary::Mul>(s, o, 1); }
at::Tensor div(const at::Tensor& s, const at::Tensor& o) { return binary<Binary::Div>(s, o, 1); }
at::Tensor& add_(at::Tensor& s, const at::Tensor& o, const c10::Scalar& a) {
  return binary_<Binary::Add>(s, o, a);
}
at::Tensor& sub_(at::Tensor& s, const at::Tensor& o, const c10::Scalar& a) {
  return binary_<Binary::Sub>(s, o, a);
}
at::Tensor& mul_(at::Tensor& s, const at::Tensor& o) { return binary_<Binary::Mul>(s, o, 1); }
at::Tensor& div_(at::Tensor& s, const at::Tensor& o) { return binary_<Binary::Div>(s, o, 1); }

// fill_ / zero_ of a contiguous tensor: one flat fill in a work item; other layouts go to the
// boxed fallback.
at::Tensor& fill_impl(at::Tensor& self, const c10::Scalar& value, OpInfo& info,
                      const c10::OperatorHandle& op, bool zero) {
  if (!self.device().is_privateuseone() || !self.is_contiguous() || self.is_conj() ||
      self.is_neg() || self.is_complex()) {
    torch::jit::Stack stack{c10::IValue(self)};
    if (!zero) stack.emplace_back(value);
    neuron_fallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return self;
  }
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t numel = self.numel();
  const c10::ScalarType dtype = self.scalar_type();
  Flat flat{buffer_of(self), self.storage_offset()};
  c10::OptionalDeviceGuard guard;
  make_current(guard, self.device());
  enqueue_op(self.device(), info.name, [flat, numel, dtype, value] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    flat_cpu(flat, numel, dtype).fill_(value);
  });
  return self;
}

at::Tensor& fill_(at::Tensor& self, const c10::Scalar& value) {
  static OpInfo& info = op_info("aten::fill_", "Scalar");
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::fill_", "Scalar");
  return fill_impl(self, value, info, op, false);
}

at::Tensor& zero_(at::Tensor& self) {
  static OpInfo& info = op_info("aten::zero_", "");
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::zero_", "");
  return fill_impl(self, 0, info, op, true);
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("add.Tensor", TORCH_FN(ops::add));
  m.impl("sub.Tensor", TORCH_FN(ops::sub));
  m.impl("mul.Tensor", TORCH_FN(ops::mul));
  m.impl("div.Tensor", TORCH_FN(ops::div));
  m.impl("add_.Tensor", TORCH_FN(ops::add_));
  m.impl("sub_.Tensor", TORCH_FN(ops::sub_));
  m.impl("mul_.Tensor", TORCH_FN(ops::mul_));
  m.impl("div_.Tensor", TORCH_FN(ops::div_));
  m.impl("fill_.Scalar", TORCH_FN(ops::fill_));
  m.impl("zero_", TORCH_FN(ops::zero_));
}
