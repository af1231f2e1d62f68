// The elementwise instructions of a traced NKI program (loads, stores, copies, casts, fills,
// iota, activations, tensor-tensor/scalar ops, selects, reductions over free axes): rows of the
// iteration space in chunks of float32 lanes, each operand converted in, the steps applied as
// vectorizable loops, the result converted out; two-axis instructions ([partition, free] tiles,
// nearly all) take a shorter row path (run_rows2). Matmul is in matmul.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_util.h"
#include "nki/convert.h"
#include "nki/program.h"
#include "runtime/parallel.h"

namespace openneuron::nki {
namespace {

using ir::numeric::bf16_from_f32;
using ir::numeric::f16_from_f32;
using ir::numeric::f32_from_bf16;
using ir::numeric::f32_from_f16;
using kernels::exp_f32;

constexpr int kChunk = 256;

template <class T, class F>
OPENNEURON_INLINE void gather(const char* base, int64_t off, int64_t stride, int n, float* dst,
                              F cvt) {
  const T* p = reinterpret_cast<const T*>(base) + off;
  if (stride == 1) {
    for (int j = 0; j < n; ++j) dst[j] = cvt(p[j]);
  } else if (stride == 0) {
    const float v = cvt(p[0]);
    for (int j = 0; j < n; ++j) dst[j] = v;
  } else {
    for (int j = 0; j < n; ++j) dst[j] = cvt(p[j * stride]);
  }
}

template <class T, class F>
OPENNEURON_INLINE void scatter(char* base, int64_t off, int64_t stride, int n, const float* src,
                               F cvt) {
  T* p = reinterpret_cast<T*>(base) + off;
  if (stride == 1) {
    for (int j = 0; j < n; ++j) p[j] = cvt(src[j]);
  } else {
    for (int j = 0; j < n; ++j) p[j * stride] = cvt(src[j]);
  }
}

// A copy of n lanes between views of one dtype moves their bytes, as a DMA does (int32 and
// uint32 past 2^24 stay exact; floats keep their bits): through a chunk-sized staging buffer
// unless both strides are 1, so an overlapping copy reads every lane before it writes any, as
// through registers.
OPENNEURON_INLINE void copy_bytes(size_t size, const char* from, int64_t from_stride, char* to,
                                  int64_t to_stride, int n) {
  if (from_stride == 1 && to_stride == 1) {
    std::memmove(to, from, size * static_cast<size_t>(n));
    return;
  }
  alignas(16) char staged[kChunk * 4];
  for (int j = 0; j < n; ++j)
    std::memcpy(staged + size * static_cast<size_t>(j),
                from + static_cast<int64_t>(size) * from_stride * j, size);
  for (int j = 0; j < n; ++j)
    std::memcpy(to + static_cast<int64_t>(size) * to_stride * j,
                staged + size * static_cast<size_t>(j), size);
}

OPENNEURON_INLINE void load_lanes(DType dt, const char* base, int64_t off, int64_t stride, int n,
                                  float* dst) {
  switch (dt) {
    case DType::k_float32:
      gather<float>(base, off, stride, n, dst, [](float v) { return v; });
      break;
    case DType::k_bfloat16:
      gather<uint16_t>(base, off, stride, n, dst, [](uint16_t v) { return f32_from_bf16(v); });
      break;
    case DType::k_float16:
      gather<uint16_t>(base, off, stride, n, dst, [](uint16_t v) { return f32_from_f16(v); });
      break;
    case DType::k_int32:
      gather<int32_t>(base, off, stride, n, dst, [](int32_t v) { return static_cast<float>(v); });
      break;
    case DType::k_uint8:
      gather<uint8_t>(base, off, stride, n, dst, [](uint8_t v) { return static_cast<float>(v); });
      break;
    case DType::k_int8:
      gather<int8_t>(base, off, stride, n, dst, [](int8_t v) { return static_cast<float>(v); });
      break;
    case DType::k_uint16:
      gather<uint16_t>(base, off, stride, n, dst, [](uint16_t v) { return static_cast<float>(v); });
      break;
    case DType::k_int16:
      gather<int16_t>(base, off, stride, n, dst, [](int16_t v) { return static_cast<float>(v); });
      break;
    case DType::k_uint32:
      gather<uint32_t>(base, off, stride, n, dst, [](uint32_t v) { return static_cast<float>(v); });
      break;
    case DType::k_float8_e4m3:
      gather<uint8_t>(base, off, stride, n, dst, [](uint8_t v) { return f32_from_fp8_e4m3(v); });
      break;
    case DType::k_float8_e5m2:
      gather<uint8_t>(base, off, stride, n, dst, [](uint8_t v) { return f32_from_fp8_e5m2(v); });
      break;
    default:
      break;
  }
}

OPENNEURON_INLINE void store_lanes(DType dt, char* base, int64_t off, int64_t stride, int n,
                                   const float* src) {
  switch (dt) {
    case DType::k_float32:
      scatter<float>(base, off, stride, n, src, [](float v) { return v; });
      break;
    case DType::k_bfloat16:
      scatter<uint16_t>(base, off, stride, n, src, [](float v) { return bf16_from_f32(v); });
      break;
    case DType::k_float16:
      scatter<uint16_t>(base, off, stride, n, src, [](float v) { return f16_from_f32(v); });
      break;
    case DType::k_int32:
      scatter<int32_t>(base, off, stride, n, src, [](float v) { return to_int32(v); });
      break;
    case DType::k_uint8:
      scatter<uint8_t>(base, off, stride, n, src,
                       [](float v) { return to_int<uint8_t>(v, 0.0f, 255.0f); });
      break;
    case DType::k_int8:
      scatter<int8_t>(base, off, stride, n, src,
                      [](float v) { return to_int<int8_t>(v, -128.0f, 127.0f); });
      break;
    case DType::k_uint16:
      scatter<uint16_t>(base, off, stride, n, src,
                        [](float v) { return to_int<uint16_t>(v, 0.0f, 65535.0f); });
      break;
    case DType::k_int16:
      scatter<int16_t>(base, off, stride, n, src,
                       [](float v) { return to_int<int16_t>(v, -32768.0f, 32767.0f); });
      break;
    case DType::k_uint32:
      scatter<uint32_t>(base, off, stride, n, src, [](float v) { return to_uint32(v); });
      break;
    case DType::k_float8_e4m3:
      scatter<uint8_t>(base, off, stride, n, src, [](float v) { return fp8_e4m3_from_f32(v); });
      break;
    case DType::k_float8_e5m2:
      scatter<uint8_t>(base, off, stride, n, src, [](float v) { return fp8_e5m2_from_f32(v); });
      break;
    default:
      break;
  }
}

OPENNEURON_INLINE float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// d/dx of the sigmoid-approximated GELU, x * sigmoid(1.702 x).
OPENNEURON_INLINE float gelu_sigmoid_dx(float x) {
  const float s = 1.0f / (1.0f + exp_f32(-1.702f * x));
  return s + 1.702f * x * s * (1.0f - s);
}

// A uniform float in [0, 1) from (seed, lane index): splitmix64, counter-based like Philox.
OPENNEURON_INLINE float uniform(uint64_t seed, float index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(static_cast<int64_t>(index));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// A uniform float in [0, 1) from a key given as two floats' bit patterns (a kernel's own
// random state, nl.random_seed / nisa.set_rng_seed) and a lane index: no launch seed, so a
// kernel that seeds itself draws the same values on every run.
OPENNEURON_INLINE float keyed_uniform(float k0, float k1, float index) {
  uint32_t b0, b1;
  std::memcpy(&b0, &k0, sizeof(b0));
  std::memcpy(&b1, &k1, sizeof(b1));
  return uniform(((uint64_t{b0} << 32) | b1) ^ 0x5851F42D4C957F2Dull, index);
}

#define NKI_LOOP(expr)             \
  for (int j = 0; j < n; ++j) {    \
    const float x = a[AS ? 0 : j]; \
    const float y = b[BS ? 0 : j]; \
    (void)x;                       \
    (void)y;                       \
    o[j] = (expr);                 \
  }                                \
  break

// o[0..n) = op(a, b, c) lane by lane. AS / BS: a / b is one value for every lane (a row's
// scalar: a [P, 1] tile read along the free axis, a constant), read as a[0] / b[0].
template <bool AS = false, bool BS = false>
OPENNEURON_INLINE void apply(Op op, int n, float* o, const float* a, const float* b, const float* c,
                             uint64_t seed) {
  switch (op) {
    case Op::k_copy:
      NKI_LOOP(x);
    case Op::k_neg:
      NKI_LOOP(-x);
    case Op::k_abs:
      NKI_LOOP(std::fabs(x));
    case Op::k_exp:
      NKI_LOOP(exp_f32(x));
    case Op::k_log:
      NKI_LOOP(std::log(x));
    case Op::k_sqrt:
      NKI_LOOP(std::sqrt(x));
    case Op::k_rsqrt:
      NKI_LOOP(1.0f / std::sqrt(x));
    case Op::k_reciprocal:
      NKI_LOOP(1.0f / x);
    case Op::k_tanh:
      NKI_LOOP(std::tanh(x));
    case Op::k_sigmoid:
      NKI_LOOP(sigmoid_f(x));
    case Op::k_relu:
      NKI_LOOP(x > 0.0f ? x : 0.0f);
    case Op::k_gelu:
      NKI_LOOP(0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)));
    case Op::k_gelu_apprx_tanh:
      NKI_LOOP(0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))));
    case Op::k_silu:
      NKI_LOOP(x * sigmoid_f(x));
    case Op::k_softplus:
      NKI_LOOP(x > 20.0f ? x : std::log1p(exp_f32(x)));
    case Op::k_mish:
      NKI_LOOP(x * std::tanh(x > 20.0f ? x : std::log1p(exp_f32(x))));
    case Op::k_sin:
      NKI_LOOP(std::sin(x));
    case Op::k_cos:
      NKI_LOOP(std::cos(x));
    case Op::k_square:
      NKI_LOOP(x * x);
    case Op::k_sign:
      NKI_LOOP(x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x));
    case Op::k_erf:
      NKI_LOOP(std::erf(x));
    case Op::k_floor:
      NKI_LOOP(std::floor(x));
    case Op::k_ceil:
      NKI_LOOP(std::ceil(x));
    case Op::k_trunc:
      NKI_LOOP(std::trunc(x));
    case Op::k_logical_not:
      NKI_LOOP(x == 0.0f ? 1.0f : 0.0f);
    case Op::k_tan:
      NKI_LOOP(std::tan(x));
    case Op::k_arctan:
      NKI_LOOP(std::atan(x));
    case Op::k_gelu_apprx_sigmoid:
      NKI_LOOP(x * sigmoid_f(1.702f * x));
    case Op::k_gelu_dx:  // Phi(x) + x phi(x)
      NKI_LOOP(0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) +
               x * 0.3989422804014327f * exp_f32(-0.5f * x * x));
    case Op::k_gelu_apprx_sigmoid_dx:
      NKI_LOOP(gelu_sigmoid_dx(x));
    case Op::k_silu_dx:
      NKI_LOOP(sigmoid_f(x) * (1.0f + x * (1.0f - sigmoid_f(x))));
    case Op::k_erf_dx:  // 2 / sqrt(pi) exp(-x^2)
      NKI_LOOP(1.1283791670955126f * exp_f32(-x * x));
    case Op::k_invert:
      for (int j = 0; j < n; ++j) o[j] = bits_op(op, a[AS ? 0 : j], 0.0f);
      break;
    case Op::k_add:
      NKI_LOOP(x + y);
    case Op::k_subtract:
      NKI_LOOP(x - y);
    case Op::k_multiply:
      NKI_LOOP(x * y);
    case Op::k_divide:
      NKI_LOOP(x / y);
    case Op::k_maximum:
      NKI_LOOP(x > y ? x : y);
    case Op::k_minimum:
      NKI_LOOP(x < y ? x : y);
    case Op::k_abs_max:  // the signed value of the larger magnitude (x on a tie)
      NKI_LOOP(std::fabs(x) >= std::fabs(y) ? x : y);
    case Op::k_abs_min:
      NKI_LOOP(std::fabs(x) <= std::fabs(y) ? x : y);
    case Op::k_power:
      NKI_LOOP(std::pow(x, y));
    case Op::k_mod:
      NKI_LOOP(x - std::floor(x / y) * y);
    case Op::k_equal:
      NKI_LOOP(x == y ? 1.0f : 0.0f);
    case Op::k_not_equal:
      NKI_LOOP(x != y ? 1.0f : 0.0f);
    case Op::k_less:
      NKI_LOOP(x < y ? 1.0f : 0.0f);
    case Op::k_less_equal:
      NKI_LOOP(x <= y ? 1.0f : 0.0f);
    case Op::k_greater:
      NKI_LOOP(x > y ? 1.0f : 0.0f);
    case Op::k_greater_equal:
      NKI_LOOP(x >= y ? 1.0f : 0.0f);
    case Op::k_logical_and:
      NKI_LOOP((x != 0.0f && y != 0.0f) ? 1.0f : 0.0f);
    case Op::k_logical_or:
      NKI_LOOP((x != 0.0f || y != 0.0f) ? 1.0f : 0.0f);
    case Op::k_logical_xor:
      NKI_LOOP(((x != 0.0f) != (y != 0.0f)) ? 1.0f : 0.0f);
    case Op::k_bitwise_and:
    case Op::k_bitwise_or:
    case Op::k_bitwise_xor:
    case Op::k_left_shift:
    case Op::k_right_shift:
      for (int j = 0; j < n; ++j) o[j] = bits_op(op, a[AS ? 0 : j], b[BS ? 0 : j]);
      break;
    case Op::k_select:
      for (int j = 0; j < n; ++j) o[j] = a[AS ? 0 : j] != 0.0f ? b[BS ? 0 : j] : c[j];
      break;
    case Op::k_launch_random:  // a = lane index
      for (int j = 0; j < n; ++j) o[j] = uniform(seed, a[AS ? 0 : j]);
      break;
    case Op::k_random:  // a, b = key, c = lane index
      for (int j = 0; j < n; ++j) o[j] = keyed_uniform(a[j], b[j], c[j]);
      break;
    default:
      break;
  }
}
#undef NKI_LOOP

