// The _foreach_* ops that torch.optim's default (foreach) Adam/AdamW step uses, for the neuron
// device: one work item per list (csrc/kernels/foreach.h). Without these, ATen's
// CompositeExplicitAutograd "slow path" turns each list op into one op per tensor (52 work
// items for a 52-parameter model). Results are bitwise equal to CPU's (same float operations;
// sqrt runs ATen's CPU kernel per tensor inside the one work item). Lists the kernel does not cover
// (mixed dtypes, non-contiguous or non-float tensors, complex scalars) run that same per-tensor
// loop here.
#include <torch/library.h>

#include <stdexcept>
#include <vector>

#include "aten/ops/native_kernels.h"
#include "kernels/foreach.h"

namespace openneuron::aten {
namespace {

using kernels::ForeachOp;

// Whether every tensor of the lists is a contiguous neuron tensor of self[0]'s dtype and device
// with the numel of its self entry.
bool lists_ok(at::TensorList self, std::initializer_list<at::TensorList> others) {
  if (!native_kernels_enabled() || self.empty() || !kernel_operand(self[0])) return false;
  const at::Tensor& t0 = self[0];
  auto same = [&](const at::Tensor& t, int64_t numel) {
    return kernel_operand(t) && t.device() == t0.device() && t.scalar_type() == t0.scalar_type() &&
           t.is_contiguous() && t.numel() == numel;
  };
  for (const at::TensorList& l : others)
    if (l.size() != self.size()) return false;
  for (size_t i = 0; i < self.size(); ++i) {
    if (!same(self[i], self[i].numel())) return false;
    for (const at::TensorList& l : others)
      if (!same(l[i], self[i].numel())) return false;
  }
  return true;
}

bool real_scalar(const at::Scalar& s) { return !s.isComplex(); }

void check_sizes(const char* op, at::TensorList self, at::TensorList other) {
  TORCH_CHECK(self.size() == other.size(), op,
              ": tensor lists must have the same number of tensors, got ", self.size(), " and ",
              other.size());
}

OpInfo& info_of(ForeachOp op) {
  static OpInfo& mul = op_info("aten::_foreach_mul_", "Scalar");
  static OpInfo& add = op_info("aten::_foreach_add_", "Scalar");
  static OpInfo& div = op_info("aten::_foreach_div_", "ScalarList");
  static OpInfo& lerp = op_info("aten::_foreach_lerp_", "Scalar");
  static OpInfo& addcmul = op_info("aten::_foreach_addcmul_", "Scalar");
  static OpInfo& addcdiv = op_info("aten::_foreach_addcdiv_", "ScalarList");
  static OpInfo& sqrt = op_info("aten::_foreach_sqrt", "");
  switch (op) {
    case ForeachOp::MulScalar:
      return mul;
    case ForeachOp::AddScalar:
      return add;
    case ForeachOp::DivScalar:
      return div;
    case ForeachOp::Lerp:
      return lerp;
    case ForeachOp::Addcmul:
      return addcmul;
    case ForeachOp::Addcdiv:
      return addcdiv;
    case ForeachOp::Sqrt:
      break;
  }
  return sqrt;
}

void launch(ForeachOp op, at::TensorList self, at::TensorList out, at::TensorList b,
            at::TensorList c, const std::vector<float>& scalars) {
  OpInfo* info = &info_of(op);
  std::vector<kernels::ForeachTensor> ts(self.size());
  for (size_t i = 0; i < self.size(); ++i) {
    kernels::ForeachTensor& t = ts[i];
    t.a = ptr_of(self[i]);
    t.out = ptr_of(out[i]);
    t.b = b.empty() ? nullptr : ptr_of(b[i]);
    t.c = c.empty() ? nullptr : ptr_of(c[i]);
    t.s = scalars.size() == 1 ? scalars[0] : scalars[i];
    t.numel = self[i].numel();
  }
  const kernels::DType dt = *kernel_dtype(self[0].scalar_type());
  enqueue_native(*info, self[0].device(), [op, dt, ts = std::move(ts)] {
    kernels::foreach_apply(op, dt, ts.data(), ts.size());
  });
}

std::vector<float> to_floats(at::ArrayRef<at::Scalar> s) {
  std::vector<float> out;
  out.reserve(s.size());
  for (const auto& x : s) out.push_back(static_cast<float>(x.toDouble()));
  return out;
}

// NOTE: ATen's CPU _foreach_add_(Scalar) and _foreach_mul_(Scalar) round the scalar to a
// bf16/fp16 tensor's dtype first (its div, lerp, addcmul and addcdiv use it as float, and so
// does the per-tensor mul_): same here, so results stay bitwise.
float scalar_in_dtype(const at::Tensor& t, const at::Scalar& s) {
  const float v = static_cast<float>(s.toDouble());
  if (t.scalar_type() == c10::ScalarType::BFloat16) return static_cast<float>(c10::BFloat16(v));
  if (t.scalar_type() == c10::ScalarType::Half) return static_cast<float>(c10::Half(v));
  return v;
}

void mul_scalar_(at::TensorList self, const at::Scalar& s) {
  if (!lists_ok(self, {}) || !real_scalar(s)) {
    for (const auto& t : self) const_cast<at::Tensor&>(t).mul_(s);
    return;
  }
  launch(ForeachOp::MulScalar, self, self, {}, {}, {scalar_in_dtype(self[0], s)});
}

void add_scalar_(at::TensorList self, const at::Scalar& s) {
  if (!lists_ok(self, {}) || !real_scalar(s)) {
    for (const auto& t : self) const_cast<at::Tensor&>(t).add_(s);
    return;
  }
  launch(ForeachOp::AddScalar, self, self, {}, {}, {scalar_in_dtype(self[0], s)});
}

void div_scalarlist_(at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  TORCH_CHECK(scalars.size() == self.size(), "_foreach_div_: got ", scalars.size(), " scalars for ",
              self.size(), " tensors");
  bool ok = lists_ok(self, {});
  for (const auto& s : scalars) ok = ok && real_scalar(s);
  if (!ok) {
    for (size_t i = 0; i < self.size(); ++i) const_cast<at::Tensor&>(self[i]).div_(scalars[i]);
    return;
  }
  launch(ForeachOp::DivScalar, self, self, {}, {}, to_floats(scalars));
}

void lerp_scalar_(at::TensorList self, at::TensorList ends, const at::Scalar& weight) {
  check_sizes("_foreach_lerp_", self, ends);
  if (!lists_ok(self, {ends}) || !real_scalar(weight)) {
    for (size_t i = 0; i < self.size(); ++i)
      const_cast<at::Tensor&>(self[i]).lerp_(ends[i], weight);
    return;
  }
  launch(ForeachOp::Lerp, self, self, ends, {}, {static_cast<float>(weight.toDouble())});
}

void addcmul_scalar_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                     const at::Scalar& value) {
  check_sizes("_foreach_addcmul_", self, t1);
  check_sizes("_foreach_addcmul_", self, t2);
  if (!lists_ok(self, {t1, t2}) || !real_scalar(value)) {
    for (size_t i = 0; i < self.size(); ++i)
      const_cast<at::Tensor&>(self[i]).addcmul_(t1[i], t2[i], value);
    return;
  }
  launch(ForeachOp::Addcmul, self, self, t1, t2, {static_cast<float>(value.toDouble())});
}

void addcdiv_scalarlist_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                         at::ArrayRef<at::Scalar> scalars) {
  check_sizes("_foreach_addcdiv_", self, t1);
  check_sizes("_foreach_addcdiv_", self, t2);
  TORCH_CHECK(scalars.size() == self.size(), "_foreach_addcdiv_: got ", scalars.size(),
              " scalars for ", self.size(), " tensors");
  bool ok = lists_ok(self, {t1, t2});
  for (const auto& s : scalars) ok = ok && real_scalar(s);
  if (!ok) {
    for (size_t i = 0; i < self.size(); ++i)
      const_cast<at::Tensor&>(self[i]).addcdiv_(t1[i], t2[i], scalars[i]);
    return;
  }
  launch(ForeachOp::Addcdiv, self, self, t1, t2, to_floats(scalars));
}

