// The synchronous CPU fallback (DESIGN §3 path 4) for ops the async path cannot size: waits for
// the current stream, runs ATen's CPU kernel in a work item on CPU views of the device buffers
// (written args on host copies, so out= args may be resized), then moves new results to the
// device. Ops without a usable meta kernel are warned once and counted as "fallback"; ops that
// need values on the host by nature (nonzero, masked indexing, equal, ...) are sync points as
// on CUDA: counted as "sync", never warned. The async path is fallback.cpp.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "aten/errors.h"
#include "aten/ops/enqueue.h"
#include "aten/ops/fallback.h"
#include "runtime/config.h"
#include "runtime/stream.h"

namespace openneuron::aten {
namespace {

using runtime::FallbackMode;

FallbackMode fallback_mode() { return runtime::config_or_defaults().fallback; }

std::string fallback_message(const OpInfo& info, const char* reason) {
  return std::string(info.name) +
         " ran through the synchronous CPU fallback on neuron (no asynchronous path: " + reason +
         "); it waits for the device. Set OPENNEURON_FALLBACK=silent to hide this or =error to "
         "make it an error";
}

void announce(OpInfo& info, const char* reason) {
  switch (fallback_mode()) {
    case FallbackMode::kError:
      TORCH_CHECK(false, fallback_message(info, reason),
                  " (OPENNEURON_FALLBACK=error is set; unset it to let the op run).");
    case FallbackMode::kWarn:
      if (!info.warned.exchange(true)) TORCH_WARN(fallback_message(info, reason));
      break;
    case FallbackMode::kSilent:
      break;
  }
}

// Waits for s without holding the GIL (a work item may need it, e.g. a Python CPU kernel).
void wait_stream(const runtime::Stream& s) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    with_torch_errors([&] { s.synchronize(); });
  } else {
    with_torch_errors([&] { s.synchronize(); });
  }
}

// A written device arg: the kernel writes a host copy, copied back (or resized) afterwards.
struct WrittenArg {
  size_t arg = 0;
  int64_t elem = -1;  // index in a Tensor[] arg, -1 for a Tensor arg
  at::Tensor device;
  at::Tensor view;   // CPU view of device
  at::Tensor clone;  // what the kernel wrote
  bool copied = false;
};

struct SyncRun {
  c10::OperatorHandle op;
  torch::jit::Stack stack;
  StorageMap host{c10::DeviceType::CPU, /*keep_sources=*/true};
  std::vector<WrittenArg> written;
  std::exception_ptr error;
  explicit SyncRun(c10::OperatorHandle o) : op(std::move(o)) {}

  void run() {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    try {
      for (auto& w : written) {
        w.clone = w.view.clone(at::MemoryFormat::Preserve);
        if (w.elem < 0) {
          stack[w.arg] = c10::IValue(w.clone);
        } else {
          auto list = stack[w.arg].toList();
          list.set(static_cast<size_t>(w.elem), c10::IValue(w.clone));
        }
      }
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
      for (auto& w : written) {
        if (w.clone.sizes().equals(w.view.sizes()) && w.clone.dtype() == w.view.dtype()) {
          w.view.copy_(w.clone);
          w.copied = true;
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
};

at::Tensor to_device(const at::Tensor& t, const SyncRun& run, c10::Device device) {
  if (!t.defined() || !t.device().is_cpu()) return t;
  for (const auto& w : run.written)
    if (t.unsafeGetTensorImpl() == w.clone.unsafeGetTensorImpl()) return w.device;
  if (const c10::Storage* src = run.host.source_of(t.storage().unsafeGetStorageImpl()))
    return device_view(*src, geom_of(t));
  TensorGeom g = geom_of(t);
  g.offset = 0;
  if (!t.is_non_overlapping_and_dense()) {
    g.strides.assign(c10::contiguous_strides(t.sizes()).begin(),
                     c10::contiguous_strides(t.sizes()).end());
  }
  at::Tensor out = device_empty(g, device);
  out.copy_(t);
  return out;
}

c10::IValue return_to_device(const c10::IValue& v, const SyncRun& run, c10::Device device) {
  if (v.isTensor()) return c10::IValue(to_device(v.toTensor(), run, device));
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const auto& t : v.toTensorList()) out.push_back(to_device(t, run, device));
    return c10::IValue(out);
  }
  return v;
}

}  // namespace

void sync_fallback(const c10::OperatorHandle& op, OpInfo& info, torch::jit::Stack* stack,
                   c10::Device device, const char* reason, bool data_dependent_inputs) {
  const bool is_fallback = !info.sync_by_nature && !data_dependent_inputs;
  if (is_fallback) announce(info, reason);
  const auto start = std::chrono::steady_clock::now();
  const size_t n = info.num_args;
  c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
  const c10::DeviceGuard guard(device);
  const runtime::Stream stream =
      with_torch_errors([&] { return runtime::stream_current(device.index()); });

  int64_t numel = 0;
  for (const auto& a : args)
    if (a.isTensor() && a.toTensor().defined()) numel = std::max(numel, a.toTensor().numel());
  auto philox = take_philox(info, args, device, numel);

  auto run = std::make_shared<SyncRun>(op);
  run->stack.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    run->stack.push_back(
        host_arg(args[i], info.arg_kind[i], run->host, philox ? &*philox : nullptr));
    if (!info.arg_is_write[i]) continue;
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone()) {
      run->written.push_back({i, -1, v.toTensor(), run->stack[i].toTensor(), {}, false});
    } else if (v.isTensorList()) {
      auto dev = v.toTensorList();
      auto host = run->stack[i].toTensorList();
      for (size_t j = 0; j < dev.size(); ++j)
        if (dev.get(j).device().is_privateuseone())
          run->written.push_back({i, static_cast<int64_t>(j), dev.get(j), host.get(j), {}, false});
    }
  }

  wait_stream(stream);
  // NOTE: a raw pointer: this function waits for the work, and the closure may outlive it
  // (hal.h), so it must not keep run's device tensors alive. No origin: errors are raised here.
  enqueue_op(
      stream, info.name, [r = run.get()] { r->run(); }, 0, false);
  wait_stream(stream);
  if (run->error) std::rethrow_exception(run->error);

  for (auto& w : run->written) {
    if (w.copied) continue;
    w.device.resize_(w.clone.sizes());
    w.device.copy_(w.clone);
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < run->stack.size(); ++r)
    stack->push_back(return_to_device(run->stack[r], *run, device));

  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  (is_fallback ? info.fallback_calls : info.sync_calls).fetch_add(1, std::memory_order_relaxed);
  (is_fallback ? info.fallback_ns : info.sync_ns)
      .fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

}  // namespace openneuron::aten