OPENNEURON_INLINE float reduce_identity(Op op) {
  switch (op) {
    case Op::k_maximum:
      return -INFINITY;
    case Op::k_minimum:
    case Op::k_abs_min:
      return INFINITY;
    case Op::k_multiply:
      return 1.0f;
    default:
      return 0.0f;
  }
}

OPENNEURON_INLINE float combine(Op op, float acc, float v) {
  switch (op) {
    case Op::k_maximum:
      return v > acc ? v : acc;
    case Op::k_minimum:
      return v < acc ? v : acc;
    case Op::k_multiply:
      return acc * v;
    case Op::k_abs_max:  // the signed value of the larger magnitude, the earlier on a tie
      return std::fabs(v) > std::fabs(acc) ? v : acc;
    case Op::k_abs_min:
      return std::fabs(v) < std::fabs(acc) ? v : acc;
    default:  // add (the parser admits only these reductions)
      return acc + v;
  }
}

OPENNEURON_INLINE float reduce_lanes(Op op, const float* v, int n) {
  if (op == Op::k_add) return kernels::sum_f32(v, n);
  if (op == Op::k_maximum) return kernels::max_f32(v, n);
  float acc = reduce_identity(op);
  for (int j = 0; j < n; ++j) acc = combine(op, acc, v[j]);
  return acc;
}

