// Shared pieces of the boxed fallback (fallback.cpp: async path; sync_fallback.cpp: the
// synchronous path): host re-typing of args and the random-op generator plumbing.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

#include "aten/generator.h"
#include "aten/ops/host_views.h"
#include "aten/ops/op_table.h"

namespace openneuron::aten {

// The CPU-side value of one arg: neuron tensors become zero-copy CPU views (via host), CPU
// 0-dim tensors are cloned (their value is fixed at launch), a neuron Device becomes CPU, and a
// Generator becomes a CPU generator seeded from philox (None when philox is null).
c10::IValue host_arg(const c10::IValue& v, ArgKind kind, StorageMap& host,
                     const PhiloxState* philox);
// A CPU generator seed derived only from the neuron generator state.
uint64_t philox_seed(const PhiloxState& s);
// For ops with a Generator? arg: the (seed, offset) of the given or default neuron generator,
// advanced by numel.
std::optional<PhiloxState> take_philox(const OpInfo& info, c10::ArrayRef<c10::IValue> args,
                                       c10::Device device, int64_t numel);

// Runs op synchronously on CPU views of its device args (DESIGN §3 path 4): waits for the
// current stream, runs the CPU kernel, moves new results to the device. An op without a usable
// meta kernel is a fallback: warned once per op, or an error under OPENNEURON_FALLBACK=error.
// Ops that are sync points by nature (info.sync_by_nature), and calls whose inputs the meta
// kernel refused (data_dependent_inputs: masked indexing, or bad inputs the CPU kernel will
// reject with the error users expect), are counted as "sync" and not warned about.
void sync_fallback(const c10::OperatorHandle& op, OpInfo& info, torch::jit::Stack* stack,
                   c10::Device device, const char* reason, bool data_dependent_inputs);

}  // namespace openneuron::aten

namespace openneuron::aten {

// The boxed fallback itself (registered for every op without a neuron kernel); callable by
// native kernels that forward to another op's CPU kernel (convolution.cpp).
void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                     torch::jit::Stack* stack);

}  // namespace openneuron::aten
