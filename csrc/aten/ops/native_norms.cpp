// Native RMS norm (csrc/kernels/rms_norm.h) for the neuron device, forward and backward.
// torch 2.13 registers aten::rms_norm as CompositeImplicitAutograd: above PrivateUse1 it is
// decomposed into pow/mean/rsqrt/mul, except for CUDA/MPS/XPU inputs, which the composite sends to
// aten::_fused_rms_norm (a hard-coded device check in ATen; PrivateUse1 cannot join it). So this
// file registers aten::rms_norm directly:
//  - AutogradPrivateUse1: a custom autograd Function whose forward and backward each enqueue ONE
//    work item running the native kernel (the backward is written in differentiable ATen ops
//    instead when a graph of the backward is wanted: create_graph=True / double backward);
//  - PrivateUse1: the forward alone (inference mode / below autograd).
// Cases the kernel does not cover (other dtypes, non-contiguous or empty inputs, the native
// kernel switch off) run ATen's composite, as before.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cfloat>
#include <stdexcept>
#include <string>

#include "aten/ops/native_kernels.h"
#include "kernels/cross_entropy.h"
#include "kernels/rms_norm.h"

namespace openneuron::aten {
namespace {

// ATen's composite rms_norm (at::native::rms_norm_symint is not exported from libtorch): the
// kernel the dispatcher holds for the CPU key is the CompositeImplicitAutograd one; its inner ops
// dispatch on the neuron tensors as usual (with autograd).
at::Tensor rms_norm_composite(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                              const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  static const auto op =
      find_op("aten::rms_norm", "")
          .typed<at::Tensor(const at::Tensor&, c10::SymIntArrayRef,
                            const std::optional<at::Tensor>&, std::optional<double>)>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), input, normalized_shape, weight,
                       eps);
}

// The number of normalized elements when (input, normalized_shape, weight) is a case the
// native kernel handles, else 0.
int64_t rms_supported(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                      const at::Tensor& w) {
  if (!native_kernels_enabled() || !kernel_operand(input) || !input.is_contiguous() ||
      input.numel() == 0 || normalized_shape.empty())
    return 0;
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const int64_t axis = input.dim() - k;
  if (axis < 0) return 0;
  int64_t n = 1;
  for (int64_t i = 0; i < k; ++i) {
    const auto s = normalized_shape[i].maybe_as_int();
    if (!s || input.size(axis + i) != *s) return 0;
    n *= *s;
  }
  if (n <= 0) return 0;
  if (w.defined()) {
    if (!kernel_operand(w) || w.device() != input.device() || !w.is_contiguous() || w.dim() != k)
      return 0;
    for (int64_t i = 0; i < k; ++i)
      if (w.size(i) != input.size(axis + i)) return 0;
  }
  return n;
}

float rms_eps(std::optional<double> eps) {
  // ATen: eps None = epsilon of the opmath type (float32 for float32 / bfloat16 / float16).
  return eps ? static_cast<float>(*eps) : FLT_EPSILON;
}

kernels::RmsNormTypes rms_types(const at::Tensor& x, const at::Tensor& w) {
  kernels::RmsNormTypes t;
  t.dtype = *kernel_dtype(x.scalar_type());
  t.wdtype = w.defined() ? *kernel_dtype(w.scalar_type()) : t.dtype;
  return t;
}

