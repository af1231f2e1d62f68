// Kernel IR: an iteration space over N-d strided operands and a hash-consed DAG of scalar ops
// (load, constant, arithmetic, transcendental, compare, logical, select, cast, reductions).
// Built with KernelBuilder, immutable once built, serializable. Executed by the vectorized
// interpreter in execute.h. Torch-free; the ATen glue (csrc/aten) builds kernels from op groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/dtype.h"

namespace openneuron::ir {

// Ops: one row each in ir/ops.def (name, text, arity, operand dtypes, flags), the only list.
enum class Op : uint8_t {
#define OPENNEURON_IR_OP(name, text, arity, operands, flags) k##name,
#include "ir/ops.def"
#undef OPENNEURON_IR_OP
};
constexpr int kNumOps = 0
#define OPENNEURON_IR_OP(name, text, arity, operands, flags) +1
#include "ir/ops.def"
#undef OPENNEURON_IR_OP
    ;

// The dtypes an op accepts (ops.def's operands column).
enum class OpOperands : uint8_t { kAny, kFloating, kNumeric, kIntOrBool };
// ops.def's flags column.
enum OpFlag : uint8_t { kMathHook = 1, kExactOnValues = 2, kIntIdentity = 4 };
struct OpTraits {
  const char* name;  // "add", "exp", "sum", ...
  int arity;         // operands: 0 for leaves, 1, 2 or 3
  OpOperands operands;
  uint8_t flags;
  bool has(OpFlag f) const { return (flags & f) != 0; }
};
const OpTraits& op_traits(Op op);
const char* op_name(Op op);  // op_traits(op).name, "?" out of range
int op_arity(Op op);
bool op_is_reduction(Op op);

using ValueId = int32_t;

// One node of the DAG. Plain data; compares and hashes by value.
struct Node {
  Op op = Op::kConstant;
  DType dtype = DType::kFloat32;   // result dtype
  ValueId args[3] = {-1, -1, -1};  // operands (-1: unused)
  int32_t index = -1;              // kLoad: input operand index
  uint64_t payload = 0;            // kConstant: bits (double for floating, int64 for ints/bool)
                                   // reductions: axes mask
  bool operator==(const Node& o) const;
  bool operator!=(const Node& o) const { return !(*this == o); }
  uint64_t hash() const;
  double constant_double() const;  // kConstant of a floating dtype
  int64_t constant_int() const;    // kConstant of an integral/bool dtype
};

// An immutable kernel: inputs/outputs (dtype per operand), nodes in topological order (operands
// before users, only nodes reachable from outputs, canonically numbered by a depth-first walk
// from output 0, 1, ... so equal structure gives equal numbering whatever the build order).
class Kernel {
 public:
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  DType input_dtype(int i) const { return inputs_.at(i); }
  DType output_dtype(int i) const { return outputs_.at(i); }
  ValueId output_value(int i) const { return output_values_.at(i); }
  int num_values() const { return static_cast<int>(nodes_.size()); }
  const Node& node(ValueId v) const { return nodes_.at(v); }
  const std::vector<Node>& nodes() const { return nodes_; }
  // Axes reduced by the kernel's reductions (all reductions share one mask), 0 if none.
  uint64_t reduce_mask() const { return reduce_mask_; }
  // True for values computed after a reduction (they live in the reduced domain).
  bool is_reduced(ValueId v) const { return reduced_.at(v) != 0; }

  uint64_t hash() const { return hash_; }
  bool operator==(const Kernel& o) const;
  bool operator!=(const Kernel& o) const { return !(*this == o); }

  // Stable human-readable form for tests and logs (one line per node), e.g.
  //   kernel(in0: f32, in1: f32) -> (out0: f32)
  //     %0 = load in0 : f32
  //     %1 = load in1 : f32
  //     %2 = add %0, %1 : f32
  //     out0 = %2
  std::string to_text() const;
  // Exact, versioned, checksummed serialization. deserialize throws std::invalid_argument on
  // corrupt or incompatible input; round-trips to an equal kernel.
  std::string serialize() const;
  static std::shared_ptr<const Kernel> deserialize(const std::string& data);

