// The adaptive-eager recorder's pending group, shared by recorder.cpp (boundaries, aliasing,
// the kernel cache, the work item) and lowering.cpp (what each recorded op is as IR values).
// Internal to csrc/aten/fusion; the op hooks use recorder.h.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "aten/dtype.h"
#include "aten/fusion/recorder.h"
#include "ir/kernel.h"
#include "runtime/stream.h"

namespace openneuron::aten::fusion::detail {

using ir::DType;
using ir::Op;

constexpr int kMaxDims = 16;

inline DType dtype_of(c10::ScalarType t) {
  const std::optional<DType> d = ir_dtype(t);
  TORCH_INTERNAL_ASSERT(d, "adaptive eager: unsupported dtype ", t);
  return *d;
}

// A node of the pending group; replayed into an ir::KernelBuilder at close. Plain bytes, so the
// group's structure is its own cache key.
struct GNode {
  Op op;
  DType dtype;
  int16_t index;  // kLoad: input operand; kCast: unused
  int32_t args[3];
  uint64_t payload;  // kConstant: double bits (floating) or int64 (integral/bool)
};
static_assert(sizeof(GNode) == 24, "GNode is hashed as raw bytes");

struct Input {
  c10::Storage storage;  // keeps the block alive until the group is enqueued
  void* data;
  int64_t nbytes;                        // the tensor's own bytes (traffic accounting)
  c10::SmallVector<int64_t, 6> strides;  // in the iteration space, 0 = broadcast
  // exact geometry, to dedupe loads of the same tensor
  int64_t offset;
  c10::SmallVector<int64_t, 6> sizes, tstrides;
  c10::ScalarType dtype;
  bool released = false;     // dead and given back early: see Recorder::release_dead
  uintptr_t lo = 0, hi = 0;  // the bytes the kernel reads
};

struct Output {
  c10::Storage storage;  // released (empty) once dead: see Recorder::release_dead
  void* data;
  int64_t nbytes;
  c10::SmallVector<int64_t, 6> strides;
  int64_t offset;
  c10::ScalarType dtype;
  int32_t value;
  bool released = false;
};

struct Launch {
  std::shared_ptr<const ir::Kernel> kernel;
  int ndim = 0;
  int64_t sizes[kMaxDims];
  std::vector<void*> ptrs;       // inputs then outputs
  std::vector<int64_t> strides;  // ndim per operand, same order
};

class Recorder {
 public:
  bool record(const OpRecord& r, std::vector<c10::Storage>* garbage);
  void flush(const char* reason, std::vector<c10::Storage>* garbage);

 private:
  bool place(const OpRecord& r, int* inplace_out, bool* inplace_input_out,
             std::vector<c10::Storage>* garbage);
  int32_t lower(const OpRecord& r);
  bool empty() const { return ops_ == 0; }
  // NOTE: a result whose storage only the group still references can never be read again
  // (values flow through the DAG, not memory) nor written (it is dead): its block goes back to
  // the allocator at once, so a long group holds no more memory than eager would. A later
  // output of the same group may reuse the block; nothing reads or writes the dead one.
  // NOTE: a dead INPUT (only the group references it) is given back early too, but only while
  // its device has used nothing but the default stream: then its block can be reused only by
  // default-stream allocations, whose writers either flush the group first (any enqueue) or
  // are outputs of this group, which record() lets alias a released input only exactly
  // (same address, dtype and strides: the kernel reads each element before writing it).
  void release_dead(std::vector<c10::Storage>* garbage) {
    for (Output& o : outputs_) {
      if (!o.released && o.storage.use_count() == 1) {
        garbage->push_back(std::move(o.storage));
        o.storage = c10::Storage();
        o.released = true;
      }
    }
    if (empty() || stream_id_ != 0 || runtime::stream_non_default_used(device_)) return;
    for (Input& in : inputs_) {
      if (!in.released && in.storage.use_count() == 1) {
        garbage->push_back(std::move(in.storage));
        in.storage = c10::Storage();
        in.released = true;
      }
    }
  }
  void reset(std::vector<c10::Storage>* garbage);
  int32_t push(GNode n) {
    nodes_.push_back(n);
    return static_cast<int32_t>(nodes_.size() - 1);
  }
  int32_t constant(const c10::Scalar& s, DType dt);
  int32_t cast(int32_t v, DType dt) {
    if (nodes_[v].dtype == dt) return v;
    return push({Op::kCast, dt, -1, {v, -1, -1}, 0});
  }
  int32_t unary(Op op, int32_t a) { return push({op, nodes_[a].dtype, -1, {a, -1, -1}, 0}); }
  int32_t binary(Op op, int32_t a, int32_t b, DType dt) {
    return push({op, dt, -1, {a, b, -1}, 0});
  }
  // The value of a tensor operand: a pending result with the same geometry, or a load.
  int32_t value_of(const at::Tensor& t);
  std::shared_ptr<const ir::Kernel> kernel_for(const std::vector<int>& live, bool* hit);

  std::mutex mu_;
  // the pending group
  int ops_ = 0;
  c10::DeviceIndex device_ = -1;
  int64_t stream_id_ = 0;
  c10::SmallVector<int64_t, 6> sizes_;
  int64_t numel_ = 0;
  std::vector<GNode> nodes_;
  std::vector<Input> inputs_;
  std::vector<Output> outputs_;
  std::vector<const char*> names_;
  int64_t eager_bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const ir::Kernel>> cache_;
  uint64_t group_seq_ = 0;

 public:
  std::mutex& mu() { return mu_; }
  void release_dead_now(std::vector<c10::Storage>* garbage) { release_dead(garbage); }
};

// The process-wide recorder.
Recorder& recorder();

}  // namespace openneuron::aten::fusion::detail