OPENNEURON_INLINE int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// [lo, hi) of the innermost axis where every predicate holds, at outer index idx.
void lane_range(const Instr& in, const int64_t* idx, int64_t* lo, int64_t* hi) {
  const int last = in.ndim - 1;
  *lo = 0;
  *hi = in.extent[last];
  for (const Pred& p : in.preds) {
    int64_t v = p.c;
    for (int d = 0; d < last; ++d) v += p.coef[d] * idx[d];
    const int64_t k = p.coef[last];
    if (k == 0) {
      if (v < 0) *hi = 0;
    } else if (k > 0) {  // v + k*j >= 0  <=>  j >= ceil(-v / k)
      *lo = std::max(*lo, -floor_div(v, k));
    } else {  // j <= floor(v / -k)
      *hi = std::min(*hi, floor_div(v, -k) + 1);
    }
  }
  if (*hi < *lo) *hi = *lo;
}

OPENNEURON_INLINE int64_t outer_offset(const Operand& o, const int64_t* idx, int last) {
  int64_t off = o.offset;
  for (int d = 0; d < last; ++d) off += o.stride[d] * idx[d];
  return off;
}

// Registers of one instruction over one chunk. A float32 operand read with unit stride is used
// in place (no copy) when the instruction has steps or reduces; constants are filled once per
// Regs.
struct Regs {
  float r[kMaxRegisters][kChunk];
  const float* p[kMaxRegisters];
  bool consts_filled = false;
};

