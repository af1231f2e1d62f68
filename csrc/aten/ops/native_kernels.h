// Shared glue for the hand-written kernels of csrc/kernels (native_kernels.cpp: softmax,
// layer norm, the on/off switch; native_attention.cpp: SDPA; native_optim.cpp: fused Adam):
// dtype mapping, output allocation, the one-work-item enqueue, and the way back to the path an
// op takes without a native kernel (the boxed fallback) for cases the kernels do not handle.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <initializer_list>
#include <optional>
#include <utility>

#include "aten/dtype.h"
#include "aten/errors.h"
#include "aten/ops/enqueue.h"
#include "aten/ops/fallback.h"
#include "aten/ops/op_table.h"
#include "aten/origin_capture.h"
#include "kernels/kernel_util.h"
#include "runtime/stream.h"

namespace openneuron::aten {

// Native kernels on (default) or off: OPENNEURON_NATIVE_KERNELS=0 at import, or
// torch.ops.openneuron._set_native_kernels(False) at run time. Off = every op takes the path it
// takes without these kernels (the asynchronous ATen path); used by benchmarks/kernels.py.
bool native_kernels_enabled();

inline bool on_neuron(const at::Tensor& t) { return t.defined() && t.device().is_privateuseone(); }

// A plain (not conjugated / negated) neuron tensor of a kernel dtype.
inline bool kernel_operand(const at::Tensor& t) {
  return on_neuron(t) && kernel_dtype(t.scalar_type()).has_value() && !t.is_conj() && !t.is_neg() &&
         t.layout() == c10::kStrided;
}

// A new contiguous neuron tensor (allocated on the current stream of `device`).
inline at::Tensor empty_on(c10::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  const c10::DeviceGuard guard(device);
  return at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::PrivateUse1),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   std::nullopt);
}

// Enqueues fn as one work item on the current stream of `device`, named after the op, and
// counts the native call (enqueue.h).
template <class F>
void enqueue_native(OpInfo& info, c10::Device device, F&& fn) {
  info.native_calls.fetch_add(1, std::memory_order_relaxed);
  enqueue_op(device, info.name, std::forward<F>(fn));
}

// Calls op through the boxed PrivateUse1 fallback (the path without a native kernel).
template <class Ret, class... Args>
Ret boxed_fallback(const c10::OperatorHandle& op, Args&&... args) {
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(std::forward<Args>(args)), ...);
  neuron_fallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  if constexpr (!std::is_void_v<Ret>) return c10::impl::PopResult<Ret>::call(stack);
}

inline c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The device address of t's first element (nullptr for an undefined tensor). Raises (never a
// null dereference on an executor thread later) for a tensor without device memory: a FakeTensor
// or meta tensor (meta storage), a wrapper subclass or torch.func wrapper (no storage).
inline void* ptr_of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  TORCH_CHECK(t.storage().device_type() == c10::DeviceType::PrivateUse1,
              "openneuron: a native kernel was given a tensor without neuron device memory (",
              t.storage().device(), " storage, e.g. a FakeTensor or meta tensor); tracing must ",
              "dispatch the kernel's openneuron:: op or decompose it");
  return static_cast<char*>(buffer_of(t).data) +
         t.storage_offset() * static_cast<int64_t>(t.itemsize());
}

// How a native kernel registered at AutogradPrivateUse1 (native_norms.cpp) runs for its inputs:
//  kDirect: real neuron tensors and no TorchDispatchMode: the kernel is enqueued directly;
//  kOp: tracing (FakeTensor, functionalization, any dispatch mode active:
//       Dynamo, AOTAutograd, torch.export): the kernel's openneuron:: op is called through the
//       dispatcher, whose Meta kernel gives FakeTensors their shapes and which stays one node of
//       the traced graph (the PrivateUse1 kernel runs it when the graph runs);
//  kComposite: a Python tensor subclass outside tracing (e.g. DTensor) or a torch.func wrapper:
//       ATen's composite, whose smaller ops the subclass / transform knows.
enum class NativeRoute { kDirect, kOp, kComposite };

inline NativeRoute native_route(std::initializer_list<const at::Tensor*> tensors) {
  // torch.func wrappers: functorch refuses C++ autograd Functions (composite, as on CPU).
  static const c10::DispatchKeySet kFuncTorch({c10::DispatchKey::FuncTorchGradWrapper,
                                               c10::DispatchKey::FuncTorchBatched,
                                               c10::DispatchKey::BatchedNestedTensor});
  // Tensors whose data is not (directly) a neuron device buffer.
  static const c10::DispatchKeySet kWrapped(
      {c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  bool wrapped = false, python = false;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    const c10::DispatchKeySet ks = t->key_set();
    if (ks.has_any(kFuncTorch)) return NativeRoute::kComposite;
    wrapped |= ks.has_any(kWrapped);
    python |= ks.has(c10::DispatchKey::Python);
  }
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return NativeRoute::kOp;
  if (!wrapped) return NativeRoute::kDirect;
  return python ? NativeRoute::kComposite : NativeRoute::kOp;
}

}  // namespace openneuron::aten