// y and float32 rstd (input.sizes()[:-k] x 1...) for a supported case.
std::pair<at::Tensor, at::Tensor> rms_forward_native(const at::Tensor& input, const at::Tensor& w,
                                                     int64_t n, int64_t k, float eps) {
  static OpInfo& info = op_info("aten::rms_norm", "");
  const int64_t rows = input.numel() / n;
  c10::SmallVector<int64_t, 5> stat_sizes(input.sizes().begin(), input.sizes().end() - k);
  stat_sizes.append(static_cast<size_t>(k), 1);
  at::Tensor out = empty_on(input.sizes(), input.scalar_type(), input.device());
  at::Tensor rstd = empty_on(stat_sizes, c10::ScalarType::Float, input.device());
  const kernels::RmsNormTypes t = rms_types(input, w);
  const void* x = ptr_of(input);
  const void* wp = ptr_of(w);
  void* y = ptr_of(out);
  auto* rp = static_cast<float*>(ptr_of(rstd));
  enqueue_native(info, input.device(),
                 [=] { kernels::rms_norm_forward(t, x, wp, y, rp, rows, n, eps); });
  return {out, rstd};
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const std::optional<at::Tensor>& weight_opt, int64_t n, int64_t k,
                            double eps) {
    // (weight is optional here: Function::apply treats an undefined at::Tensor as an input.)
    const at::Tensor weight = weight_opt.value_or(at::Tensor());
    auto [out, rstd] = rms_forward_native(input, weight, n, k, static_cast<float>(eps));
    ctx->save_for_backward({input, weight, rstd});
    ctx->saved_data["n"] = n;
    ctx->saved_data["k"] = k;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    const int64_t n = ctx->saved_data["n"].toInt();
    const int64_t k = ctx->saved_data["k"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool want_x = ctx->needs_input_grad(0);
    const bool want_w = w.defined() && ctx->needs_input_grad(1);
    at::Tensor dx, dw;
    const at::Tensor& grad = grads[0];
    if (!grad.defined() || (!want_x && !want_w)) return {dx, dw, {}, {}, {}};
    if (at::GradMode::is_enabled()) {
      // A differentiable backward (create_graph=True): the same formula in ATen ops, with rstd
      // recomputed from x so that it is part of the graph.
      const at::Tensor xf = x.reshape({-1, n}).to(at::kFloat);
      const at::Tensor gf = grad.reshape({-1, n}).to(at::kFloat);
      const at::Tensor rs = at::rsqrt(xf.pow(2).mean({1}, true) + eps);
      const at::Tensor xh = xf * rs;
      const at::Tensor gw = w.defined() ? gf * w.reshape({n}).to(at::kFloat) : gf;
      if (want_x) {
        dx = (rs * (gw - xh * (gw * xh).mean({1}, true))).to(x.scalar_type()).view(x.sizes());
      }
      if (want_w) dw = (gf * xh).sum({0}).to(w.scalar_type()).view(w.sizes());
      return {dx, dw, {}, {}, {}};
    }
    static OpInfo& info = op_info("aten::_rms_norm_backward (native)", "");
    const at::Tensor g = grad.contiguous();
    const int64_t rows = x.numel() / n;
    (void)k;
    if (want_x) dx = empty_on(x.sizes(), x.scalar_type(), x.device());
    if (want_w) dw = empty_on(w.sizes(), w.scalar_type(), x.device());
    const kernels::RmsNormTypes t = rms_types(x, w);
    const void* gp = ptr_of(g);
    const void* xp = ptr_of(x);
    const auto* rp = static_cast<const float*>(ptr_of(rstd));
    const void* wp = ptr_of(w);
    void* dxp = ptr_of(dx);
    void* dwp = ptr_of(dw);
    enqueue_native(info, x.device(),
                   [=] { kernels::rms_norm_backward(t, gp, xp, rp, wp, dxp, dwp, rows, n); });
    return {dx, dw, {}, {}, {}};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                             const std::optional<at::Tensor>& weight_opt,
                             std::optional<double> eps) {
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  const int64_t n = rms_supported(input, normalized_shape, w);
  if (n == 0) return rms_norm_composite(input, normalized_shape, weight_opt, eps);
  return RmsNormFunction::apply(input, weight_opt, n, static_cast<int64_t>(normalized_shape.size()),
                                static_cast<double>(rms_eps(eps)));
}

at::Tensor rms_norm_noautograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight_opt,
                               std::optional<double> eps) {
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  const int64_t n = rms_supported(input, normalized_shape, w);
  if (n == 0) return rms_norm_composite(input, normalized_shape, weight_opt, eps);
  return rms_forward_native(input, w, n, static_cast<int64_t>(normalized_shape.size()),
                            rms_eps(eps))
      .first;
}

// ---- cross-entropy ----------------------------------------------------------------------------
// aten::cross_entropy_loss is CompositeImplicitAutograd (log_softmax + nll_loss). For the common
// case (2-D logits, int64 class targets, no class weight, no label smoothing) a custom Function
// runs one fused forward and one fused backward work item (float32 logits, >= 512 classes).

using CrossEntropyFn = at::Tensor(const at::Tensor&, const at::Tensor&,
                                  const std::optional<at::Tensor>&, int64_t, c10::SymInt, double);

at::Tensor cross_entropy_composite(const at::Tensor& self, const at::Tensor& target,
                                   const std::optional<at::Tensor>& weight, int64_t reduction,
                                   c10::SymInt ignore_index, double label_smoothing) {
  static const auto op = find_op("aten::cross_entropy_loss", "").typed<CrossEntropyFn>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self, target, weight, reduction,
                       std::move(ignore_index), label_smoothing);
}

// Measured (benchmarks/kernels.py, /work/notes/norms.md): fwd+bwd [2048, 1000] 0.46-0.77x the
// composite path, but [512, 256] 1.1-1.35x (slower); below this many classes the composite runs.
// bfloat16 [2048, 1000] measured 1.04-1.12x (slower): float32 logits only.
constexpr int64_t kCrossEntropyMinClasses = 512;