 private:
  friend class KernelBuilder;
  friend struct KernelExecAccess;  // execute.cpp: the interpreter's cached plan
  std::vector<DType> inputs_;
  std::vector<DType> outputs_;
  std::vector<Node> nodes_;
  std::vector<ValueId> output_values_;
  std::vector<uint8_t> reduced_;
  uint64_t reduce_mask_ = 0;
  uint64_t hash_ = 0;
  mutable std::once_flag exec_once_;
  mutable std::shared_ptr<const void> exec_plan_;  // built on first execute
};

struct KernelHash {
  size_t operator()(const std::shared_ptr<const Kernel>& k) const { return k->hash(); }
};
struct KernelEqual {
  bool operator()(const std::shared_ptr<const Kernel>& a,
                  const std::shared_ptr<const Kernel>& b) const {
    return *a == *b;
  }
};

// Builds a kernel. Identical nodes are deduplicated (hash-consing). Invalid construction throws
// std::invalid_argument naming the op and the dtypes. Not thread-safe (one builder per thread).
//
// Typing: operands of arithmetic/compare ops must have the same dtype (insert explicit casts,
// like eager type promotion); compares and logical ops return kBool; where's cond is kBool.
// Reductions: all reductions of a kernel reduce the same axes; a reduction's operand must not
// itself depend on a reduction. Values computed from reductions may be combined with constants
// and loads; such loads must be broadcast (stride 0) along the reduced axes at execution, and
// outputs storing such values must have stride 0 along the reduced axes (keepdim). Broadcasting
// a reduction back over the reduced axes (softmax-style x - max(x)) needs two kernels.
class KernelBuilder {
 public:
  KernelBuilder();
  int add_input(DType dt);   // returns the input operand index
  int add_output(DType dt);  // returns the output operand index

  ValueId load(int input);
  ValueId constant(double v, DType dt);   // rounded to dt (bf16/fp16 via float, like c10)
  ValueId constant(int64_t v, DType dt);  // exact for ints; converted for floating dtypes
  ValueId constant(int v, DType dt) { return constant(static_cast<int64_t>(v), dt); }
  ValueId unary(Op op, ValueId a);
  ValueId binary(Op op, ValueId a, ValueId b);
  ValueId fma(ValueId a, ValueId b, ValueId c);
  ValueId where(ValueId cond, ValueId a, ValueId b);
  ValueId cast(ValueId a, DType dt);  // no-op (returns a) when a already has dtype dt
  // op: kSum, kProd, kAmax, kAmin (kAdd, kMul, kMax, kMin accepted as aliases). axes_mask: bit d
  // set = iteration axis d is reduced; must be nonzero.
  ValueId reduce(Op op, ValueId a, uint64_t axes_mask);
  void store(int output, ValueId v);  // each output exactly once

  DType dtype(ValueId v) const;
  int num_values() const { return static_cast<int>(nodes_.size()); }

  // Throws if an output was never stored. Call once; make a new builder per kernel.
  std::shared_ptr<const Kernel> build();

 private:
  friend class Kernel;  // deserialize replays nodes through a builder
  ValueId intern(const Node& n);
  void check_value(ValueId v, const char* what) const;

  std::vector<DType> inputs_;
  std::vector<DType> outputs_;
  std::vector<ValueId> stored_;
  std::vector<Node> nodes_;
  std::vector<uint8_t> reduced_;
  uint64_t reduce_mask_ = 0;
  struct NodeHash {
    size_t operator()(const Node& n) const { return n.hash(); }
  };
  std::unordered_map<Node, ValueId, NodeHash> index_;
};

}  // namespace openneuron::ir
