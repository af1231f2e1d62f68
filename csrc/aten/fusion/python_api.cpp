// torch.ops.openneuron_fusion.*: the controls behind torch.neuron's adaptive-eager functions
// (openneuron/neuron/fusion.py). Registered as catch-all torch ops so the extension module's
// bindings stay untouched. Not on any hot path.
#include <torch/library.h>

#include "aten/fusion/fusion.h"
#include "aten/fusion/recorder.h"

namespace openneuron::aten::fusion {
namespace {

void op_set_enabled(bool on) { set_enabled(on); }
bool op_is_enabled() { return enabled(); }
void op_set_log(bool on) { set_log(on); }
void op_set_max_ops(int64_t n) { set_max_ops(static_cast<int>(n)); }
void op_flush() { flush("explicit flush"); }
void op_reset_stats() { stats_reset(); }
// groups, ops_fused, kernels, cache_hits, cache_misses, bytes_saved, outputs_written,
// outputs_dead (openneuron/neuron/fusion.py names them).
std::vector<int64_t> op_stats() {
  Stats s = stats();
  return {static_cast<int64_t>(s.groups),          static_cast<int64_t>(s.ops_fused),
          static_cast<int64_t>(s.kernels),         static_cast<int64_t>(s.cache_hits),
          static_cast<int64_t>(s.cache_misses),    static_cast<int64_t>(s.bytes_saved),
          static_cast<int64_t>(s.outputs_written), static_cast<int64_t>(s.outputs_dead)};
}

}  // namespace
}  // namespace openneuron::aten::fusion

TORCH_LIBRARY(openneuron_fusion, m) {
  namespace f = openneuron::aten::fusion;
  m.def("set_enabled(bool on) -> ()", &f::op_set_enabled);
  m.def("is_enabled() -> bool", &f::op_is_enabled);
  m.def("set_log(bool on) -> ()", &f::op_set_log);
  m.def("set_max_ops(int n) -> ()", &f::op_set_max_ops);
  m.def("flush() -> ()", &f::op_flush);
  m.def("reset_stats() -> ()", &f::op_reset_stats);
  m.def("stats() -> int[]", &f::op_stats);
  m.def("fused_ops() -> str[]", &f::fused_op_names);
}
