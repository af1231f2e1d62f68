// Ops whose ATen CPU kernel lacks dtypes that CUDA supports, so user code written for CUDA would
// fail on neuron where it runs on CPU. Each kernel here covers the missing dtypes with neuron ops
// (asynchronous, no host sync) and forwards everything else to the boxed fallback.
//   histc on integer tensors: CUDA counts them (int64 bin arithmetic, result in the input's
//   dtype); histogram_cpu raises "not implemented for 'Int'". Hugging Face's MoE layers
//   (transformers.integrations.moe, grouped_mm experts) call it on int32 expert ids.
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
  at::Tensor out = histc_integral(self, (*stack)[first + 1].toInt(),
                                  (*stack)[first + 2].toScalar(), (*stack)[first + 3].toScalar());
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

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::histc_out>());
}
