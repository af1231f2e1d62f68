// The interpreter's internals, shared by its parts: the compute kinds chunk buffers hold, the
// plan (a kernel compiled to two instruction programs) and the per-chunk loops. Parts:
// plan.cpp (make_plan), chunk_ops.cpp (pointwise ops, loads, stores, math hooks),
// chunk_reduce.cpp (reduction accumulators) and execute.cpp (the iteration space and the runner).
// Internal to csrc/ir: the public interface is execute.h.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"

#define OPENNEURON_IR_INLINE inline __attribute__((always_inline))

namespace openneuron::ir {

// --- compute kinds --------------------------------------------------------------------------
// Values live in chunk buffers in their compute type: float for f32/bf16/f16 (bf16/f16 values
// hold exactly representable floats), double, int32, int64, uint8 (bool, 0/1).
enum class Kind : uint8_t { kF32, kF64, kI32, kI64, kB8 };

namespace detail {

constexpr int kLanes = 32;  // partial accumulators per reduction (mode A)

inline Kind kind_of(DType dt) {
  switch (dt) {
    case DType::kFloat32:
    case DType::kBFloat16:
    case DType::kFloat16:
      return Kind::kF32;
    case DType::kFloat64:
      return Kind::kF64;
    case DType::kInt32:
      return Kind::kI32;
    case DType::kInt64:
      return Kind::kI64;
    case DType::kBool:
      return Kind::kB8;
  }
  return Kind::kF32;
}

inline int64_t kind_bytes(Kind k) {
  return k == Kind::kF32 || k == Kind::kI32 ? 4 : k == Kind::kB8 ? 1 : 8;
}

[[noreturn]] inline void fail(const std::string& msg) {
  throw std::invalid_argument("ir::execute: " + msg);
}

// --- plan -----------------------------------------------------------------------------------

struct Instr {
  Op op;
  Kind kind;  // operand kind (kWhere: branch kind; kCast: source kind)
  Kind out_kind;
  uint8_t round;  // 1: round result to bf16, 2: to f16
  ValueId out, a, b, c;
};

struct Program {
  std::vector<Instr> instrs;
  std::vector<ValueId> loads;       // load values, in order (evaluated before instrs)
  std::vector<ValueId> consts;      // constant values (pinned slots, filled once per task)
  std::vector<ValueId> red_inputs;  // reduced program: reduce nodes read from red buffers
  std::vector<std::pair<int, ValueId>> stores;  // (output, value)
  std::vector<int> slot;                        // per value: slot index or -1
  int nslots = 0;
};

struct Plan {
  Program full;
  Program reduced;
  std::vector<ValueId> reductions;        // reduce nodes (their operands are full-domain values)
  std::vector<uint8_t> input_in_reduced;  // per input: loaded by the reduced program
  std::vector<uint8_t> output_reduced;    // per output: stores a reduced value
};

inline uint8_t round_code(DType dt) {
  return dt == DType::kBFloat16 ? 1 : dt == DType::kFloat16 ? 2 : 0;
}

// plan.cpp
std::shared_ptr<const Plan> make_plan(const Kernel& k);

// chunk_ops.cpp: one instruction over n values of a chunk; a row of n elements of dtype dt
// (element stride st) loaded into / stored from its compute kind. Each runs the active
// OPENNEURON_ISA variant.
void run_instr(const Instr& in, void* const* p, int64_t n);
void load_row(DType dt, const char* src, int64_t st, void* dst, int64_t n);
void store_row(DType dt, const void* src, char* dst, int64_t st, int64_t n);

// chunk_reduce.cpp: reduction accumulators (lanes: kLanes partial accumulators per output).
void accumulate(Kind kind, Op op, bool lanes, void* acc, const void* v, int64_t n);
void fill_identity(Kind kind, Op op, void* acc, int64_t n);
void finish_lanes(Kind kind, Op op, void* lanes, void* out, int64_t index);
void round_buffer(DType dt, void* buf, int64_t n);
void fill_constant(const Node& n, void* dst, int64_t count);

}  // namespace detail
}  // namespace openneuron::ir
