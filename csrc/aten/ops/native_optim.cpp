// Fused Adam / AdamW (aten::_fused_adam_, _fused_adamw_, with float or tensor lr) on the neuron
// device: the whole parameter list is one work item running csrc/kernels/adam.h. What
// torch.optim.Adam/AdamW(fused=True) call. Lists the kernel does not cover (mixed dtypes,
// non-contiguous tensors, CPU state steps) take the boxed fallback (ATen's CPU fused kernel).
#include <torch/library.h>

#include <vector>

#include "aten/ops/native_kernels.h"
#include "kernels/adam.h"

namespace openneuron::aten {
namespace {

bool same_as_param(const at::Tensor& t, const at::Tensor& p) {
  return t.defined() && on_neuron(t) && t.device() == p.device() && t.is_contiguous() &&
         t.scalar_type() == p.scalar_type() && t.numel() == p.numel() && !t.is_conj() &&
         !t.is_neg();
}

bool scalar_float_on(const std::optional<at::Tensor>& t, c10::Device d) {
  return !t || !t->defined() ||
         (on_neuron(*t) && t->device() == d && t->scalar_type() == c10::ScalarType::Float &&
          t->numel() == 1);
}

// The kernel's view of the lists, or nullopt when the fallback must run them.
std::optional<std::vector<kernels::AdamTensor>> adam_list(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList state_steps,
    bool amsgrad, const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf, kernels::DType* dtype) {
  const size_t n = params.size();
  if (!native_kernels_enabled() || n == 0 || grads.size() != n || exp_avgs.size() != n ||
      exp_avg_sqs.size() != n || state_steps.size() != n ||
      (amsgrad && max_exp_avg_sqs.size() != n))
    return std::nullopt;
  const at::Tensor& p0 = params[0];
  if (!kernel_operand(p0)) return std::nullopt;
  *dtype = *kernel_dtype(p0.scalar_type());
  if (!scalar_float_on(grad_scale, p0.device()) || !scalar_float_on(found_inf, p0.device()))
    return std::nullopt;
  std::vector<kernels::AdamTensor> out(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    if (!on_neuron(p) || p.device() != p0.device() || p.scalar_type() != p0.scalar_type() ||
        !p.is_contiguous() || p.is_conj() || p.is_neg() || !same_as_param(grads[i], p) ||
        !same_as_param(exp_avgs[i], p) || !same_as_param(exp_avg_sqs[i], p) ||
        (amsgrad && !same_as_param(max_exp_avg_sqs[i], p)))
      return std::nullopt;
    const at::Tensor& s = state_steps[i];
    if (!on_neuron(s) || s.device() != p0.device() || s.scalar_type() != c10::ScalarType::Float ||
        s.numel() != 1)
      return std::nullopt;
    kernels::AdamTensor& t = out[i];
    t.param = ptr_of(p);
    t.grad = ptr_of(grads[i]);
    t.exp_avg = ptr_of(exp_avgs[i]);
    t.exp_avg_sq = ptr_of(exp_avg_sqs[i]);
    t.max_exp_avg_sq = amsgrad ? ptr_of(max_exp_avg_sqs[i]) : nullptr;
    t.step = static_cast<const float*>(ptr_of(s));
    t.numel = p.numel();
  }
  return out;
}

template <bool kAdamW>
void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                at::TensorList state_steps, double lr, const at::Tensor* lr_tensor, double beta1,
                double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                const std::optional<at::Tensor>& grad_scale,
                const std::optional<at::Tensor>& found_inf) {
  kernels::DType dtype = kernels::DType::kFloat32;
  auto list = adam_list(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad,
                        grad_scale, found_inf, &dtype);
  const float* lr_ptr = nullptr;
  if (list && lr_tensor) {
    if (lr_tensor->device().is_cpu() && lr_tensor->numel() == 1) {
      lr = lr_tensor->item<double>();
    } else if (scalar_float_on(*lr_tensor, params[0].device()) && lr_tensor->defined()) {
      lr_ptr = static_cast<const float*>(ptr_of(*lr_tensor));
    } else {
      list.reset();
    }
  }
  const char* name = kAdamW ? "aten::_fused_adamw_" : "aten::_fused_adam_";
  if (!list) {
    if (lr_tensor) {
      static const c10::OperatorHandle op = find_op(name, "tensor_lr");
      boxed_fallback<void>(op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                           *lr_tensor, beta1, beta2, weight_decay, eps, amsgrad, maximize,
                           grad_scale, found_inf);
    } else {
      static const c10::OperatorHandle op = find_op(name, "");
      boxed_fallback<void>(op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                           lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                           found_inf);
    }
    return;
  }
  static OpInfo& info = op_info(name, "");
  kernels::AdamConfig c;
  c.dtype = dtype;
  c.lr = lr;
  c.lr_ptr = lr_ptr;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.weight_decay = weight_decay;
  c.eps = eps;
  c.amsgrad = amsgrad;
  c.maximize = maximize;
  c.adamw = kAdamW;
  c.grad_scale = grad_scale && grad_scale->defined()
                     ? static_cast<const float*>(ptr_of(*grad_scale))
                     : nullptr;
  c.found_inf =
      found_inf && found_inf->defined() ? static_cast<const float*>(ptr_of(*found_inf)) : nullptr;
  enqueue_native(info, params[0].device(), [c, tensors = std::move(*list)] {
    kernels::adam_step(c, tensors.data(), tensors.size());
  });
}

template <bool kAdamW>
void fused_adam_float_lr(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                         at::TensorList state_steps, double lr, double beta1, double beta2,
                         double weight_decay, double eps, bool amsgrad, bool maximize,
                         const std::optional<at::Tensor>& grad_scale,
                         const std::optional<at::Tensor>& found_inf) {
  fused_adam<kAdamW>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                     nullptr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf);
}

template <bool kAdamW>
void fused_adam_tensor_lr(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                          at::TensorList state_steps, const at::Tensor& lr, double beta1,
                          double beta2, double weight_decay, double eps, bool amsgrad,
                          bool maximize, const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) {
  fused_adam<kAdamW>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, 0.0, &lr,
                     beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("_fused_adam_", TORCH_FN(ops::fused_adam_float_lr<false>));
  m.impl("_fused_adamw_", TORCH_FN(ops::fused_adam_float_lr<true>));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN(ops::fused_adam_tensor_lr<false>));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN(ops::fused_adam_tensor_lr<true>));
}
