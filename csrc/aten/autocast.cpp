// The autocast policy for neuron: kernels under the AutocastPrivateUse1 dispatch key that cast
// inputs before redispatching, with CUDA's op lists (ATen's AT_FORALL_* macros in
// ATen/autocast_mode.h). Not the casts themselves (at::autocast::cached_cast), nor the Python
// side (torch.autocast; the dtypes allowed come from torch.neuron.get_amp_supported_dtype).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace openneuron::aten {
namespace {

// NOTE: AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE spells its signatures with unqualified ATen
// types; these make them resolve here.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// As CUDA: binary_cross_entropy is banned under autocast (the user is told what to use instead).
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                   int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast (device neuron).\nMany models use a sigmoid layer right before the binary "
              "cross entropy layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss."
              "  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// Ops without a policy run as they are (the key falls through to the next one).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // Matmul-like ops: run in the autocast dtype.
#define OPENNEURON_KERNEL_LOWER_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(OPENNEURON_KERNEL_LOWER_PRECISION_FP)
#undef OPENNEURON_KERNEL_LOWER_PRECISION_FP

  // Ops that need range or precision (exp/log/pow, norms, losses, ...): run in float32.
#define OPENNEURON_KERNEL_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(OPENNEURON_KERNEL_FP32)
#undef OPENNEURON_KERNEL_FP32

  // Reductions and softmax-like ops with an optional dtype argument: float32 unless it is given.
#define OPENNEURON_KERNEL_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENNEURON_KERNEL_FP32_SET_OPT_DTYPE)
#undef OPENNEURON_KERNEL_FP32_SET_OPT_DTYPE

  // norm without a dtype argument: redispatched with dtype=float32 appended.
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

  // Mixed-type ops: inputs cast to the widest floating type among them.
#define OPENNEURON_KERNEL_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(OPENNEURON_KERNEL_PROMOTE)
#undef OPENNEURON_KERNEL_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&binary_cross_entropy_banned)));
}

}  // namespace
}  // namespace openneuron::aten
