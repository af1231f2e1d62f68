// Convolutions on neuron. ATen routes convolutions of backends other than CPU/CUDA to
// convolution_overrideable / convolution_backward_overrideable; these kernels forward them to
// aten::convolution / aten::convolution_backward through the boxed fallback, so they run
// ATen's CPU convolution (oneDNN) asynchronously like any other op.
#include <torch/library.h>

#include "aten/ops/fallback.h"

namespace openneuron::aten {
namespace {

const c10::OperatorHandle& find_op(const char* name, const char* overload) {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(h.has_value(), "neuron: operator ", name, " not found");
  return *new c10::OperatorHandle(*h);  // NOTE: one per call site (static below), never freed
}

void convolution_forward(const c10::OperatorHandle&, c10::DispatchKeySet ks,
                         torch::jit::Stack* stack) {
  static const c10::OperatorHandle& conv = find_op("aten::convolution", "");
  neuron_fallback(conv, ks, stack);
}

// convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> convolution_backward, which also takes
// bias_sizes after weight.
void convolution_backward(const c10::OperatorHandle&, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  static const c10::OperatorHandle& bwd = find_op("aten::convolution_backward", "");
  const size_t first = stack->size() - 10;
  const at::Tensor& weight = (*stack)[first + 2].toTensor();
  const bool transposed = (*stack)[first + 6].toBool();
  const int64_t groups = (*stack)[first + 8].toInt();
  const auto mask = (*stack)[first + 9].to<std::array<bool, 3>>();
  c10::IValue bias_sizes;
  if (mask[2]) {
    int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
    bias_sizes = c10::IValue(std::vector<int64_t>{channels});
  }
  stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3), std::move(bias_sizes));
  neuron_fallback(bwd, ks, stack);
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::convolution_forward>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::convolution_backward>());
}