bool ce_supported(const at::Tensor& self, const at::Tensor& target,
                  const std::optional<at::Tensor>& weight, int64_t reduction,
                  const c10::SymInt& ignore_index, double label_smoothing) {
  return native_kernels_enabled() && kernel_operand(self) &&
         self.scalar_type() == c10::ScalarType::Float && self.is_contiguous() && self.dim() == 2 &&
         self.size(0) > 0 && self.size(1) >= kCrossEntropyMinClasses && on_neuron(target) &&
         target.device() == self.device() && target.scalar_type() == c10::ScalarType::Long &&
         target.dim() == 1 && target.size(0) == self.size(0) && target.is_contiguous() &&
         !(weight && weight->defined()) && label_smoothing == 0.0 && reduction >= 0 &&
         reduction <= 2 && ignore_index.maybe_as_int().has_value();
}

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self,
                            const at::Tensor& target, int64_t reduction, int64_t ignore_index) {
    static OpInfo& info = op_info("aten::cross_entropy_loss", "");
    const int64_t rows = self.size(0), classes = self.size(1);
    const c10::Device dev = self.device();
    at::Tensor lse = empty_on({rows}, c10::ScalarType::Float, dev);
    at::Tensor per_row = empty_on({rows}, c10::ScalarType::Float, dev);
    at::Tensor out = reduction == 0 ? empty_on({rows}, self.scalar_type(), dev)
                                    : empty_on({}, self.scalar_type(), dev);
    const kernels::DType dt = *kernel_dtype(self.scalar_type());
    const void* x = ptr_of(self);
    const auto* t = static_cast<const int64_t*>(ptr_of(target));
    auto* lp = static_cast<float*>(ptr_of(lse));
    auto* pr = static_cast<float*>(ptr_of(per_row));
    void* op = ptr_of(out);
    enqueue_native(info, dev, [=] {
      const int64_t bad =
          kernels::cross_entropy_forward(dt, x, t, pr, lp, rows, classes, ignore_index);
      if (bad > 0) {
        throw std::runtime_error("cross_entropy: " + std::to_string(bad) +
                                 " targets are out of range [0, " + std::to_string(classes) +
                                 ") (the number of classes, logits.size(1))");
      }
      if (reduction == 0) {
        kernels::store_floats(dt, pr, op, rows);
        return;
      }
      float sum = 0.0f;  // fixed order: deterministic
      int64_t count = 0;
      for (int64_t r = 0; r < rows; ++r) {
        sum += pr[r];
        count += t[r] != ignore_index;
      }
      const float v = reduction == 1 ? sum / static_cast<float>(count) : sum;
      kernels::store_floats(dt, &v, op, 1);
    });
    ctx->save_for_backward({self, target, lse});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& self = saved[0];
    const at::Tensor& target = saved[1];
    const at::Tensor& lse = saved[2];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return {at::Tensor(), {}, {}, {}};
    if (at::GradMode::is_enabled()) {
      // Differentiable backward (create_graph=True) in ATen ops.
      const at::Tensor valid = target.ne(ignore_index);
      const at::Tensor safe_t = at::where(valid, target, at::zeros_like(target));
      const at::Tensor p = at::softmax(self.to(at::kFloat), 1);
      const at::Tensor onehot = at::one_hot(safe_t, self.size(1)).to(at::kFloat);
      at::Tensor g = grads[0].to(at::kFloat);
      if (reduction == 1) g = g / valid.sum().to(at::kFloat);
      g = (reduction == 0 ? g : g.expand({self.size(0)})) * valid.to(at::kFloat);
      return {((p - onehot) * g.unsqueeze(1)).to(self.scalar_type()), {}, {}, {}};
    }
    static OpInfo& info = op_info("aten::_cross_entropy_loss_backward (native)", "");
    const int64_t rows = self.size(0), classes = self.size(1);
    const at::Tensor gf = grads[0].contiguous();  // the loss's dtype == the logits' dtype
    at::Tensor dx = empty_on(self.sizes(), self.scalar_type(), self.device());
    const kernels::DType dt = *kernel_dtype(self.scalar_type());
    const void* x = ptr_of(self);
    const auto* t = static_cast<const int64_t*>(ptr_of(target));
    const auto* lp = static_cast<const float*>(ptr_of(lse));
    const void* gp = ptr_of(gf);
    void* dxp = ptr_of(dx);
    enqueue_native(info, self.device(), [=] {
      float mul = 1.0f;
      if (reduction == 1) {
        int64_t count = 0;
        for (int64_t r = 0; r < rows; ++r) count += t[r] != ignore_index;
        mul = 1.0f / static_cast<float>(count);
      }
      kernels::cross_entropy_backward(dt, x, t, lp, gp, reduction == 0 ? 1 : 0, mul, dxp, rows,
                                      classes, ignore_index);
    });
    return {dx, {}, {}, {}};
  }
};

at::Tensor cross_entropy_autograd(const at::Tensor& self, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight, int64_t reduction,
                                  c10::SymInt ignore_index, double label_smoothing) {
  if (!ce_supported(self, target, weight, reduction, ignore_index, label_smoothing)) {
    return cross_entropy_composite(self, target, weight, reduction, std::move(ignore_index),
                                   label_smoothing);
  }
  return CrossEntropyFunction::apply(self, target, reduction, *ignore_index.maybe_as_int());
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN(openneuron::aten::rms_norm_autograd));
  m.impl("cross_entropy_loss", TORCH_FN(openneuron::aten::cross_entropy_autograd));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN(openneuron::aten::rms_norm_noautograd));
}