// NOTE: sqrt runs ATen's own CPU sqrt per tensor inside the one work item: ATen's vectorized
// sqrt (Sleef, 0.5 ulp) is not always the correctly rounded std::sqrt, and the optimizer's
// results must stay bitwise equal to CPU's.
std::vector<at::Tensor> sqrt_(at::TensorList self) {
  std::vector<at::Tensor> out;
  out.reserve(self.size());
  if (!lists_ok(self, {})) {
    for (const auto& t : self) out.push_back(at::sqrt(t));
    return out;
  }
  struct View {
    DeviceBuffer in, out;
    TensorGeom in_geom, out_geom;
  };
  std::vector<View> views;
  views.reserve(self.size());
  for (const auto& t : self) {
    out.push_back(empty_on(t.sizes(), t.scalar_type(), t.device()));
    views.push_back({buffer_of(t), buffer_of(out.back()), geom_of(t), geom_of(out.back())});
  }
  enqueue_native(info_of(ForeachOp::Sqrt), self[0].device(), [views = std::move(views)] {
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (const View& v : views) {
        at::Tensor o = host_view_fresh(v.out, v.out_geom);
        at::sqrt_out(o, host_view_fresh(v.in, v.in_geom));
      }
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  });
  return out;
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("_foreach_mul_.Scalar", TORCH_FN(ops::mul_scalar_));
  m.impl("_foreach_add_.Scalar", TORCH_FN(ops::add_scalar_));
  m.impl("_foreach_div_.ScalarList", TORCH_FN(ops::div_scalarlist_));
  m.impl("_foreach_lerp_.Scalar", TORCH_FN(ops::lerp_scalar_));
  m.impl("_foreach_addcmul_.Scalar", TORCH_FN(ops::addcmul_scalar_));
  m.impl("_foreach_addcdiv_.ScalarList", TORCH_FN(ops::addcdiv_scalarlist_));
  m.impl("_foreach_sqrt", TORCH_FN(ops::sqrt_));
}
