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
// kernel switch off) run ATen's composite, as before. Under tracing (FakeTensors: torch.compile,
// torch.export) the Functions call the kernels as ops, openneuron::rms_norm_* and
// cross_entropy_*, which have Meta kernels and stay one node in the graph (native_route).
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

// Whether (input, normalized_shape, weight) is a case the native kernel handles. SymInt-safe:
// FakeTensors under torch.compile(dynamic=...) have symbolic sizes (comparisons add guards).
bool rms_supported(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                   const at::Tensor& w) {
  if (!native_kernels_enabled() || !kernel_operand(input) || normalized_shape.empty() ||
      input.sym_numel() == 0 || !input.is_contiguous())
    return false;
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const int64_t axis = input.dim() - k;
  if (axis < 0) return false;
  for (int64_t i = 0; i < k; ++i)
    if (input.sym_size(axis + i) != normalized_shape[i]) return false;
  if (w.defined()) {
    if (!kernel_operand(w) || w.device() != input.device() || w.dim() != k || !w.is_contiguous())
      return false;
    for (int64_t i = 0; i < k; ++i)
      if (w.sym_size(i) != input.sym_size(axis + i)) return false;
  }
  return true;
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

// rstd's sizes: input.sizes()[:-k] followed by k ones.
c10::SmallVector<c10::SymInt, 5> rms_stat_sizes(const at::Tensor& input, int64_t k) {
  c10::SmallVector<c10::SymInt, 5> s(input.sym_sizes().begin(), input.sym_sizes().end() - k);
  s.append(static_cast<size_t>(k), c10::SymInt(1));
  return s;
}

// The checks the openneuron::rms_norm_* ops make on what they are given (they are public ops:
// torch.ops.openneuron.rms_norm_forward may be called with anything). device: also check that
// the tensors are neuron tensors of the kernel's dtypes (not for the Meta kernels).
void rms_check(const char* op, const at::Tensor& input, int64_t k, const at::Tensor& w,
               bool device) {
  TORCH_CHECK(k >= 1 && k <= input.dim(), op, ": k (the number of normalized dims) must be in [1, ",
              input.dim(), "] for an input of shape ", input.sym_sizes(), ", got ", k);
  if (w.defined()) {
    TORCH_CHECK(w.dim() == k && w.sym_sizes().equals(input.sym_sizes().slice(input.dim() - k)), op,
                ": weight of shape ", w.sym_sizes(), " does not match the last ", k,
                " dims of input ", input.sym_sizes());
  }
  if (device) {
    TORCH_CHECK(kernel_operand(input) &&
                    (!w.defined() || (kernel_operand(w) && w.device() == input.device())),
                op, ": expected float32/bfloat16/float16 neuron tensors, got input ",
                input.scalar_type(), " on ", input.device(), ", weight ",
                w.defined() ? w.scalar_type() : input.scalar_type(), " on ",
                w.defined() ? w.device() : input.device());
  }
}

// y and float32 rstd for contiguous neuron tensors of a supported case.
std::tuple<at::Tensor, at::Tensor> rms_forward_native(const at::Tensor& input, const at::Tensor& w,
                                                      int64_t k, float eps) {
  static OpInfo& info = op_info("aten::rms_norm", "");
  c10::SmallVector<int64_t, 5> stat_sizes(input.sizes().begin(), input.sizes().end() - k);
  stat_sizes.append(static_cast<size_t>(k), 1);
  at::Tensor out = empty_on(input.sizes(), input.scalar_type(), input.device());
  at::Tensor rstd = empty_on(stat_sizes, c10::ScalarType::Float, input.device());
  const int64_t n = c10::multiply_integers(input.sizes().end() - k, input.sizes().end());
  if (out.numel() == 0 || n == 0) return {out, rstd};
  const int64_t rows = input.numel() / n;
  const kernels::RmsNormTypes t = rms_types(input, w);
  const void* x = ptr_of(input);
  const void* wp = ptr_of(w);
  void* y = ptr_of(out);
  auto* rp = static_cast<float*>(ptr_of(rstd));
  enqueue_native(info, input.device(),
                 [=] { kernels::rms_norm_forward(t, x, wp, y, rp, rows, n, eps); });
  return {out, rstd};
}

// (dx, dw) for contiguous neuron tensors; an output not asked for (mask) is undefined.
std::tuple<at::Tensor, at::Tensor> rms_backward_native(const at::Tensor& g, const at::Tensor& x,
                                                       const at::Tensor& rstd, const at::Tensor& w,
                                                       int64_t k, std::array<bool, 2> mask) {
  static OpInfo& info = op_info("aten::_rms_norm_backward (native)", "");
  at::Tensor dx, dw;
  if (mask[0]) dx = empty_on(x.sizes(), x.scalar_type(), x.device());
  if (mask[1] && w.defined()) dw = empty_on(w.sizes(), w.scalar_type(), x.device());
  const int64_t n = c10::multiply_integers(x.sizes().end() - k, x.sizes().end());
  if (n == 0 || x.numel() == 0) {
    if (dw.defined()) dw.zero_();  // a sum over no rows
    return {dx, dw};
  }
  if (!dx.defined() && !dw.defined()) return {dx, dw};
  const int64_t rows = x.numel() / n;
  const kernels::RmsNormTypes t = rms_types(x, w);
  const void* gp = ptr_of(g);
  const void* xp = ptr_of(x);
  const auto* rp = static_cast<const float*>(ptr_of(rstd));
  const void* wp = ptr_of(w);
  void* dxp = ptr_of(dx);
  void* dwp = ptr_of(dw);
  enqueue_native(info, x.device(),
                 [=] { kernels::rms_norm_backward(t, gp, xp, rp, wp, dxp, dwp, rows, n); });
  return {dx, dw};
}

// ---- openneuron::rms_norm_forward / rms_norm_backward: the kernel as ops (what a traced graph
// holds), PrivateUse1 and Meta kernels.
std::tuple<at::Tensor, at::Tensor> rms_forward_op(const at::Tensor& input, int64_t k,
                                                  const std::optional<at::Tensor>& weight,
                                                  double eps) {
  const at::Tensor w = weight.value_or(at::Tensor());
  rms_check("openneuron::rms_norm_forward", input, k, w, true);
  return rms_forward_native(input.contiguous(), w.defined() ? w.contiguous() : w, k,
                            static_cast<float>(eps));
}

std::tuple<at::Tensor, at::Tensor> rms_forward_meta(const at::Tensor& input, int64_t k,
                                                    const std::optional<at::Tensor>& weight,
                                                    double eps) {
  rms_check("openneuron::rms_norm_forward", input, k, weight.value_or(at::Tensor()), false);
  return {at::empty_symint(input.sym_sizes(), input.options()),
          at::empty_symint(rms_stat_sizes(input, k), input.options().dtype(at::kFloat))};
}

void rms_backward_check(const char* op, const at::Tensor& g, const at::Tensor& x,
                        const at::Tensor& rstd, const at::Tensor& w, int64_t k, bool device) {
  rms_check(op, x, k, w, device);
  TORCH_CHECK(g.sym_sizes().equals(x.sym_sizes()) && g.scalar_type() == x.scalar_type(), op,
              ": grad ", g.sym_sizes(), " ", g.scalar_type(), " must have input's shape ",
              x.sym_sizes(), " and dtype ", x.scalar_type());
  TORCH_CHECK(rstd.sym_sizes().equals(rms_stat_sizes(x, k)) && rstd.scalar_type() == at::kFloat, op,
              ": rstd must be float32 of shape ", c10::SymIntArrayRef(rms_stat_sizes(x, k)),
              ", got ", rstd.scalar_type(), " ", rstd.sym_sizes());
  if (device) {
    TORCH_CHECK(
        on_neuron(g) && on_neuron(rstd) && g.device() == x.device() && rstd.device() == x.device(),
        op, ": grad and rstd must be on ", x.device());
  }
}

std::tuple<at::Tensor, at::Tensor> rms_backward_op(const at::Tensor& grad, const at::Tensor& input,
                                                   const at::Tensor& rstd,
                                                   const std::optional<at::Tensor>& weight,
                                                   int64_t k, std::array<bool, 2> mask) {
  const at::Tensor w = weight.value_or(at::Tensor());
  rms_backward_check("openneuron::rms_norm_backward", grad, input, rstd, w, k, true);
  return rms_backward_native(grad.contiguous(), input.contiguous(), rstd.contiguous(),
                             w.defined() ? w.contiguous() : w, k, mask);
}

std::tuple<at::Tensor, at::Tensor> rms_backward_meta(const at::Tensor& grad,
                                                     const at::Tensor& input,
                                                     const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& weight,
                                                     int64_t k, std::array<bool, 2> mask) {
  const at::Tensor w = weight.value_or(at::Tensor());
  rms_backward_check("openneuron::rms_norm_backward", grad, input, rstd, w, k, false);
  at::Tensor dx, dw;
  if (mask[0]) dx = at::empty_symint(input.sym_sizes(), input.options());
  if (mask[1] && w.defined()) dw = at::empty_symint(w.sym_sizes(), w.options());
  return {dx, dw};
}

using RmsForwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t,
                                                        const std::optional<at::Tensor>&, double);
using RmsBackwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&,
                                                         const std::optional<at::Tensor>&, int64_t,
                                                         std::array<bool, 2>);

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  // direct: real neuron tensors (NativeRoute::kDirect): enqueue the kernel without a dispatch.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const std::optional<at::Tensor>& weight_opt, int64_t k, double eps,
                            bool direct) {
    // (weight is optional here: Function::apply treats an undefined at::Tensor as an input.)
    const at::Tensor weight = weight_opt.value_or(at::Tensor());
    static const auto op = find_op("openneuron::rms_norm_forward", "").typed<RmsForwardFn>();
    auto [out, rstd] = direct ? rms_forward_native(input, weight, k, static_cast<float>(eps))
                              : op.call(input, k, weight_opt, eps);
    ctx->save_for_backward({input, weight, rstd});
    ctx->saved_data["k"] = k;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["direct"] = direct;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    const int64_t k = ctx->saved_data["k"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool want_x = ctx->needs_input_grad(0);
    const bool want_w = w.defined() && ctx->needs_input_grad(1);
    const at::Tensor& grad = grads[0];
    if (!grad.defined() || (!want_x && !want_w)) return {at::Tensor(), at::Tensor(), {}, {}, {}};
    if (at::GradMode::is_enabled()) {
      // A differentiable backward (create_graph=True): the same formula in ATen ops, with rstd
      // recomputed from x so that it is part of the graph.
      const std::vector<int64_t> dims = [&] {
        std::vector<int64_t> d;
        for (int64_t i = x.dim() - k; i < x.dim(); ++i) d.push_back(i);
        return d;
      }();
      const at::Tensor xf = x.to(at::kFloat);
      const at::Tensor gf = grad.to(at::kFloat);
      const at::Tensor rs = at::rsqrt(xf.pow(2).mean(dims, true) + eps);
      const at::Tensor xh = xf * rs;
      const at::Tensor gw = w.defined() ? gf * w.to(at::kFloat) : gf;
      at::Tensor dx, dw;
      if (want_x) dx = (rs * (gw - xh * (gw * xh).mean(dims, true))).to(x.scalar_type());
      if (want_w) {
        std::vector<int64_t> lead;
        for (int64_t i = 0; i < x.dim() - k; ++i) lead.push_back(i);
        dw = (gf * xh).sum(lead).to(w.scalar_type());
      }
      return {dx, dw, {}, {}, {}};
    }
    static const auto op = find_op("openneuron::rms_norm_backward", "").typed<RmsBackwardFn>();
    const std::array<bool, 2> mask{want_x, want_w};
    auto [dx, dw] =
        ctx->saved_data["direct"].toBool() && native_route({&grad}) == NativeRoute::kDirect
            ? rms_backward_native(grad.contiguous(), x, rstd, w, k, mask)
            : op.call(grad, x, rstd, w.defined() ? std::optional<at::Tensor>(w) : std::nullopt, k,
                      mask);
    return {dx, dw, {}, {}, {}};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                             const std::optional<at::Tensor>& weight_opt,
                             std::optional<double> eps) {
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  const NativeRoute route = native_route({&input, &w});
  if (route == NativeRoute::kComposite || !rms_supported(input, normalized_shape, w))
    return rms_norm_composite(input, normalized_shape, weight_opt, eps);
  return RmsNormFunction::apply(input, weight_opt, static_cast<int64_t>(normalized_shape.size()),
                                static_cast<double>(rms_eps(eps)), route == NativeRoute::kDirect);
}

at::Tensor rms_norm_noautograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight_opt,
                               std::optional<double> eps) {
  // Below autograd: real neuron tensors (FakeTensors and wrappers are handled at keys above).
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  if (!rms_supported(input, normalized_shape, w))
    return rms_norm_composite(input, normalized_shape, weight_opt, eps);
  return std::get<0>(
      rms_forward_native(input, w, static_cast<int64_t>(normalized_shape.size()), rms_eps(eps)));
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

// Measured (benchmarks/kernels.py): fwd+bwd [2048, 1000] 0.46-0.77x the
// composite path, but [512, 256] 1.1-1.35x (slower); below this many classes the composite runs.
// bfloat16 [2048, 1000] measured 1.04-1.12x (slower): float32 logits only.
constexpr int64_t kCrossEntropyMinClasses = 512;

// SymInt-safe (see rms_supported).
bool ce_supported(const at::Tensor& self, const at::Tensor& target,
                  const std::optional<at::Tensor>& weight, int64_t reduction,
                  const c10::SymInt& ignore_index, double label_smoothing) {
  return native_kernels_enabled() && kernel_operand(self) &&
         self.scalar_type() == c10::ScalarType::Float && self.dim() == 2 &&
         self.sym_size(1) >= kCrossEntropyMinClasses && self.sym_size(0) > 0 &&
         self.is_contiguous() && on_neuron(target) && target.device() == self.device() &&
         target.scalar_type() == c10::ScalarType::Long && target.dim() == 1 &&
         target.sym_size(0) == self.sym_size(0) && target.is_contiguous() &&
         !(weight && weight->defined()) && label_smoothing == 0.0 && reduction >= 0 &&
         reduction <= 2 && ignore_index.maybe_as_int().has_value();
}

// The checks of the openneuron::cross_entropy_* ops (see rms_check).
void ce_check(const char* op, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
              bool device) {
  TORCH_CHECK(self.dim() == 2 && self.scalar_type() == c10::ScalarType::Float, op,
              ": expected float32 logits [rows, classes], got ", self.scalar_type(), " ",
              self.sym_sizes());
  TORCH_CHECK(target.dim() == 1 && target.scalar_type() == c10::ScalarType::Long &&
                  target.sym_size(0) == self.sym_size(0),
              op, ": expected int64 class targets [", self.sym_size(0), "], got ",
              target.scalar_type(), " ", target.sym_sizes());
  TORCH_CHECK(reduction >= 0 && reduction <= 2, op,
              ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  if (device) {
    TORCH_CHECK(on_neuron(self) && target.device() == self.device(), op,
                ": logits and targets must be on one neuron device, got ", self.device(), " and ",
                target.device());
  }
}

// (loss, float32 logsumexp per row) for contiguous neuron tensors.
std::tuple<at::Tensor, at::Tensor> ce_forward_native(const at::Tensor& self,
                                                     const at::Tensor& target, int64_t reduction,
                                                     int64_t ignore_index) {
  static OpInfo& info = op_info("aten::cross_entropy_loss", "");
  const int64_t rows = self.size(0), classes = self.size(1);
  const c10::Device dev = self.device();
  at::Tensor lse = empty_on({rows}, c10::ScalarType::Float, dev);
  at::Tensor out = reduction == 0 ? empty_on({rows}, self.scalar_type(), dev)
                                  : empty_on({}, self.scalar_type(), dev);
  if (rows == 0 || classes == 0) {
    // ATen: mean over no rows is nan, sum 0; no classes: the kernel has nothing to run on.
    TORCH_CHECK(rows == 0, "cross_entropy: logits have 0 classes (", self.sizes(), ")");
    if (reduction != 0) out.fill_(reduction == 1 ? NAN : 0.0);
    return {out, lse};
  }
  at::Tensor per_row = empty_on({rows}, c10::ScalarType::Float, dev);
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
  return {out, lse};
}

// d loss / d logits for contiguous neuron tensors; grad is the loss's gradient ([rows] for
// reduction none, else a scalar).
at::Tensor ce_backward_native(const at::Tensor& grad, const at::Tensor& self,
                              const at::Tensor& target, const at::Tensor& lse, int64_t reduction,
                              int64_t ignore_index) {
  static OpInfo& info = op_info("aten::_cross_entropy_loss_backward (native)", "");
  const int64_t rows = self.size(0), classes = self.size(1);
  at::Tensor dx = empty_on(self.sizes(), self.scalar_type(), self.device());
  if (dx.numel() == 0) return dx;
  const kernels::DType dt = *kernel_dtype(self.scalar_type());
  const void* x = ptr_of(self);
  const auto* t = static_cast<const int64_t*>(ptr_of(target));
  const auto* lp = static_cast<const float*>(ptr_of(lse));
  const void* gp = ptr_of(grad);
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
  return dx;
}

// ---- openneuron::cross_entropy_forward / cross_entropy_backward (see the rms_norm ops).
std::tuple<at::Tensor, at::Tensor> ce_forward_op(const at::Tensor& self, const at::Tensor& target,
                                                 int64_t reduction, int64_t ignore_index) {
  ce_check("openneuron::cross_entropy_forward", self, target, reduction, true);
  return ce_forward_native(self.contiguous(), target.contiguous(), reduction, ignore_index);
}

std::tuple<at::Tensor, at::Tensor> ce_forward_meta(const at::Tensor& self, const at::Tensor& target,
                                                   int64_t reduction, int64_t ignore_index) {
  ce_check("openneuron::cross_entropy_forward", self, target, reduction, false);
  at::Tensor out = reduction == 0 ? at::empty_symint({self.sym_size(0)}, self.options())
                                  : at::empty({}, self.options());
  return {out, at::empty_symint({self.sym_size(0)}, self.options().dtype(at::kFloat))};
}

void ce_backward_check(const char* op, const at::Tensor& grad, const at::Tensor& self,
                       const at::Tensor& target, const at::Tensor& lse, int64_t reduction,
                       bool device) {
  ce_check(op, self, target, reduction, device);
  TORCH_CHECK(grad.scalar_type() == self.scalar_type() &&
                  (reduction == 0 ? grad.dim() == 1 && grad.sym_size(0) == self.sym_size(0)
                                  : grad.sym_numel() == 1),
              op, ": grad must be the loss's gradient (", self.scalar_type(),
              reduction == 0 ? " [rows]" : " scalar", "), got ", grad.scalar_type(), " ",
              grad.sym_sizes());
  TORCH_CHECK(lse.dim() == 1 && lse.sym_size(0) == self.sym_size(0) &&
                  lse.scalar_type() == c10::ScalarType::Float,
              op, ": lse must be float32 [", self.sym_size(0), "], got ", lse.scalar_type(), " ",
              lse.sym_sizes());
  if (device) {
    TORCH_CHECK(grad.device() == self.device() && lse.device() == self.device(), op,
                ": grad and lse must be on ", self.device());
  }
}

at::Tensor ce_backward_op(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                          const at::Tensor& lse, int64_t reduction, int64_t ignore_index) {
  ce_backward_check("openneuron::cross_entropy_backward", grad, self, target, lse, reduction, true);
  return ce_backward_native(grad.contiguous(), self.contiguous(), target.contiguous(),
                            lse.contiguous(), reduction, ignore_index);
}

at::Tensor ce_backward_meta(const at::Tensor& grad, const at::Tensor& self,
                            const at::Tensor& target, const at::Tensor& lse, int64_t reduction,
                            int64_t ignore_index) {
  ce_backward_check("openneuron::cross_entropy_backward", grad, self, target, lse, reduction,
                    false);
  return at::empty_symint(self.sym_sizes(), self.options());
}

using CeForwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       int64_t, int64_t);
using CeBackwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, int64_t, int64_t);

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  // direct: see RmsNormFunction.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self,
                            const at::Tensor& target, int64_t reduction, int64_t ignore_index,
                            bool direct) {
    static const auto op = find_op("openneuron::cross_entropy_forward", "").typed<CeForwardFn>();
    auto [out, lse] = direct ? ce_forward_native(self, target, reduction, ignore_index)
                             : op.call(self, target, reduction, ignore_index);
    ctx->save_for_backward({self, target, lse});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["direct"] = direct;
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
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return {at::Tensor(), {}, {}, {}, {}};
    if (at::GradMode::is_enabled()) {
      // Differentiable backward (create_graph=True) in ATen ops.
      const at::Tensor valid = target.ne(ignore_index);
      const at::Tensor safe_t = at::where(valid, target, at::zeros_like(target));
      const at::Tensor p = at::softmax(self.to(at::kFloat), 1);
      const at::Tensor onehot = at::one_hot(safe_t, self.size(1)).to(at::kFloat);
      at::Tensor g = grads[0].to(at::kFloat);
      if (reduction == 1) g = g / valid.sum().to(at::kFloat);
      g = (reduction == 0 ? g : g.expand_symint({self.sym_size(0)})) * valid.to(at::kFloat);
      return {((p - onehot) * g.unsqueeze(1)).to(self.scalar_type()), {}, {}, {}, {}};
    }
    static const auto op = find_op("openneuron::cross_entropy_backward", "").typed<CeBackwardFn>();
    const at::Tensor& g = grads[0];
    at::Tensor dx =
        ctx->saved_data["direct"].toBool() && native_route({&g}) == NativeRoute::kDirect
            ? ce_backward_native(g.contiguous(), self, target, lse, reduction, ignore_index)
            : op.call(g, self, target, lse, reduction, ignore_index);
    return {dx, {}, {}, {}, {}};
  }
};

