// Adaptive eager's entry points for the op hooks in csrc/aten/ops (fallback.cpp,
// pointwise_fast.cpp, copy.cpp). Each returns true when the op was recorded into the pending
// group (the caller then returns its result without enqueueing anything); false means "run it
// the ordinary way" (a pending group has been closed first when ordering requires it).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "aten/fusion/recorder.h"
#include "aten/ops/op_table.h"

namespace openneuron::aten::fusion {

// The boxed fallback: a fusible op (out= overloads, where.self, relu) on neuron tensors.
// Non-fusible ops close the pending group (reason: the op's name).
bool try_record_boxed(const c10::OperatorHandle& op, OpInfo& info, torch::jit::Stack* stack);
// pointwise_fast.cpp: functional add/sub/mul/div (fn: kAdd/kSub/kMul/kDiv) into a fresh out.
bool try_record_binary(Fn fn, const char* name, const at::Tensor& out, const at::Tensor& self,
                       const at::Tensor& other, const c10::Scalar& alpha);
// copy.cpp: a same-device copy_ that changes dtype (a cast).
bool try_record_copy(const at::Tensor& dst, const at::Tensor& src);

// The ATen operators adaptive eager records ("aten::add.out", ...; and functional add/sub/mul/
// div, copy_), for tests that run only what fusion can change.
std::vector<std::string> fused_op_names();

}  // namespace openneuron::aten::fusion