// Lanes [j0, j0 + n) of the row at outer index idx: operands in, steps applied. Returns the
// result (a register; never the operand's own memory unless the instruction reduces).
OPENNEURON_ISA_BODY const float* eval_chunk_body(const Instr& in, char* const* slots,
                                                 const int64_t* idx, int64_t j0, int n,
                                                 uint64_t seed, Regs* regs) {
  const int last = in.ndim - 1;
  const int n_src = static_cast<int>(in.src.size());
  const bool in_place = !in.steps.empty() || in.nreduce > 0;
  for (int i = 0; i < n_src; ++i) {
    const Operand& o = in.src[static_cast<size_t>(i)];
    float* dst = regs->r[i];
    regs->p[i] = dst;
    if (o.type == Operand::kView) {
      const int64_t off = outer_offset(o, idx, last) + o.stride[last] * j0;
      if (in_place && o.dtype == DType::k_float32 && o.stride[last] == 1)
        regs->p[i] = reinterpret_cast<const float*>(slots[o.slot]) + off;
      else
        load_lanes(o.dtype, slots[o.slot], off, o.stride[last], n, dst);
    } else if (o.type == Operand::kConst) {
      if (!regs->consts_filled)
        for (int j = 0; j < kChunk; ++j) dst[j] = o.value;
    } else {
      const int64_t base = outer_offset(o, idx, last) + o.stride[last] * j0;
      for (int j = 0; j < n; ++j) dst[j] = static_cast<float>(base + o.stride[last] * j);
    }
  }
  regs->consts_filled = true;
  for (size_t s = 0; s < in.steps.size(); ++s) {
    const Step& st = in.steps[s];
    float* out = regs->r[n_src + static_cast<int>(s)];
    apply(st.op, n, out, regs->p[st.a], regs->p[st.b], regs->p[st.c], seed);
    regs->p[n_src + static_cast<int>(s)] = out;
  }
  return regs->p[in.steps.empty() ? 0 : n_src + static_cast<int>(in.steps.size()) - 1];
}
OPENNEURON_ISA_BODY void store_chunk_body(const Instr& in, char* const* slots, int64_t off,
                                          int64_t stride, int n, const float* v, float* old) {
  const Operand& d = in.dst;
  if (in.accumulate) {
    load_lanes(d.dtype, slots[d.slot], off, stride, n, old);
    apply(in.acc_op, n, old, old, v, v, 0);
    v = old;
  }
  store_lanes(d.dtype, slots[d.slot], off, stride, n, v);
}

