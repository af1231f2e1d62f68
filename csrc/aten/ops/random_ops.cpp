// Random ops whose ATen CPU kernel draws from the CPU default generator (no Generator argument)
// get neuron kernels built from ops that take the neuron generator, so their results depend
// only on torch.neuron's RNG state (manual_seed, get/set_rng_state, checkpointing).
// Ops with a Generator? argument need nothing here: the fallback seeds them (fallback.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/ops/op_table.h"

namespace openneuron::aten {
namespace {

// As ATen's native_dropout: mask ~ Bernoulli(1 - p), output = input * mask / (1 - p).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  static OpInfo& info = op_info("aten::native_dropout", "");
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous).bernoulli_(1 - p);
  const double scale = p == 0 ? 1.0 : 1.0 / (1.0 - p);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask.to(at::kBool)};
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(openneuron::aten::native_dropout));
}
