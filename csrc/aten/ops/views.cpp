// Native neuron view ops: the ops whose only ATen kernels are per backend and that return
// aliases (as_strided, view, _reshape_alias, unfold, view_as_real, view_as_complex). They only
// build metadata over the same storage, so ATen's generic implementations serve; every other
// view op is CompositeExplicitAutograd and reaches these. Also the storage-identity queries
// is_set_to and _has_compatible_shallow_copy_type (whether `param.data = neuron_tensor` may swap
// in place), which a copying fallback would answer wrongly. Not factories (factories.cpp).
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

namespace openneuron::aten {
namespace {

bool dense_cpu_or_neuron(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
         (t.is_cpu() || t.is_privateuseone());
}

// NOTE: c10's own rule knows only built-in backends, so without this Module.to("neuron")
// replaces each Parameter instead of swapping its data, and tied weights come untied.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return dense_cpu_or_neuron(self) && dense_cpu_or_neuron(from);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

}  // namespace openneuron::aten
