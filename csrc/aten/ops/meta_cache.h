// Output metadata of an op call computed by its meta kernel, cached by input signature (op,
// per-arg sizes/strides/dtype/device kind, scalar values, lists, Nones), so a training loop that
// repeats shapes pays for the meta dispatch once. Bounded: cleared when it reaches kMaxEntries.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <vector>

#include "aten/ops/host_views.h"
#include "aten/ops/op_table.h"

namespace openneuron::aten {

struct MetaResult {
  // Per return: one geometry (Tensor / Tensor?; defined=false for None) or one per element
  // (Tensor[]).
  std::vector<c10::SmallVector<TensorGeom, 1>> returns;
  // Per written arg (schema index): its geometry after the op (out= args the op resizes).
  std::vector<std::pair<int, c10::SmallVector<TensorGeom, 1>>> writes;
};

// Thrown (as a marker) when the op has no usable meta kernel at all.
struct MetaUnavailable {};

// The meta result for this call: from the cache, or by running the meta kernel on meta
// re-typings of args. Throws MetaUnavailable when the op has no meta kernel (and clears
// info.meta_ok); rethrows any other error of the meta kernel.
std::shared_ptr<const MetaResult> meta_result(const c10::OperatorHandle& op, OpInfo& info,
                                              c10::ArrayRef<c10::IValue> args);

void meta_cache_clear();

}  // namespace openneuron::aten