at::Tensor cross_entropy_autograd(const at::Tensor& self, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight, int64_t reduction,
                                  c10::SymInt ignore_index, double label_smoothing) {
  const NativeRoute route = native_route({&self, &target});
  if (route == NativeRoute::kComposite ||
      !ce_supported(self, target, weight, reduction, ignore_index, label_smoothing)) {
    return cross_entropy_composite(self, target, weight, reduction, std::move(ignore_index),
                                   label_smoothing);
  }
  return CrossEntropyFunction::apply(self, target, reduction, *ignore_index.maybe_as_int(),
                                     route == NativeRoute::kDirect);
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

// The kernels as ops, so that traced graphs (torch.compile, torch.export) keep them: functional
// (no aliasing), a Meta kernel for FakeTensor shapes, the native kernel for neuron tensors.
TORCH_LIBRARY_FRAGMENT(openneuron, m) {
  m.def("rms_norm_forward(Tensor input, int k, Tensor? weight, float eps) -> (Tensor, Tensor)");
  m.def(
      "rms_norm_backward(Tensor grad, Tensor input, Tensor rstd, Tensor? weight, int k, "
      "bool[2] output_mask) -> (Tensor, Tensor)");
  m.def(
      "cross_entropy_forward(Tensor self, Tensor target, int reduction, int ignore_index) -> "
      "(Tensor, Tensor)");
  m.def(
      "cross_entropy_backward(Tensor grad, Tensor self, Tensor target, Tensor lse, int reduction, "
      "int ignore_index) -> Tensor");
}

TORCH_LIBRARY_IMPL(openneuron, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("rms_norm_forward", TORCH_FN(ops::rms_forward_op));
  m.impl("rms_norm_backward", TORCH_FN(ops::rms_backward_op));
  m.impl("cross_entropy_forward", TORCH_FN(ops::ce_forward_op));
  m.impl("cross_entropy_backward", TORCH_FN(ops::ce_backward_op));
}

TORCH_LIBRARY_IMPL(openneuron, Meta, m) {
  namespace ops = openneuron::aten;
  m.impl("rms_norm_forward", TORCH_FN(ops::rms_forward_meta));
  m.impl("rms_norm_backward", TORCH_FN(ops::rms_backward_meta));
  m.impl("cross_entropy_forward", TORCH_FN(ops::ce_forward_meta));
  m.impl("cross_entropy_backward", TORCH_FN(ops::ce_backward_meta));
}
