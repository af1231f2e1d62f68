// The vectorized interpreter for ir::Kernel: walks the iteration space in chunks that stay in L1
// (tiles of up to kChunkElems elements), runs each node over a whole chunk with SIMD loops, and
// splits the outer (non-reduced) dims across runtime::parallel_for. Torch-free. Math hooks let
// the ATen glue install SLEEF-backed vector functions so results match eager bit for bit.
#pragma once

#include <cstdint>

#include "ir/kernel.h"

namespace openneuron::ir {

constexpr int64_t kChunkElems = 1024;

// One operand of an execution: base pointer and strides in elements, one per iteration dim
// (0 = broadcast; negative allowed). The caller keeps both alive for the call.
struct Operand {
  void* data;
  const int64_t* strides;
};

// Runs kernel k over the iteration space sizes[0..ndim). ndim may be 0 (one element); sizes may
// contain 0 (nothing is computed, except reductions over empty axes, which store their identity:
// sum 0, prod 1, amax -inf/lowest, amin +inf/highest). inputs[k.num_inputs()],
// outputs[k.num_outputs()]. Outputs must not partially overlap inputs (exact aliasing, as in
// in-place ops, is fine). Throws std::invalid_argument on bad arguments (ndim > 64, negative sizes,
// reduce axes >= ndim, a reduced output with nonzero stride along a reduced axis, ...).
// Thread-safe (kernels are immutable); parallel over outer dims via runtime::parallel_for.
void execute(const Kernel& k, const int64_t* sizes, int ndim, const Operand* inputs,
             const Operand* outputs);

// Math hooks: vector implementations of float32 (and float64) transcendentals. The interpreter
// calls them on whole contiguous chunks of values. `storage` picks whose values a float hook
// serves: float32 (default), or bfloat16 / float16 values (held as exactly representable floats;
// the interpreter rounds the result) — eager computes those with other kernels than float32's,
// so exact results need their own hook; a bf16/fp16 op without one uses the float32 hook.
// nullptr restores the built-in default (std:: functions, element by element).
// Set at start-up, before kernels run (reads are relaxed atomics). Unary ops: kExp, kExp2,
// kExpm1, kLog, kLog2, kLog10, kLog1p, kSqrt, kRsqrt, kSin, kCos, kTan, kAtan, kTanh, kSigmoid,
// kErf, kErfc, kReciprocal. Binary: kPow. Others throw std::invalid_argument.
using VecMathFn = void (*)(const float* x, float* y, int64_t n);
using VecMathFn2 = void (*)(const float* a, const float* b, float* y, int64_t n);
using VecMathFnF64 = void (*)(const double* x, double* y, int64_t n);
using VecMathFn2F64 = void (*)(const double* a, const double* b, double* y, int64_t n);
void set_float_math(Op op, VecMathFn fn, DType storage = DType::kFloat32);
void set_float_math2(Op op, VecMathFn2 fn);
void set_double_math(Op op, VecMathFnF64 fn);
void set_double_math2(Op op, VecMathFn2F64 fn);

}  // namespace openneuron::ir
