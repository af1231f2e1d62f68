// Adaptive eager (DESIGN §5): fusible ops on neuron tensors are recorded into a pending group
// instead of being enqueued; the group closes at a boundary and runs as ONE ir::Kernel work
// item. This header is the recorder's interface for the op hooks (aten_ops.cpp decides WHAT an
// op is; the recorder decides WHEN a group closes and what it writes). Not the IR (csrc/ir).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "ir/kernel.h"

namespace openneuron::aten::fusion {

// What a recorded op computes, in its compute dtype (type promotion is resolved by the caller).
enum class Fn : uint8_t {
  // unary
  kNeg,
  kAbs,
  kReciprocal,
  kSqrt,
  kRsqrt,
  kExp,
  kLog,
  kCos,
  kTanh,
  kErf,
  kSquare,  // pow(x, 2) = x * x
  kCube,    // pow(x, 3) = x * x * x (each product rounded, as ATen)
  kRelu,    // x < 0 ? 0 : x (NaN and -0.0 pass through, as ATen's clamp_min)
  kCast,    // to the out dtype (copy_ with a dtype change)
  // binary
  kAdd,
  kSub,
  kMul,
  kDiv,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  // ternary
  kWhere,    // args: cond (bool), a, b
  kAddcmul,  // self + value * t1 * t2, as ATen's f32 kernel: fma(value * t1, t2, self)
  kAddcdiv,  // self + (value * t1) / t2
  kLerp,     // lerp(self, end, weight scalar): ATen's fma form, |w| < 0.5 from self else end
};
constexpr int kNumFns = static_cast<int>(Fn::kLerp) + 1;  // kLerp stays last
const char* fn_name(Fn fn);  // "add", ...: lowering.cpp, next to what each Fn lowers to

// One operand: a neuron tensor (`tensor` set) or a scalar (Python number or CPU 0-dim tensor,
// already read into `scalar`).
struct Arg {
  const at::Tensor* tensor = nullptr;
  c10::Scalar scalar;
};

struct OpRecord {
  Fn fn = Fn::kAdd;
  const char* name = "";  // ATen op name, static storage (log)
  Arg args[3];
  int nargs = 0;
  c10::ScalarType compute = c10::ScalarType::Float;  // eager's common dtype
  // add/sub/mul/div in bf16/fp16 with a scalar second operand: ATen computes in float with the
  // scalar's float value and rounds once (binary_op_scalar).
  bool scalar_opmath = false;
  c10::Scalar param;                // addcmul/addcdiv value, lerp weight
  const at::Tensor* out = nullptr;  // allocated, eager's result geometry and dtype
};

// Whether adaptive eager is on (TORCH_NEURONX_ENABLE_CONCATENATION=1 at import, or
// torch.neuron.set_fusion_enabled). thread-safe.
namespace detail {
extern std::atomic<bool> enabled;
extern std::atomic<bool> pending;
}  // namespace detail
inline bool enabled() { return detail::enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on);  // off flushes the pending group

// Records r into the pending group (closing it first at a boundary: stream/device/shape change,
// size limit, aliasing). false = not recorded: the caller runs the op the ordinary way (the
// group has then been closed, so the op sees every earlier result). thread-safe.
bool record(const OpRecord& r);

// Closes the pending group, if any, enqueueing its kernel on its stream. reason: static string
// for the log. thread-safe; a no-op (one atomic load) when nothing is pending.
void flush_slow(const char* reason);
inline void flush(const char* reason) {
  if (detail::pending.load(std::memory_order_acquire)) flush_slow(reason);
}

// Gives back the blocks of pending results (and inputs) nothing references any more; call it
// before allocating a new result so a long group needs no more memory than eager. thread-safe.
void release_dead_slow();
inline void release_dead() {
  if (detail::pending.load(std::memory_order_acquire)) release_dead_slow();
}

struct Stats {
  uint64_t groups = 0;        // groups closed with at least one op
  uint64_t ops_fused = 0;     // ops recorded
  uint64_t kernels = 0;       // fused kernels enqueued
  uint64_t cache_hits = 0;    // kernels found by structure
  uint64_t cache_misses = 0;  // kernels built
  uint64_t bytes_saved = 0;   // eager memory traffic minus fused traffic
  uint64_t outputs_written = 0;
  uint64_t outputs_dead = 0;  // recorded results never written (no reference left at close)
};
Stats stats();
void stats_reset();
void set_log(bool on);
void set_max_ops(int n);  // group size limit (default 64)

}  // namespace openneuron::aten::fusion