// idx[0..count) += 1 in mixed radix over extent[0..count).
OPENNEURON_INLINE void advance(const Instr& in, int64_t* idx, int count) {
  for (int d = count - 1; d >= 0; --d) {
    if (++idx[d] < in.extent[d]) return;
    idx[d] = 0;
  }
}

OPENNEURON_INLINE void unflatten(const Instr& in, int64_t flat, int64_t* idx, int count) {
  for (int d = count - 1; d >= 0; --d) {
    idx[d] = flat % in.extent[d];
    flat /= in.extent[d];
  }
}

OPENNEURON_ISA_BODY void run_rows_body(const Instr& in, char* const* slots, uint64_t seed,
                                       int64_t r0, int64_t r1) {
  const int last = in.ndim - 1;
  int64_t idx[kMaxDims] = {};
  unflatten(in, r0, idx, last);
  // A copy between views of one dtype (most loads and stores) moves bytes (copy_bytes).
  const Operand& s0 = in.src[0];
  const bool raw_copy =
      in.steps.empty() && !in.accumulate && s0.type == Operand::kView && s0.dtype == in.dst.dtype;
  const size_t size = dtype_size(in.dst.dtype);
  Regs regs;
  float old[kChunk];
  for (int64_t r = r0; r < r1; ++r, advance(in, idx, last)) {
    int64_t lo, hi;
    lane_range(in, idx, &lo, &hi);
    const int64_t dst_off = outer_offset(in.dst, idx, last);
    if (raw_copy) {  // chunk by chunk, as through registers (an overlapping copy alike)
      const int64_t from = outer_offset(s0, idx, last);
      const int64_t fs = s0.stride[last], ts = in.dst.stride[last];
      for (int64_t j0 = lo; j0 < hi; j0 += kChunk)
        copy_bytes(size, slots[s0.slot] + (from + fs * j0) * static_cast<int64_t>(size), fs,
                   slots[in.dst.slot] + (dst_off + ts * j0) * static_cast<int64_t>(size), ts,
                   static_cast<int>(std::min<int64_t>(kChunk, hi - j0)));
      continue;
    }
    for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, hi - j0));
      const float* v = eval_chunk_body(in, slots, idx, j0, n, seed, &regs);
      store_chunk_body(in, slots, dst_off + in.dst.stride[last] * j0, in.dst.stride[last], n, v,
                       old);
    }
  }
}

