// Ops whose ATen CPU kernel lacks dtypes that CUDA supports, so user code written for CUDA would
// fail on neuron where it runs on CPU. Each kernel here covers the missing dtypes with neuron ops
// (asynchronous, no host sync) and forwards everything else to the boxed fallback.
//   histc on integer tensors: CUDA counts them (int64 bin arithmetic, result in the input's
//   dtype); histogram_cpu raises "not implemented for 'Int'". Hugging Face's MoE layers
//   (transformers.integrations.moe, grouped_mm experts) call it on int32 expert ids.
// And meta kernels ATen lacks, so the boxed fallback can size these ops' outputs at dispatch
// and run them asynchronously instead of synchronously:
//   _ctc_loss_backward (CTC training: Wav2Vec2ForCTC, HubertForCTC, nn.CTCLoss).
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "aten/ops/fallback.h"

namespace openneuron::aten {
namespace {

// As CUDA's histc for integral input: bins over [min, max] (or the data's min/max when
// min == max, widened by one each side if still equal), bin = (v - min) * bins / (max - min)
// in int64 with the last edge falling into the last bin, values outside [min, max] ignored.
// min/max from the data stay 0-dim device tensors, so nothing waits for the device.
at::Tensor histc_integral(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                          const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins, " for a ",
              self.scalar_type(), " tensor on ", self.device());
  const at::Tensor v = self.reshape(-1).to(at::kLong);
  const int64_t lo = min.toLong();
  const int64_t hi = max.toLong();
  TORCH_CHECK(lo <= hi, "torch.histc: max must be larger than min (got min=", lo, ", max=", hi,
              ") for a ", self.scalar_type(), " tensor on ", self.device());
  at::Tensor in_range;
  at::Tensor bin;
  if (lo != hi) {
    in_range = v.ge(lo).logical_and_(v.le(hi));
    bin = v.sub(lo).mul_(bins).div_(hi - lo, "floor");
  } else {
    at::Tensor lo_t = v.numel() > 0 ? v.min() : at::full({}, lo, v.options());
    at::Tensor hi_t = v.numel() > 0 ? v.max() : at::full({}, hi, v.options());
    const at::Tensor same = lo_t.eq(hi_t).to(at::kLong);
    lo_t = lo_t.sub(same);
    hi_t = hi_t.add(same);
    in_range = v.ge(lo_t).logical_and_(v.le(hi_t));
    bin = v.sub(lo_t).mul_(bins).div_(hi_t.sub(lo_t), "floor");
  }
  bin.clamp_(0, bins - 1);
  at::Tensor counts = at::zeros({bins}, v.options());
  counts.scatter_add_(0, bin, in_range.to(at::kLong));
  return counts.to(self.scalar_type());
}

// aten::histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor
void histc(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 4;
  const at::Tensor& self = (*stack)[first].toTensor();
  if (!at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    neuron_fallback(op, ks, stack);  // floating types: ATen's CPU kernel, asynchronously
    return;
  }
  static OpInfo& info = op_info("aten::histc", "");
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  at::Tensor out = histc_integral(self, (*stack)[first + 1].toInt(), (*stack)[first + 2].toScalar(),
                                  (*stack)[first + 3].toScalar());
  torch::jit::drop(*stack, 4);
  stack->push_back(c10::IValue(std::move(out)));
}

// aten::histc.out(Tensor self, int bins=100, Scalar min=0, Scalar max=0, *, Tensor(a!) out)
void histc_out(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 5;
  const at::Tensor& self = (*stack)[first].toTensor();
  if (!at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    neuron_fallback(op, ks, stack);
    return;
  }
  at::Tensor out = (*stack)[first + 4].toTensor();
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: out has dtype ",
              out.scalar_type(), " but input has dtype ", self.scalar_type(), " (on ",
              self.device(), "); pass an out tensor of the input's dtype");
  static OpInfo& info = op_info("aten::histc", "out");
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  const at::Tensor result =
      histc_integral(self, (*stack)[first + 1].toInt(), (*stack)[first + 2].toScalar(),
                     (*stack)[first + 3].toScalar());
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  torch::jit::drop(*stack, 5);
  stack->push_back(c10::IValue(out));
}

// aten::_ctc_loss_backward(Tensor grad, Tensor log_probs, Tensor targets, int[] input_lengths,
//   int[] target_lengths, Tensor neg_log_likelihood, Tensor log_alpha, int blank,
//   bool zero_infinity=False) -> Tensor
// Meta: the gradient of log_probs, contiguous, as the CPU kernel's full_like(log_probs, -inf,
// LEGACY_CONTIGUOUS_MEMORY_FORMAT).
at::Tensor ctc_loss_backward_meta(const at::Tensor& grad, const at::Tensor& log_probs,
                                  const at::Tensor& targets, c10::IntArrayRef input_lengths,
                                  c10::IntArrayRef target_lengths, const at::Tensor& nll,
                                  const at::Tensor& log_alpha, int64_t blank, bool zero_infinity) {
  (void)grad, (void)targets, (void)nll, (void)log_alpha, (void)blank, (void)zero_infinity;
  TORCH_CHECK(log_probs.dim() == 3, "_ctc_loss_backward: log_probs must be (T, N, C), got ",
              log_probs.sizes());
  TORCH_CHECK(static_cast<int64_t>(input_lengths.size()) == log_probs.size(1) &&
                  static_cast<int64_t>(target_lengths.size()) == log_probs.size(1),
              "_ctc_loss_backward: input_lengths and target_lengths must have batch size ",
              log_probs.size(1), " entries");
  return at::empty(log_probs.sizes(), log_probs.options(), at::MemoryFormat::Contiguous);
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::histc_out>());
  // NOTE: native_group_norm has CPU and CUDA kernels; any other device gets math_group_norm
  // (CompositeExplicitAutograd), which computes bf16/fp16 statistics in that dtype, and its
  // autograd decomposition. ATen's CPU kernels (float accumulation, as CPU users get) run on
  // neuron instead, asynchronously like any op; the backward follows from the forward.
  m.impl("native_group_norm",
         torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::neuron_fallback>());
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_ctc_loss_backward", TORCH_FN(openneuron::aten::ctc_loss_backward_meta));
}
