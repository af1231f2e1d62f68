// Per-operator facts the boxed fallback needs on every call, computed once per op: schema
// analysis (write/alias/generator args), the matching .out overload, whether a meta kernel
// works, and the per-path call counters behind openneuron.ops_report(). Not the fallback itself
// (fallback.cpp) nor the meta-result cache (meta_cache.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace openneuron::aten {

enum class ArgKind : uint8_t { Other, Generator, Device };

struct OpInfo {
  const c10::FunctionSchema* schema = nullptr;
  const char* name = "";  // "aten::add.Tensor", interned for the op's lifetime
  size_t num_args = 0;
  size_t num_returns = 0;
  std::vector<bool> arg_is_write;  // schema alias info says the arg is written
  std::vector<ArgKind> arg_kind;
  // Per return: the arg it aliases (-1 = a new tensor) and whether that alias is written.
  std::vector<int> return_alias_arg;
  std::vector<bool> return_is_write;
  bool has_write_args = false;
  bool returns_tensors_only = true;    // every return is Tensor, Tensor? or Tensor[]
  bool returns_single_tensors = true;  // every return is a plain Tensor
  bool has_generator = false;
  bool index_op = false;        // CPU index tensors are moved to the device, as CUDA allows
  bool data_dependent = false;  // output shape depends on values: always synchronous
  // Batch norm: index of its `training` arg (-1 = not batch norm). In eval mode the CPU kernel
  // returns empty save_mean/save_invstd where the meta kernel sizes them [C].
  int training_arg = -1;
  // Its CPU kernel computes the same bits on any number of threads: pointwise ops (ATen's tag)
  // and data movement. Only these may run serially when small (fallback.cpp): the ATen path's
  // results stay bitwise CPU PyTorch's (reductions and MKL's matrix products split their sums
  // by thread: a 1 x 256 x 768 addmm differs between 1 and 2 threads).
  bool thread_invariant = false;
  // A matrix product (mm, addmm, bmm, baddbmm; any overload): in bfloat16 / float16 on
  // a CPU whose ATen kernel for that dtype is the scalar one, it runs in float32 (fallback.cpp).
  bool reduced_gemm = false;
  std::atomic<bool> meta_ok{true};  // cleared when the meta kernel turns out to be missing
  std::string no_async_reason;      // why the op never takes the async path ("" = it may)
  // Its results need the device's values on the host (data-dependent shapes, bool/int/float
  // returns): a sync point by nature, as on CUDA, counted as "sync" and never warned about.
  bool sync_by_nature = false;
  // Adaptive eager (csrc/aten/fusion/aten_ops.cpp): this op's entry in the fusible-op table,
  // looked up on first use (-1 = not yet, -2 = not fusible).
  std::atomic<int16_t> fusion_spec{-1};

  std::atomic<uint64_t> native_calls{0};
  std::atomic<uint64_t> async_calls{0};
  std::atomic<uint64_t> fallback_calls{0};
  std::atomic<uint64_t> fallback_ns{0};
  std::atomic<uint64_t> sync_calls{0};
  std::atomic<uint64_t> sync_ns{0};
  std::atomic<bool> warned{false};
};

// The info of op, created on first use. thread-safe; the reference lives for the process.
OpInfo& op_info(const c10::OperatorHandle& op);
// The info of an op by name ("aten::add", "Tensor"), for native kernels that count calls.
OpInfo& op_info(const char* name, const char* overload);

// Every op seen so far (for the report).
std::vector<OpInfo*> op_info_all();

}  // namespace openneuron::aten