OPENNEURON_ISA_DISPATCH(void, run_rows,
                        (const Instr& in, char* const* slots, uint64_t seed, int64_t r0,
                         int64_t r1),
                        (in, slots, seed, r0, r1))

// Outputs [e0, e1) of a reduction: each is the reduce_op of its rows' active lanes.
OPENNEURON_ISA_BODY void run_reduce_body(const Instr& in, char* const* slots, uint64_t seed,
                                         int64_t e0, int64_t e1) {
  const int last = in.ndim - 1;
  const int n_out = in.ndim - in.nreduce;
  int64_t rows = 1;
  for (int d = n_out; d < last; ++d) rows *= in.extent[d];
  int64_t idx[kMaxDims] = {};
  Regs regs;
  float old[kChunk];
  for (int64_t e = e0; e < e1; ++e) {
    unflatten(in, e, idx, n_out);
    float acc = reduce_identity(in.reduce_op);
    int64_t lanes = 0;
    for (int64_t rr = 0; rr < rows; ++rr) {
      int64_t rest = rr;
      for (int d = last - 1; d >= n_out; --d) {
        idx[d] = rest % in.extent[d];
        rest /= in.extent[d];
      }
      int64_t lo, hi;
      lane_range(in, idx, &lo, &hi);
      for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, hi - j0));
        const float* v = eval_chunk_body(in, slots, idx, j0, n, seed, &regs);
        acc = combine(in.reduce_op, acc, reduce_lanes(in.reduce_op, v, n));
        lanes += n;
      }
    }
    if (lanes == 0) continue;  // every lane masked: the output is not written
    const float result = acc * in.post_scale;
    store_chunk_body(in, slots, outer_offset(in.dst, idx, n_out), 0, 1, &result, old);
  }
}

OPENNEURON_ISA_DISPATCH(void, run_reduce,
                        (const Instr& in, char* const* slots, uint64_t seed, int64_t e0,
                         int64_t e1),
                        (in, slots, seed, e0, e1))

// --- two-axis instructions: [partition, free] tiles, nearly every instruction ---------------
//
// The lanes, operations and order of run_rows / run_reduce, with a row's work cut to what a
// two-axis instruction needs: offsets from two strides, operands and steps that are one value
// for the whole row (a [P, 1] tile broadcast along the free axis, a constant) computed once
// instead of per lane, and the last step written straight into a float32 unit-stride
// destination unless an operand read in place overlaps it partly (then through a register and
// stored, as run_rows does).

constexpr int kArity[] = {
#define OPENNEURON_NKI_OP_ARITY_ENTRY(name, arity) arity,
    OPENNEURON_NKI_OPS(OPENNEURON_NKI_OP_ARITY_ENTRY)
#undef OPENNEURON_NKI_OP_ARITY_ENTRY
};

// Registers of one instruction over one chunk of a row; a scalar register holds its one value
// at r[reg][0].
struct RowRegs {
  float r[kMaxRegisters][kChunk];
  const float* p[kMaxRegisters];
  bool scalar[kMaxRegisters];
  bool in_place[kMaxRegisters];
};

// Register reg over n lanes: a scalar one broadcast into its own storage.
OPENNEURON_INLINE const float* lanes_of(RowRegs* R, int reg, int n) {
  if (!R->scalar[reg]) return R->p[reg];
  float* v = R->r[reg];
  const float x = v[0];
  for (int j = 1; j < n; ++j) v[j] = x;
  return v;
}

OPENNEURON_INLINE void step_lanes(const Step& st, int n, float* out, RowRegs* R, uint64_t seed) {
  const float* a = R->p[st.a];
  const float* b = R->p[st.b];
  const int arity = kArity[static_cast<int>(st.op)];
  if (arity == 3) {
    apply(st.op, n, out, lanes_of(R, st.a, n), lanes_of(R, st.b, n), lanes_of(R, st.c, n), seed);
  } else if (R->scalar[st.a] && (arity == 1 || R->scalar[st.b])) {
    apply(st.op, 1, out, a, b, b, seed);
  } else if (arity == 2 && R->scalar[st.a]) {
    apply<true, false>(st.op, n, out, a, b, b, seed);
  } else if (arity == 2 && R->scalar[st.b]) {
    apply<false, true>(st.op, n, out, a, b, b, seed);
  } else {
    apply(st.op, n, out, a, b, b, seed);
  }
}

// Rows [p0, p1) of a two-axis instruction (clipped by the caller to its extent).
// Lanes outside [lane0, lane1) are left alone (a column instruction run transposed).
OPENNEURON_ISA_BODY void run_rows2_body(const Instr& in, char* const* slots, uint64_t seed,
                                        int64_t p0, int64_t p1, int64_t lane0, int64_t lane1) {
  const int n_src = static_cast<int>(in.src.size());
  const int n_steps = static_cast<int>(in.steps.size());
  const int res = n_steps == 0 ? 0 : n_src + n_steps - 1;
  const bool reduce = in.nreduce == 1;
  const int64_t width = in.extent[1];
  const Operand& d = in.dst;
  const Operand& s0 = in.src[0];
  const bool raw_copy = !reduce && n_steps == 0 && !in.accumulate && s0.type == Operand::kView &&
                        s0.dtype == d.dtype;  // copy_bytes
  const size_t size = dtype_size(d.dtype);
  RowRegs R;
  float old[kChunk];
  for (int i = 0; i < n_src; ++i) {
    const Operand& o = in.src[static_cast<size_t>(i)];
    R.scalar[i] = o.type == Operand::kConst || o.stride[1] == 0;
    R.in_place[i] = o.type == Operand::kView && o.dtype == DType::k_float32 && o.stride[1] == 1 &&
                    (n_steps > 0 || reduce);
    R.p[i] = R.r[i];
    if (o.type == Operand::kConst) R.r[i][0] = o.value;
  }
  for (int s = 0; s < n_steps; ++s) {
    const Step& st = in.steps[static_cast<size_t>(s)];
    const int arity = kArity[static_cast<int>(st.op)];
    R.scalar[n_src + s] =
        R.scalar[st.a] && (arity < 2 || R.scalar[st.b]) && (arity < 3 || R.scalar[st.c]);
    R.in_place[n_src + s] = false;
    R.p[n_src + s] = R.r[n_src + s];
  }
  const bool direct = !reduce && n_steps > 0 && !in.accumulate && d.dtype == DType::k_float32 &&
                      d.stride[1] == 1 && !R.scalar[res];
  int64_t idx[kMaxDims] = {};
  for (int64_t row = p0; row < p1; ++row) {
    int64_t lo = 0, hi = width;
    if (!in.preds.empty()) {
      idx[0] = row;
      lane_range(in, idx, &lo, &hi);
    }
    lo = std::max(lo, lane0);
    hi = std::max(lo, std::min(hi, lane1));
    const int64_t dst_row = d.offset + d.stride[0] * row;
    if (raw_copy) {  // chunk by chunk, as through registers (an overlapping copy alike)
      const int64_t from = s0.offset + s0.stride[0] * row;
      const int64_t fs = s0.stride[1], ts = d.stride[1];
      for (int64_t j0 = lo; j0 < hi; j0 += kChunk)
        copy_bytes(size, slots[s0.slot] + (from + fs * j0) * static_cast<int64_t>(size), fs,
                   slots[d.slot] + (dst_row + ts * j0) * static_cast<int64_t>(size), ts,
                   static_cast<int>(std::min<int64_t>(kChunk, hi - j0)));
      continue;
    }
    float acc = reduce_identity(in.reduce_op);
    int64_t lanes = 0;
    for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, hi - j0));
      for (int i = 0; i < n_src; ++i) {
        const Operand& o = in.src[static_cast<size_t>(i)];
        if (o.type == Operand::kConst) continue;
        const int64_t off = o.offset + o.stride[0] * row + o.stride[1] * j0;
        if (o.type == Operand::kIota) {
          for (int j = 0; j < (R.scalar[i] ? 1 : n); ++j)
            R.r[i][j] = static_cast<float>(off + o.stride[1] * j);
        } else if (R.in_place[i]) {
          R.p[i] = reinterpret_cast<const float*>(slots[o.slot]) + off;
        } else {
          load_lanes(o.dtype, slots[o.slot], off, o.stride[1], R.scalar[i] ? 1 : n, R.r[i]);
        }
      }
      float* to = direct ? reinterpret_cast<float*>(slots[d.slot]) + dst_row + j0 : nullptr;
      for (int i = 0; direct && i < n_src; ++i) {  // a partial overlap goes through a register
        if (!R.in_place[i]) continue;
        const auto q = reinterpret_cast<uintptr_t>(R.p[i]);
        const auto t = reinterpret_cast<uintptr_t>(to);
        const uintptr_t bytes = sizeof(float) * static_cast<uintptr_t>(n);
        if (q != t && q < t + bytes && t < q + bytes) to = nullptr;
      }
      for (int s = 0; s < n_steps; ++s) {
        const int reg = n_src + s;
        float* out = s == n_steps - 1 && to != nullptr ? to : R.r[reg];
        step_lanes(in.steps[static_cast<size_t>(s)], n, out, &R, seed);
        R.p[reg] = out;
      }
      if (reduce) {
        acc = combine(in.reduce_op, acc, reduce_lanes(in.reduce_op, lanes_of(&R, res, n), n));
        lanes += n;
      } else if (to == nullptr) {
        store_chunk_body(in, slots, dst_row + d.stride[1] * j0, d.stride[1], n,
                         lanes_of(&R, res, n), old);
      }
    }
    if (reduce && lanes > 0) {  // every lane masked: the output is not written
      const float result = acc * in.post_scale;
      store_chunk_body(in, slots, dst_row, 0, 1, &result, old);
    }
  }
}

OPENNEURON_ISA_DISPATCH(void, run_rows2,
                        (const Instr& in, char* const* slots, uint64_t seed, int64_t p0, int64_t p1,
                         int64_t lane0, int64_t lane1),
                        (in, slots, seed, p0, p1, lane0, lane1))

// Rows [p0, p1) of a two-axis instruction; a [P, 1] column instruction (Instr::transposed) as
// one row of P lanes, clipped to [p0, p1).
void run_two_axes(const Instr& in, char* const* slots, uint64_t seed, int64_t p0, int64_t p1) {
  if (!in.transposed.empty())
    run_rows2(in.transposed[0], slots, seed, 0, 1, p0, p1);
  else
    run_rows2(in, slots, seed, p0, p1, 0, INT64_MAX);
}

}  // namespace

void run_elementwise_rows(const Instr& in, char* const* slots, uint64_t seed, int64_t p0,
                          int64_t p1) {
  p1 = std::min(p1, in.extent[0]);
  if (p0 >= p1) return;
  for (int d = 1; d < in.ndim; ++d)
    if (in.extent[d] == 0) return;
  if (in.ndim == 2) {
    run_two_axes(in, slots, seed, p0, p1);
    return;
  }
  const bool reduce = in.nreduce > 0;
  const int n_outer = reduce ? in.ndim - in.nreduce : in.ndim - 1;
  int64_t inner = 1;  // outer indices per row of axis 0
  for (int d = 1; d < n_outer; ++d) inner *= in.extent[d];
  if (reduce)
    run_reduce(in, slots, seed, p0 * inner, p1 * inner);
  else
    run_rows(in, slots, seed, p0 * inner, p1 * inner);
}

void run_elementwise(const Instr& in, char* const* slots, bool parallel, uint64_t seed) {
  const int last = in.ndim - 1;
  for (int d = 0; d < in.ndim; ++d)
    if (in.extent[d] == 0) return;
  const bool reduce = in.nreduce > 0;
  const int n_outer = reduce ? in.ndim - in.nreduce : last;
  int64_t outer = 1;
  for (int d = 0; d < n_outer; ++d) outer *= in.extent[d];
  int64_t per_outer = 1;  // lanes behind each outer index
  for (int d = n_outer; d < in.ndim; ++d) per_outer *= in.extent[d];
  auto body = [&](int64_t b, int64_t e) {
    if (in.ndim == 2)
      run_two_axes(in, slots, seed, b, e);
    else if (reduce)
      run_reduce(in, slots, seed, b, e);
    else
      run_rows(in, slots, seed, b, e);
  };
  // NOTE: a parallel region costs a few microseconds; most tile instructions are smaller than
  // that is worth (128 x 512 lanes), so only large ones split.
  constexpr int64_t kParallelLanes = 1 << 17;
  if (parallel && outer > 1 && outer * per_outer >= kParallelLanes) {
    const int64_t grain =
        std::max<int64_t>(1, (kParallelLanes / 4) / std::max<int64_t>(1, per_outer));
    runtime::parallel_for(0, outer, grain, body);
  } else {
    body(0, outer);
  }
}

}  // namespace openneuron::nki
