// The vectorized interpreter for ir::Kernel (see execute.h). A kernel is split into two
// programs: the full-domain program (loads, pointwise ops, full-domain stores, reduction inputs)
// and the reduced-domain program (reduction results and what is computed from them). Each runs
// over tiles of up to kChunkElems elements: rows x cols, cols along the innermost simplified dim.
// The per-chunk loops (op kernels, loads, stores, accumulation) are compiled for AVX-512, AVX2
// and baseline x86-64 (OPENNEURON_ISA_DISPATCH, runtime/isa.h) and the active variant is called.
//
// NOTE: errno is never read by the interpreter; without it GCC vectorizes sqrt/floor/etc.
#pragma GCC optimize("no-math-errno")

#include "ir/execute.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/numeric.h"
#include "runtime/isa.h"
#include "runtime/parallel.h"

#define OPENNEURON_IR_INLINE inline __attribute__((always_inline))

namespace openneuron::ir {

// --- compute kinds --------------------------------------------------------------------------
// Values live in chunk buffers in their compute type: float for f32/bf16/f16 (bf16/f16 values
// hold exactly representable floats), double, int32, int64, uint8 (bool, 0/1).
enum class Kind : uint8_t { kF32, kF64, kI32, kI64, kB8 };

namespace {

constexpr int kLanes = 32;  // partial accumulators per reduction (mode A)

Kind kind_of(DType dt) {
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

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("ir::execute: " + msg);
}

// --- math hooks -----------------------------------------------------------------------------

// Float unary hooks by storage: [0] float32, [1] bfloat16, [2] float16 (Instr::round's codes).
std::array<std::array<std::atomic<VecMathFn>, kNumOps>, 3> g_f32_unary{};
std::array<std::atomic<VecMathFn2>, kNumOps> g_f32_binary{};
std::array<std::atomic<VecMathFnF64>, kNumOps> g_f64_unary{};
std::array<std::atomic<VecMathFn2F64>, kNumOps> g_f64_binary{};

bool hookable_unary(Op op) {
  switch (op) {
    case Op::kExp:
    case Op::kExp2:
    case Op::kExpm1:
    case Op::kLog:
    case Op::kLog2:
    case Op::kLog10:
    case Op::kLog1p:
    case Op::kSqrt:
    case Op::kRsqrt:
    case Op::kSin:
    case Op::kCos:
    case Op::kTan:
    case Op::kAtan:
    case Op::kTanh:
    case Op::kSigmoid:
    case Op::kErf:
    case Op::kErfc:
    case Op::kReciprocal:
      return true;
    default:
      return false;
  }
}

template <class T>
struct Hooks;
template <>
struct Hooks<float> {
  // round: the storage dtype's code; a bf16/f16 op without its own hook uses the float32 one.
  static VecMathFn unary(Op op, uint8_t round) {
    if (round != 0)
      if (VecMathFn h = g_f32_unary[round][static_cast<int>(op)].load(std::memory_order_relaxed))
        return h;
    return g_f32_unary[0][static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  static VecMathFn2 binary(Op op) {
    return g_f32_binary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
};
template <>
struct Hooks<double> {
  static VecMathFnF64 unary(Op op, uint8_t /*round*/) {
    return g_f64_unary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  static VecMathFn2F64 binary(Op op) {
    return g_f64_binary[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
};

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

uint8_t round_code(DType dt) { return dt == DType::kBFloat16 ? 1 : dt == DType::kFloat16 ? 2 : 0; }

bool exact_on_values(Op op) {
  switch (op) {
    case Op::kNeg:
    case Op::kAbs:
    case Op::kSign:
    case Op::kMax:
    case Op::kMin:
    case Op::kWhere:
    case Op::kFloor:
    case Op::kCeil:
    case Op::kTrunc:
    case Op::kRound:
      return true;
    default:
      return false;
  }
}

// Builds one program from the needed values (ascending ids = topological order).
void build_program(const Kernel& k, const std::vector<uint8_t>& needed, bool reduced_domain,
                   const std::vector<std::pair<int, ValueId>>& stores,
                   const std::vector<ValueId>& keep_alive, Program* p) {
  int nv = k.num_values();
  p->slot.assign(nv, -1);
  p->stores = stores;
  std::vector<int> last_use(nv, -1);
  const int kForever = std::numeric_limits<int>::max();
  std::vector<ValueId> order;
  for (ValueId v = 0; v < nv; ++v) {
    if (!needed[v]) continue;
    const Node& n = k.node(v);
    bool source =
        n.op == Op::kLoad || n.op == Op::kConstant || (reduced_domain && op_is_reduction(n.op));
    if (n.op == Op::kLoad) p->loads.push_back(v);
    if (n.op == Op::kConstant) p->consts.push_back(v);
    if (reduced_domain && op_is_reduction(n.op)) p->red_inputs.push_back(v);
    if (source) continue;
    order.push_back(v);
    int at = static_cast<int>(order.size()) - 1;
    for (ValueId a : n.args)
      if (a >= 0) last_use[a] = std::max(last_use[a], at);
  }
  for (auto& st : stores) last_use[st.second] = kForever;
  for (ValueId v : keep_alive) last_use[v] = kForever;
  // Slots: constants pinned; loads live until their last use; computed values likewise.
  std::vector<int> free_slots;
  auto alloc = [&]() {
    if (!free_slots.empty()) {
      int s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return p->nslots++;
  };
  for (ValueId v : p->consts) p->slot[v] = alloc();
  for (ValueId v : p->loads) p->slot[v] = alloc();
  // Loads whose only uses are... are kept simple: freed after their last instruction.
  for (size_t i = 0; i < order.size(); ++i) {
    ValueId v = order[i];
    const Node& n = k.node(v);
    p->slot[v] = alloc();
    Instr in{};
    in.op = n.op;
    in.out = v;
    in.a = n.args[0];
    in.b = n.args[1];
    in.c = n.args[2];
    DType arg_dt = k.node(n.op == Op::kWhere ? n.args[1] : n.args[0]).dtype;
    in.kind = kind_of(arg_dt);
    in.out_kind = kind_of(n.dtype);
    in.round = exact_on_values(n.op) ? 0 : round_code(n.dtype);
    if (n.op == Op::kCast && kind_of(arg_dt) == Kind::kF32 && n.dtype != DType::kFloat32 &&
        n.dtype != DType::kBFloat16 && n.dtype != DType::kFloat16) {
      in.round = 0;
    }
    p->instrs.push_back(in);
    for (int j = 0; j < 3; ++j) {
      ValueId a = n.args[j];
      if (a < 0 || last_use[a] != static_cast<int>(i) || p->slot[a] < 0) continue;
      bool dup = false;
      for (int m = 0; m < j; ++m) dup |= n.args[m] == a;
      const Node& an = k.node(a);
      bool pinned = an.op == Op::kConstant || (reduced_domain && op_is_reduction(an.op));
      if (!dup && !pinned) free_slots.push_back(p->slot[a]);
    }
  }
}

std::shared_ptr<const Plan> make_plan(const Kernel& k) {
  auto plan = std::make_shared<Plan>();
  int nv = k.num_values();
  std::vector<std::pair<int, ValueId>> full_stores, red_stores;
  plan->output_reduced.assign(k.num_outputs(), 0);
  for (int o = 0; o < k.num_outputs(); ++o) {
    ValueId v = k.output_value(o);
    if (k.is_reduced(v)) {
      red_stores.push_back({o, v});
      plan->output_reduced[o] = 1;
    } else {
      full_stores.push_back({o, v});
    }
  }
  for (ValueId v = 0; v < nv; ++v)
    if (op_is_reduction(k.node(v).op)) plan->reductions.push_back(v);
  // Reduced program: walk back from reduced stores, stopping at reductions.
  std::vector<uint8_t> need_red(nv, 0), need_full(nv, 0);
  for (auto& st : red_stores) need_red[st.second] = 1;
  for (ValueId v = nv - 1; v >= 0; --v) {
    if (!need_red[v] || op_is_reduction(k.node(v).op)) continue;
    for (ValueId a : k.node(v).args)
      if (a >= 0) need_red[a] = 1;
  }
  for (auto& st : full_stores) need_full[st.second] = 1;
  std::vector<ValueId> red_operands;
  for (ValueId r : plan->reductions) {
    need_full[k.node(r).args[0]] = 1;
    red_operands.push_back(k.node(r).args[0]);
  }
  for (ValueId v = nv - 1; v >= 0; --v) {
    if (!need_full[v]) continue;
    for (ValueId a : k.node(v).args)
      if (a >= 0) need_full[a] = 1;
  }
  build_program(k, need_full, false, full_stores, red_operands, &plan->full);
  build_program(k, need_red, true, red_stores, {}, &plan->reduced);
  plan->input_in_reduced.assign(k.num_inputs(), 0);
  for (ValueId v : plan->reduced.loads) plan->input_in_reduced[k.node(v).index] = 1;
  return plan;
}

// --- chunk loops ----------------------------------------------------------------------------

template <class T>
OPENNEURON_IR_INLINE T max_nan(T a, T b) {
  return (a != a) ? a : (b != b) ? b : (a > b ? a : b);
}
template <class T>
OPENNEURON_IR_INLINE T min_nan(T a, T b) {
  return (a != a) ? a : (b != b) ? b : (a < b ? a : b);
}

template <class T, class R, class F>
OPENNEURON_IR_INLINE void map1(const void* a, void* y, int64_t n, F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  R* __restrict py = static_cast<R*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i]);
}
template <class T, class R, class F>
OPENNEURON_IR_INLINE void map2(const void* a, const void* b, void* y, int64_t n, F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  R* __restrict py = static_cast<R*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i], pb[i]);
}
template <class T, class F>
OPENNEURON_IR_INLINE void map3(const void* a, const void* b, const void* c, void* y, int64_t n,
                               F f) {
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  const T* __restrict pc = static_cast<const T*>(c);
  T* __restrict py = static_cast<T*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = f(pa[i], pb[i], pc[i]);
}
template <class T>
OPENNEURON_IR_INLINE void where_loop(const void* c, const void* a, const void* b, void* y,
                                     int64_t n) {
  const uint8_t* __restrict pc = static_cast<const uint8_t*>(c);
  const T* __restrict pa = static_cast<const T*>(a);
  const T* __restrict pb = static_cast<const T*>(b);
  T* __restrict py = static_cast<T*>(y);
  for (int64_t i = 0; i < n; ++i) py[i] = pc[i] ? pa[i] : pb[i];
}

// Compare/logical ops shared by every kind. Returns false if op is not one of them.
template <class T>
OPENNEURON_IR_INLINE bool compare_op(const Instr& in, void* const* p, int64_t n) {
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kEq:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x == z); });
      break;
    case Op::kNe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x != z); });
      break;
    case Op::kLt:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x < z); });
      break;
    case Op::kLe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x <= z); });
      break;
    case Op::kGt:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x > z); });
      break;
    case Op::kGe:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t(x >= z); });
      break;
    case Op::kLogicalAnd:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) & (z != T(0))); });
      break;
    case Op::kLogicalOr:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) | (z != T(0))); });
      break;
    case Op::kLogicalXor:
      map2<T, uint8_t>(a, b, y, n, [](T x, T z) { return uint8_t((x != T(0)) ^ (z != T(0))); });
      break;
    case Op::kLogicalNot:
      map1<T, uint8_t>(a, y, n, [](T x) { return uint8_t(x == T(0)); });
      break;
    case Op::kWhere:
      where_loop<T>(a, b, p[in.c], y, n);
      break;
    default:
      return false;
  }
  return true;
}

template <class T, T (*F)(T)>
OPENNEURON_IR_INLINE void std_or_hook(Op op, uint8_t round, const void* a, void* y, int64_t n) {
  if (auto h = Hooks<T>::unary(op, round)) {
    h(static_cast<const T*>(a), static_cast<T*>(y), n);
    return;
  }
  map1<T, T>(a, y, n, [](T x) { return F(x); });
}

template <class T>
T f_exp(T x) {
  return std::exp(x);
}
template <class T>
T f_exp2(T x) {
  return std::exp2(x);
}
template <class T>
T f_expm1(T x) {
  return std::expm1(x);
}
template <class T>
T f_log(T x) {
  return std::log(x);
}
template <class T>
T f_log2(T x) {
  return std::log2(x);
}
template <class T>
T f_log10(T x) {
  return std::log10(x);
}
template <class T>
T f_log1p(T x) {
  return std::log1p(x);
}
template <class T>
T f_sqrt(T x) {
  return std::sqrt(x);
}
template <class T>
T f_rsqrt(T x) {
  return T(1) / std::sqrt(x);
}
template <class T>
T f_sin(T x) {
  return std::sin(x);
}
template <class T>
T f_cos(T x) {
  return std::cos(x);
}
template <class T>
T f_tan(T x) {
  return std::tan(x);
}
template <class T>
T f_atan(T x) {
  return std::atan(x);
}
template <class T>
T f_tanh(T x) {
  return std::tanh(x);
}
template <class T>
T f_sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
T f_erf(T x) {
  return std::erf(x);
}
template <class T>
T f_erfc(T x) {
  return std::erfc(x);
}
template <class T>
T f_reciprocal(T x) {
  return T(1) / x;
}

// torch.remainder / floor_divide for floating types (ATen's scalar formulas).
template <class T>
T f_remainder(T a, T b) {
  T mod = std::fmod(a, b);
  if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
  return mod;
}
template <class T>
T f_floor_div(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div != 0) {
    T fl = std::floor(div);
    if (div - fl > T(0.5)) fl += T(1);
    return fl;
  }
  return std::copysign(T(0), a / b);
}

template <class T>
OPENNEURON_IR_INLINE void float_op(const Instr& in, void* const* p, int64_t n) {
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kNeg:
      map1<T, T>(a, y, n, [](T x) { return -x; });
      break;
    case Op::kAbs:
      map1<T, T>(a, y, n, [](T x) { return std::fabs(x); });
      break;
    case Op::kSign:
      map1<T, T>(a, y, n, [](T x) { return T(T(0) < x) - T(x < T(0)); });
      break;
    case Op::kReciprocal:
      std_or_hook<T, f_reciprocal<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExp:
      std_or_hook<T, f_exp<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExp2:
      std_or_hook<T, f_exp2<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kExpm1:
      std_or_hook<T, f_expm1<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog:
      std_or_hook<T, f_log<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog2:
      std_or_hook<T, f_log2<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog10:
      std_or_hook<T, f_log10<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kLog1p:
      std_or_hook<T, f_log1p<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSqrt:
      std_or_hook<T, f_sqrt<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kRsqrt:
      std_or_hook<T, f_rsqrt<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSin:
      std_or_hook<T, f_sin<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kCos:
      std_or_hook<T, f_cos<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kTan:
      std_or_hook<T, f_tan<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kAtan:
      std_or_hook<T, f_atan<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kTanh:
      std_or_hook<T, f_tanh<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kSigmoid:
      std_or_hook<T, f_sigmoid<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kErf:
      std_or_hook<T, f_erf<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kErfc:
      std_or_hook<T, f_erfc<T>>(in.op, in.round, a, y, n);
      break;
    case Op::kFloor:
      map1<T, T>(a, y, n, [](T x) { return std::floor(x); });
      break;
    case Op::kCeil:
      map1<T, T>(a, y, n, [](T x) { return std::ceil(x); });
      break;
    case Op::kTrunc:
      map1<T, T>(a, y, n, [](T x) { return std::trunc(x); });
      break;
    case Op::kRound:
      map1<T, T>(a, y, n, [](T x) { return std::nearbyint(x); });
      break;
    case Op::kIsNan:
      map1<T, uint8_t>(a, y, n, [](T x) { return uint8_t(x != x); });
      break;
    case Op::kAdd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x + z; });
      break;
    case Op::kSub:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x - z; });
      break;
    case Op::kMul:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x * z; });
      break;
    case Op::kDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x / z; });
      break;
    case Op::kMax:
      map2<T, T>(a, b, y, n, [](T x, T z) { return max_nan(x, z); });
      break;
    case Op::kMin:
      map2<T, T>(a, b, y, n, [](T x, T z) { return min_nan(x, z); });
      break;
    case Op::kPow:
      if (auto h = Hooks<T>::binary(in.op)) {
        h(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n);
      } else {
        map2<T, T>(a, b, y, n, [](T x, T z) { return std::pow(x, z); });
      }
      break;
    case Op::kRemainder:
      map2<T, T>(a, b, y, n, [](T x, T z) { return f_remainder(x, z); });
      break;
    case Op::kFloorDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) { return f_floor_div(x, z); });
      break;
    case Op::kFma:
      map3<T>(a, b, p[in.c], y, n, [](T x, T z, T w) { return std::fma(x, z, w); });
      break;
    default:
      break;  // rejected by the builder
  }
}

// bf16/fp16 add/sub/mul/div with the rounding in the same loop (the hot ops of autocast
// chains; other ops round in a second pass over the L1-resident chunk).
template <int RM>
OPENNEURON_IR_INLINE float round_rm(float v) {
  if constexpr (RM == 1) {
    return numeric::round_bf16(v);
  } else {
    return numeric::round_f16(v);
  }
}
template <int RM>
OPENNEURON_IR_INLINE bool arith_rounded(const Instr& in, void* const* p, int64_t n) {
  if (in.op != Op::kAdd && in.op != Op::kSub && in.op != Op::kMul && in.op != Op::kDiv)
    return false;  // NOTE: before reading p[in.b]: unary ops have b == -1
  const void* a = p[in.a];
  const void* b = p[in.b];
  void* y = p[in.out];
  switch (in.op) {
    case Op::kAdd:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x + z); });
      return true;
    case Op::kSub:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x - z); });
      return true;
    case Op::kMul:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x * z); });
      return true;
    case Op::kDiv:
      map2<float, float>(a, b, y, n, [](float x, float z) { return round_rm<RM>(x / z); });
      return true;
    default:
      return false;
  }
}

template <class T, class U>
T int_pow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? T(-1) : T(1);
    return 0;
  }
  U result = 1, b = static_cast<U>(base);
  while (exp) {
    if (exp & 1) result *= b;
    b *= b;
    exp >>= 1;
  }
  return static_cast<T>(result);
}

template <class T, class U>
OPENNEURON_IR_INLINE void int_op(const Instr& in, void* const* p, int64_t n) {
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  constexpr T kMin = std::numeric_limits<T>::min();
  switch (in.op) {
    case Op::kNeg:
      map1<T, T>(a, y, n, [](T x) { return T(U(0) - U(x)); });
      break;
    case Op::kAbs:
      map1<T, T>(a, y, n, [](T x) { return x < 0 ? T(U(0) - U(x)) : x; });
      break;
    case Op::kSign:
      map1<T, T>(a, y, n, [](T x) { return T(T(0 < x) - T(x < 0)); });
      break;
    case Op::kBitNot:
      map1<T, T>(a, y, n, [](T x) { return T(~x); });
      break;
    case Op::kAdd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) + U(z)); });
      break;
    case Op::kSub:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) - U(z)); });
      break;
    case Op::kMul:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(U(x) * U(z)); });
      break;
    case Op::kDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        return z == 0 ? T(0) : (x == kMin && z == -1) ? kMin : T(x / z);
      });
      break;
    case Op::kRemainder:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        if (z == 0 || z == -1) return T(0);
        T r = x % z;
        return (r != 0 && ((r < 0) != (z < 0))) ? T(r + z) : r;
      });
      break;
    case Op::kFloorDiv:
      map2<T, T>(a, b, y, n, [](T x, T z) {
        if (z == 0) return T(0);
        if (x == kMin && z == -1) return kMin;
        T q = x / z;
        return (x % z != 0 && ((x < 0) != (z < 0))) ? T(q - 1) : q;
      });
      break;
    case Op::kMax:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x > z ? x : z; });
      break;
    case Op::kMin:
      map2<T, T>(a, b, y, n, [](T x, T z) { return x < z ? x : z; });
      break;
    case Op::kPow:
      map2<T, T>(a, b, y, n, [](T x, T z) { return int_pow<T, U>(x, z); });
      break;
    case Op::kBitAnd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x & z); });
      break;
    case Op::kBitOr:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x | z); });
      break;
    case Op::kBitXor:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x ^ z); });
      break;
    case Op::kFma:
      map3<T>(a, b, p[in.c], y, n, [](T x, T z, T w) { return T(U(x) * U(z) + U(w)); });
      break;
    default:
      break;
  }
}

OPENNEURON_IR_INLINE void bool_op(const Instr& in, void* const* p, int64_t n) {
  using T = uint8_t;
  if (compare_op<T>(in, p, n)) return;
  const void* a = p[in.a];
  const void* b = in.b >= 0 ? p[in.b] : nullptr;
  void* y = p[in.out];
  switch (in.op) {
    case Op::kBitNot:
      map1<T, T>(a, y, n, [](T x) { return T(x ^ 1); });
      break;
    case Op::kMax:
    case Op::kBitOr:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x | z); });
      break;
    case Op::kMin:
    case Op::kBitAnd:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x & z); });
      break;
    case Op::kBitXor:
      map2<T, T>(a, b, y, n, [](T x, T z) { return T(x ^ z); });
      break;
    default:
      break;
  }
}

// Float -> int without UB: out of range and NaN give the x86 "integer indefinite" (INT_MIN).
template <class S, class D>
OPENNEURON_IR_INLINE D float_to_int(S x) {
  constexpr S lo = -static_cast<S>(std::numeric_limits<D>::max()) - S(1);  // -2^k exactly
  bool ok = x >= lo && x < -lo;
  D r = static_cast<D>(ok ? x : S(0));
  return ok ? r : std::numeric_limits<D>::min();
}

template <class S, class D>
OPENNEURON_IR_INLINE D convert(S x) {
  if constexpr (std::is_same_v<D, uint8_t>) {
    return static_cast<uint8_t>(x != S(0));
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    return float_to_int<S, D>(x);
  } else {
    return static_cast<D>(x);
  }
}

template <class S>
OPENNEURON_IR_INLINE void cast_from(Kind to, const void* a, void* y, int64_t n) {
  switch (to) {
    case Kind::kF32:
      map1<S, float>(a, y, n, [](S x) { return convert<S, float>(x); });
      break;
    case Kind::kF64:
      map1<S, double>(a, y, n, [](S x) { return convert<S, double>(x); });
      break;
    case Kind::kI32:
      map1<S, int32_t>(a, y, n, [](S x) { return convert<S, int32_t>(x); });
      break;
    case Kind::kI64:
      map1<S, int64_t>(a, y, n, [](S x) { return convert<S, int64_t>(x); });
      break;
    case Kind::kB8:
      map1<S, uint8_t>(a, y, n, [](S x) { return convert<S, uint8_t>(x); });
      break;
  }
}

OPENNEURON_ISA_BODY void run_instr_body(const Instr& in, void* const* p, int64_t n) {
  if (in.op == Op::kCast) {
    switch (in.kind) {
      case Kind::kF32:
        cast_from<float>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kF64:
        cast_from<double>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kI32:
        cast_from<int32_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kI64:
        cast_from<int64_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
      case Kind::kB8:
        cast_from<uint8_t>(in.out_kind, p[in.a], p[in.out], n);
        break;
    }
  } else {
    switch (in.kind) {
      case Kind::kF32:
        if (in.round == 1 && arith_rounded<1>(in, p, n)) return;
        if (in.round == 2 && arith_rounded<2>(in, p, n)) return;
        float_op<float>(in, p, n);
        break;
      case Kind::kF64:
        float_op<double>(in, p, n);
        break;
      case Kind::kI32:
        int_op<int32_t, uint32_t>(in, p, n);
        break;
      case Kind::kI64:
        int_op<int64_t, uint64_t>(in, p, n);
        break;
      case Kind::kB8:
        bool_op(in, p, n);
        break;
    }
  }
  if (in.round == 1) {
    float* __restrict y = static_cast<float*>(p[in.out]);
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_bf16(y[i]);
  } else if (in.round == 2) {
    float* __restrict y = static_cast<float*>(p[in.out]);
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_f16(y[i]);
  }
}
OPENNEURON_ISA_DISPATCH(void, run_instr, (const Instr& in, void* const* p, int64_t n), (in, p, n))

// Strided row copy with conversion: stride 1 (vectorized), 0 (broadcast) or any.
template <class S, class D, class F>
OPENNEURON_IR_INLINE void gather(const S* __restrict s, int64_t st, D* __restrict d, int64_t n,
                                 F f) {
  if (st == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  } else if (st == 0) {
    D v = f(s[0]);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i * st]);
  }
}
template <class S, class D, class F>
OPENNEURON_IR_INLINE void scatter(const S* __restrict s, D* __restrict d, int64_t st, int64_t n,
                                  F f) {
  if (st == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  } else if (st == 0) {
    if (n > 0) d[0] = f(s[n - 1]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * st] = f(s[i]);
  }
}

template <class T>
T ident(T x) {
  return x;
}

// Loads n elements of dtype dt at src (element stride st) into a compute-kind buffer.
OPENNEURON_ISA_BODY void load_row_body(DType dt, const char* src, int64_t st, void* dst,
                                       int64_t n) {
  switch (dt) {
    case DType::kFloat32:
      gather(reinterpret_cast<const float*>(src), st, static_cast<float*>(dst), n, ident<float>);
      break;
    case DType::kBFloat16:
      gather(reinterpret_cast<const uint16_t*>(src), st, static_cast<float*>(dst), n,
             [](uint16_t h) { return numeric::f32_from_bf16(h); });
      break;
    case DType::kFloat16:
      gather(reinterpret_cast<const uint16_t*>(src), st, static_cast<float*>(dst), n,
             [](uint16_t h) { return numeric::f32_from_f16(h); });
      break;
    case DType::kFloat64:
      gather(reinterpret_cast<const double*>(src), st, static_cast<double*>(dst), n, ident<double>);
      break;
    case DType::kInt32:
      gather(reinterpret_cast<const int32_t*>(src), st, static_cast<int32_t*>(dst), n,
             ident<int32_t>);
      break;
    case DType::kInt64:
      gather(reinterpret_cast<const int64_t*>(src), st, static_cast<int64_t*>(dst), n,
             ident<int64_t>);
      break;
    case DType::kBool:
      gather(reinterpret_cast<const uint8_t*>(src), st, static_cast<uint8_t*>(dst), n,
             [](uint8_t b) { return uint8_t(b != 0); });
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, load_row,
                        (DType dt, const char* src, int64_t st, void* dst, int64_t n),
                        (dt, src, st, dst, n))

// Stores n compute-kind elements to dtype dt at dst (element stride st).
OPENNEURON_ISA_BODY void store_row_body(DType dt, const void* src, char* dst, int64_t st,
                                        int64_t n) {
  switch (dt) {
    case DType::kFloat32:
      scatter(static_cast<const float*>(src), reinterpret_cast<float*>(dst), st, n, ident<float>);
      break;
    case DType::kBFloat16:
      scatter(static_cast<const float*>(src), reinterpret_cast<uint16_t*>(dst), st, n,
              [](float f) { return numeric::bf16_from_f32(f); });
      break;
    case DType::kFloat16:
      scatter(static_cast<const float*>(src), reinterpret_cast<uint16_t*>(dst), st, n,
              [](float f) { return numeric::f16_from_f32(f); });
      break;
    case DType::kFloat64:
      scatter(static_cast<const double*>(src), reinterpret_cast<double*>(dst), st, n,
              ident<double>);
      break;
    case DType::kInt32:
      scatter(static_cast<const int32_t*>(src), reinterpret_cast<int32_t*>(dst), st, n,
              ident<int32_t>);
      break;
    case DType::kInt64:
      scatter(static_cast<const int64_t*>(src), reinterpret_cast<int64_t*>(dst), st, n,
              ident<int64_t>);
      break;
    case DType::kBool:
      scatter(static_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst), st, n,
              ident<uint8_t>);
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, store_row,
                        (DType dt, const void* src, char* dst, int64_t st, int64_t n),
                        (dt, src, dst, st, n))

// --- reductions -----------------------------------------------------------------------------

template <class T>
OPENNEURON_IR_INLINE T combine(Op op, T acc, T v) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case Op::kSum:
        return acc + v;
      case Op::kProd:
        return acc * v;
      case Op::kAmax:
        return (v != v || v > acc) ? v : acc;
      default:
        return (v != v || v < acc) ? v : acc;
    }
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return op == Op::kAmax ? T(acc | v) : T(acc & v);
  } else {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case Op::kSum:
        return T(U(acc) + U(v));
      case Op::kProd:
        return T(U(acc) * U(v));
      case Op::kAmax:
        return v > acc ? v : acc;
      default:
        return v < acc ? v : acc;
    }
  }
}

template <class T>
T identity(Op op) {
  switch (op) {
    case Op::kSum:
      return T(0);
    case Op::kProd:
      return T(1);
    case Op::kAmax:
      if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
      return std::numeric_limits<T>::lowest();
    default:
      if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
      return std::numeric_limits<T>::max();
  }
}

template <class T, class F>
OPENNEURON_IR_INLINE void acc_loop(T* __restrict acc, const T* __restrict v, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], v[i]);
}

// acc[i] = acc[i] (op) v[i], elementwise (mode B), or into kLanes lanes (mode A).
template <class T>
OPENNEURON_IR_INLINE void accumulate_t(Op op, bool lanes, void* accp, const void* vp, int64_t n) {
  T* acc = static_cast<T*>(accp);
  const T* v = static_cast<const T*>(vp);
  auto body = [&](auto f) {
    if (!lanes) {
      acc_loop(acc, v, n, f);
      return;
    }
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) acc_loop(acc, v + i, kLanes, f);
    acc_loop(acc, v + i, n - i, f);
  };
  switch (op) {
    case Op::kSum:
      body([](T x, T y) { return combine(Op::kSum, x, y); });
      break;
    case Op::kProd:
      body([](T x, T y) { return combine(Op::kProd, x, y); });
      break;
    case Op::kAmax:
      body([](T x, T y) { return combine(Op::kAmax, x, y); });
      break;
    default:
      body([](T x, T y) { return combine(Op::kAmin, x, y); });
      break;
  }
}

OPENNEURON_ISA_BODY void accumulate_body(Kind kind, Op op, bool lanes, void* acc, const void* v,
                                         int64_t n) {
  switch (kind) {
    case Kind::kF32:
      accumulate_t<float>(op, lanes, acc, v, n);
      break;
    case Kind::kF64:
      accumulate_t<double>(op, lanes, acc, v, n);
      break;
    case Kind::kI32:
      accumulate_t<int32_t>(op, lanes, acc, v, n);
      break;
    case Kind::kI64:
      accumulate_t<int64_t>(op, lanes, acc, v, n);
      break;
    case Kind::kB8:
      accumulate_t<uint8_t>(op, lanes, acc, v, n);
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, accumulate,
                        (Kind kind, Op op, bool lanes, void* acc, const void* v, int64_t n),
                        (kind, op, lanes, acc, v, n))

template <class T>
void fill_identity_t(Op op, void* acc, int64_t n) {
  T id = identity<T>(op);
  std::fill(static_cast<T*>(acc), static_cast<T*>(acc) + n, id);
}
void fill_identity(Kind kind, Op op, void* acc, int64_t n) {
  switch (kind) {
    case Kind::kF32:
      fill_identity_t<float>(op, acc, n);
      break;
    case Kind::kF64:
      fill_identity_t<double>(op, acc, n);
      break;
    case Kind::kI32:
      fill_identity_t<int32_t>(op, acc, n);
      break;
    case Kind::kI64:
      fill_identity_t<int64_t>(op, acc, n);
      break;
    case Kind::kB8:
      fill_identity_t<uint8_t>(op, acc, n);
      break;
  }
}

// Tree-combines kLanes lanes into out[index] (in the same kind).
template <class T>
void finish_lanes_t(Op op, void* lanes, void* out, int64_t index) {
  T* l = static_cast<T*>(lanes);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] = combine(op, l[i], l[i + w]);
  static_cast<T*>(out)[index] = l[0];
}
void finish_lanes(Kind kind, Op op, void* lanes, void* out, int64_t index) {
  switch (kind) {
    case Kind::kF32:
      finish_lanes_t<float>(op, lanes, out, index);
      break;
    case Kind::kF64:
      finish_lanes_t<double>(op, lanes, out, index);
      break;
    case Kind::kI32:
      finish_lanes_t<int32_t>(op, lanes, out, index);
      break;
    case Kind::kI64:
      finish_lanes_t<int64_t>(op, lanes, out, index);
      break;
    case Kind::kB8:
      finish_lanes_t<uint8_t>(op, lanes, out, index);
      break;
  }
}

void round_buffer(DType dt, void* buf, int64_t n) {
  float* y = static_cast<float*>(buf);
  if (dt == DType::kBFloat16)
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_bf16(y[i]);
  else if (dt == DType::kFloat16)
    for (int64_t i = 0; i < n; ++i) y[i] = numeric::round_f16(y[i]);
}

template <class T>
void fill_constant_t(const Node& n, void* dst, int64_t count) {
  T v = dtype_is_floating(n.dtype) ? static_cast<T>(n.constant_double())
                                   : static_cast<T>(n.constant_int());
  std::fill(static_cast<T*>(dst), static_cast<T*>(dst) + count, v);
}
void fill_constant(const Node& n, void* dst, int64_t count) {
  switch (kind_of(n.dtype)) {
    case Kind::kF32:
      fill_constant_t<float>(n, dst, count);
      break;
    case Kind::kF64:
      fill_constant_t<double>(n, dst, count);
      break;
    case Kind::kI32:
      fill_constant_t<int32_t>(n, dst, count);
      break;
    case Kind::kI64:
      fill_constant_t<int64_t>(n, dst, count);
      break;
    case Kind::kB8:
      fill_constant_t<uint8_t>(n, dst, count);
      break;
  }
}

// --- the iteration space --------------------------------------------------------------------

// NOTE: slot buffers are 8 KiB + 5 cache lines apart: at a multiple of 4 KiB every buffer
// would alias the others in the low address bits and loads would stall on unrelated stores
// (4K aliasing), costing ~2x on op chains.
constexpr int64_t kSlotBytes = kChunkElems * 8 + 320;

int64_t kind_bytes(Kind k) {
  return k == Kind::kF32 || k == Kind::kI32 ? 4 : k == Kind::kB8 ? 1 : 8;
}

// A list of dims without heap allocation (at most 64 dims).
struct DimList {
  int d[64];
  int n = 0;
  void push_back(int x) { d[n++] = x; }
  void pop_back() { --n; }
  int back() const { return d[n - 1]; }
  bool empty() const { return n == 0; }
  size_t size() const { return static_cast<size_t>(n); }
  int operator[](size_t i) const { return d[i]; }
  const int* begin() const { return d; }
  const int* end() const { return d + n; }
};

struct Space {
  int nin = 0, nops = 0;
  std::vector<char*> base;     // per operand
  std::vector<DType> dtype;    // per operand
  std::vector<int64_t> esize;  // per operand
  int nd = 0;
  std::vector<int64_t> size;    // per dim, outer -> inner
  std::vector<uint8_t> red;     // per dim
  std::vector<int64_t> stride;  // [d * nops + o]
  int64_t st(int d, int o) const { return stride[static_cast<size_t>(d) * nops + o]; }
};

// A tile: rows x cols elements; cols along col_dim, rows along row_dim (-1: one row).
struct Tile {
  int64_t rows = 1, cols = 1;
  int row_dim = -1, col_dim = -1;
};

// A per-thread array whose elements share no cache line with other heap data. NOTE: the
// executor thread's and the pool workers' small scratch arrays come from one malloc arena and
// sat next to each other: every tile's offset/pointer updates then bounced cache lines between
// the cores (false sharing; ~15% of a fused GELU's time on 2 threads).
template <class T>
struct PaddedArray {
  static constexpr size_t kPad = 128 / sizeof(T);
  std::vector<T> v;
  T* get(size_t n) {
    if (v.size() < n + 2 * kPad) v.resize(n + 2 * kPad);
    return v.data() + kPad;
  }
};

struct Scratch {
  std::vector<char> mem;
  PaddedArray<void*> ptr;
  // NOTE: 128 bytes of slack on each side of the used range (see PaddedArray).
  char* aligned(size_t bytes) {
    if (mem.size() < bytes + 256) mem.assign(bytes + 256, 0);
    uintptr_t p = reinterpret_cast<uintptr_t>(mem.data()) + 64;
    return reinterpret_cast<char*>((p + 63) & ~uintptr_t{63});
  }
};

struct Runner {
  const Kernel& k;
  const Plan& plan;
  const Space& sp;
  int nred;
  char* slots_full;
  char* slots_red;
  char* acc;    // nred * kSlotBytes: mode B accumulators / reduced values
  char* lanes;  // nred * kLanes * 8
  void** ptr;   // per value: its chunk (a slot, input memory, or output memory)

  // max_tile: the most elements any tile of this call has (constants are filled that far).
  Runner(const Kernel& kk, const Plan& pl, const Space& s, Scratch& scratch, int64_t max_tile)
      : k(kk), plan(pl), sp(s), nred(static_cast<int>(pl.reductions.size())) {
    size_t bytes = (plan.full.nslots + plan.reduced.nslots + nred) * kSlotBytes + nred * kLanes * 8;
    char* m = scratch.aligned(bytes);
    slots_full = m;
    slots_red = slots_full + plan.full.nslots * kSlotBytes;
    acc = slots_red + plan.reduced.nslots * kSlotBytes;
    lanes = acc + nred * kSlotBytes;
    ptr = scratch.ptr.get(k.num_values());
    std::fill(ptr, ptr + k.num_values(), nullptr);
    for (ValueId v : plan.full.consts)
      fill_constant(k.node(v), slots_full + plan.full.slot[v] * kSlotBytes, max_tile);
    for (ValueId v : plan.reduced.consts)
      fill_constant(k.node(v), slots_red + plan.reduced.slot[v] * kSlotBytes, max_tile);
  }

  Kind red_kind(int r) const { return kind_of(k.node(plan.reductions[r]).dtype); }
  Op red_op(int r) const { return k.node(plan.reductions[r]).op; }
  char* acc_buf(int r) const { return acc + r * kSlotBytes; }
  char* lane_buf(int r) const { return lanes + r * kLanes * 8; }

  // Computes a program's values over tile t whose element (0,0) is at offsets off[o].
  // NOTE: values are never computed straight into output memory: measured 35% slower on a 4M
  // f32 GELU chain than computing into the L1 chunk and copying (the copy's rep movsb writes
  // whole lines; the op loop's stores stall on the output lines' read-for-ownership).
  void compute(const Program& p, char* slots, const Tile& t, const int64_t* off) {
    int64_t n = t.rows * t.cols;
    for (ValueId v : p.consts) ptr[v] = slots + p.slot[v] * kSlotBytes;
    for (ValueId v : p.red_inputs) {
      for (int r = 0; r < nred; ++r)
        if (plan.reductions[r] == v) ptr[v] = acc_buf(r);
    }
    for (ValueId v : p.loads) {
      int o = k.node(v).index;
      DType dt = sp.dtype[o];
      int64_t cs = sp.st(t.col_dim, o);
      int64_t rs = t.row_dim >= 0 ? sp.st(t.row_dim, o) : 0;
      const char* src = sp.base[o] + off[o] * sp.esize[o];
      bool direct = dt != DType::kBFloat16 && dt != DType::kFloat16 && dt != DType::kBool &&
                    cs == 1 && (t.rows == 1 || rs == t.cols);
      if (direct) {
        ptr[v] = const_cast<char*>(src);
        continue;
      }
      char* dst = slots + p.slot[v] * kSlotBytes;
      ptr[v] = dst;
      int64_t kb = kind_bytes(kind_of(dt));
      for (int64_t r = 0; r < t.rows; ++r)
        load_row(dt, src + r * rs * sp.esize[o], cs, dst + r * t.cols * kb, t.cols);
    }
    for (const Instr& in : p.instrs) {
      ptr[in.out] = slots + p.slot[in.out] * kSlotBytes;
      run_instr(in, ptr, n);
    }
  }

  // Stores a computed program's outputs over tile t. NOTE: after compute, so an output that
  // aliases an input (in-place) is written only once every value of the tile is computed.
  void store(const Program& p, const Tile& t, const int64_t* off) {
    for (auto& [o, v] : p.stores) {
      int op = sp.nin + o;
      DType dt = sp.dtype[op];
      int64_t cs = sp.st(t.col_dim, op);
      int64_t rs = t.row_dim >= 0 ? sp.st(t.row_dim, op) : 0;
      char* dst = sp.base[op] + off[op] * sp.esize[op];
      int64_t kb = kind_bytes(kind_of(dt));
      const char* src = static_cast<const char*>(ptr[v]);
      for (int64_t r = 0; r < t.rows; ++r)
        store_row(dt, src + r * t.cols * kb, dst + r * rs * sp.esize[op], cs, t.cols);
    }
  }

  void accumulate_all(const Tile& t, bool lanes_mode) {
    for (int r = 0; r < nred; ++r) {
      ValueId src = k.node(plan.reductions[r]).args[0];
      accumulate(red_kind(r), red_op(r), lanes_mode, lanes_mode ? lane_buf(r) : acc_buf(r),
                 ptr[src], t.rows * t.cols);
    }
  }

  void set_offsets(const DimList& dims, int64_t lin, const int64_t* base_off, int64_t* off) const {
    for (int o = 0; o < sp.nops; ++o) off[o] = base_off ? base_off[o] : 0;
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      int d = dims[i];
      int64_t idx = lin % sp.size[d];
      lin /= sp.size[d];
      for (int o = 0; o < sp.nops; ++o) off[o] += idx * sp.st(d, o);
    }
  }
};

thread_local Scratch t_scratch;
thread_local PaddedArray<int64_t> t_offsets;  // per-task operand offsets (4 sets)

int64_t product(const Space& sp, const DimList& dims) {
  int64_t p = 1;
  for (int d : dims) p *= sp.size[d];
  return p;
}

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pointwise kernels and reductions whose innermost dim is not reduced (mode B): a tile over
// non-reduced dims, iterated over every reduced index with elementwise accumulators.
void run_tiled(const Kernel& k, const Plan& plan, const Space& sp, int64_t r_total) {
  int nd = sp.nd;
  Tile t;
  t.col_dim = nd - 1;
  int64_t ncol = sp.size[t.col_dim];
  t.cols = std::min<int64_t>(ncol, kChunkElems);
  if (nd >= 2 && !sp.red[nd - 2] && ncol <= kChunkElems / 2) {
    t.row_dim = nd - 2;
    t.rows = std::min<int64_t>(sp.size[nd - 2], kChunkElems / ncol);
  }
  DimList outer, rdims;
  for (int d = 0; d < nd; ++d) {
    if (d == t.col_dim || d == t.row_dim) continue;
    (sp.red[d] ? rdims : outer).push_back(d);
  }
  int64_t ncoltiles = div_up(ncol, t.cols);
  int64_t nrowtiles = t.row_dim >= 0 ? div_up(sp.size[t.row_dim], t.rows) : 1;
  int64_t items = product(sp, outer) * nrowtiles * ncoltiles;
  int64_t tile_work = t.rows * t.cols * std::max<int64_t>(r_total, 1);
  int64_t grain = std::max<int64_t>(1, 32768 / tile_work);
  bool has_red = !plan.reductions.empty();
  // NOTE: blocks of `grain` tiles are claimed from a shared counter (dynamic scheduling): with a
  // static split a worker descheduled by other processes on a busy host held up the whole call
  // by its fixed share. Each tile is independent, so results do not depend on who ran it.
  int64_t nblocks = div_up(items, grain);
  std::atomic<int64_t> next_block{0};
  runtime::parallel_for(0, std::min<int64_t>(nblocks, 64), 1, [&](int64_t, int64_t) {
    Runner run(k, plan, sp, t_scratch, t.rows * t.cols);
    int64_t* off = t_offsets.get(4 * static_cast<size_t>(sp.nops));
    int64_t* roff = off + sp.nops;
    for (int64_t blk; (blk = next_block.fetch_add(1, std::memory_order_relaxed)) < nblocks;) {
      int64_t begin = blk * grain, end = std::min(items, begin + grain);
      for (int64_t it = begin; it < end; ++it) {
        int64_t ct = it % ncoltiles;
        int64_t rt = (it / ncoltiles) % nrowtiles;
        int64_t ol = it / ncoltiles / nrowtiles;
        run.set_offsets(outer, ol, nullptr, off);
        Tile tt = t;
        tt.cols = std::min(t.cols, ncol - ct * t.cols);
        for (int o = 0; o < sp.nops; ++o) off[o] += ct * t.cols * sp.st(t.col_dim, o);
        if (t.row_dim >= 0) {
          tt.rows = std::min(t.rows, sp.size[t.row_dim] - rt * t.rows);
          for (int o = 0; o < sp.nops; ++o) off[o] += rt * t.rows * sp.st(t.row_dim, o);
        }
        int64_t n = tt.rows * tt.cols;
        if (!has_red) {
          run.compute(plan.full, run.slots_full, tt, off);
          run.store(plan.full, tt, off);
          continue;
        }
        for (int r = 0; r < run.nred; ++r)
          fill_identity(run.red_kind(r), run.red_op(r), run.acc_buf(r), n);
        for (int64_t rl = 0; rl < r_total; ++rl) {
          run.set_offsets(rdims, rl, off, roff);
          run.compute(plan.full, run.slots_full, tt, roff);
          run.accumulate_all(tt, false);
          run.store(plan.full, tt, roff);
        }
        for (int r = 0; r < run.nred; ++r)
          round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), n);
        run.compute(plan.reduced, run.slots_red, tt, off);
        run.store(plan.reduced, tt, off);
      }
    }
  });
}

// Reductions whose innermost dim is reduced (mode A): batches of up to kChunkElems positions
// along the innermost non-reduced dim q; each position reduces into kLanes lanes (or, when the
// only reduced dim is short, a tile holds several positions, one row each).
// A reduction to a single position (e.g. a full sum) over many tiles: fixed blocks of
// kTilesPerBlock tiles reduce into their own lanes in parallel, then the blocks' lanes combine in
// block order. NOTE: the blocking depends only on the shape, so results do not depend on the
// thread count (or on whether a parallel backend is installed).
constexpr int64_t kTilesPerBlock = 32;

void run_split_reduction(const Kernel& k, const Plan& plan, const Space& sp, const DimList& router,
                         const Tile& rt, int rrow, int64_t nrowtiles, int64_t ncoltiles,
                         int64_t ntiles) {
  int nred = static_cast<int>(plan.reductions.size());
  int64_t nblocks = div_up(ntiles, kTilesPerBlock);
  const int64_t lane_bytes = kLanes * 8;
  std::vector<char> partials(static_cast<size_t>(nblocks * nred * lane_bytes));
  int cdim = sp.nd - 1;
  runtime::parallel_for(0, nblocks, 1, [&](int64_t begin, int64_t end) {
    Runner run(k, plan, sp, t_scratch, kChunkElems);
    int64_t* roff = t_offsets.get(4 * static_cast<size_t>(sp.nops));
    int64_t* toff = roff + sp.nops;
    for (int64_t blk = begin; blk < end; ++blk) {
      for (int r = 0; r < nred; ++r)
        fill_identity(run.red_kind(r), run.red_op(r), run.lane_buf(r), kLanes);
      int64_t t_end = std::min(ntiles, (blk + 1) * kTilesPerBlock);
      for (int64_t ti = blk * kTilesPerBlock; ti < t_end; ++ti) {
        int64_t ct = ti % ncoltiles;
        int64_t rtile = (ti / ncoltiles) % nrowtiles;
        int64_t rl = ti / ncoltiles / nrowtiles;
        run.set_offsets(router, rl, nullptr, roff);
        Tile t = rt;
        t.cols = std::min(rt.cols, sp.size[cdim] - ct * rt.cols);
        for (int o = 0; o < sp.nops; ++o) toff[o] = roff[o] + ct * rt.cols * sp.st(cdim, o);
        if (rrow >= 0) {
          t.rows = std::min(rt.rows, sp.size[rrow] - rtile * rt.rows);
          for (int o = 0; o < sp.nops; ++o) toff[o] += rtile * rt.rows * sp.st(rrow, o);
        }
        run.compute(plan.full, run.slots_full, t, toff);
        run.accumulate_all(t, true);
        run.store(plan.full, t, toff);
      }
      for (int r = 0; r < nred; ++r)
        std::memcpy(partials.data() + (blk * nred + r) * lane_bytes, run.lane_buf(r), lane_bytes);
    }
  });
  Runner run(k, plan, sp, t_scratch, 1);
  for (int r = 0; r < nred; ++r) {
    Kind kd = run.red_kind(r);
    fill_identity(kd, run.red_op(r), run.lane_buf(r), kLanes);
    for (int64_t blk = 0; blk < nblocks; ++blk)
      accumulate(kd, run.red_op(r), false, run.lane_buf(r),
                 partials.data() + (blk * nred + r) * lane_bytes, kLanes);
    finish_lanes(kd, run.red_op(r), run.lane_buf(r), run.acc_buf(r), 0);
    round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), 1);
  }
  Tile et;
  et.col_dim = 0;  // the (virtual or size-1) position dim
  et.cols = 1;
  std::vector<int64_t> zero(sp.nops, 0);
  run.compute(plan.reduced, run.slots_red, et, zero.data());
  run.store(plan.reduced, et, zero.data());
}

void run_inner_reduction(const Kernel& k, const Plan& plan, const Space& sp) {
  int nd = sp.nd;
  int cdim = nd - 1;
  int q = -1;
  for (int d = 0; d < nd; ++d)
    if (!sp.red[d]) q = d;
  DimList outer, router;
  for (int d = 0; d < nd; ++d) {
    if (d == q || d == cdim) continue;
    (sp.red[d] ? router : outer).push_back(d);
  }
  int64_t ncol = sp.size[cdim];
  bool rows_mode = router.empty() && q == nd - 2 && ncol <= kChunkElems / 2;
  int64_t nq = sp.size[q];
  int64_t batch = std::min<int64_t>(nq, kChunkElems);
  int64_t nbatches = div_up(nq, batch);
  int64_t items = product(sp, outer) * nbatches;
  int64_t r_total = product(sp, router) * ncol;
  int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, batch * r_total));
  // Tile over the reduced space of one position (not rows_mode).
  Tile rt;
  rt.col_dim = cdim;
  rt.cols = std::min<int64_t>(ncol, kChunkElems);
  int rrow = -1;
  if (!router.empty() && router.back() == nd - 2 && ncol <= kChunkElems / 2) {
    rrow = nd - 2;
    router.pop_back();
    rt.row_dim = rrow;
    rt.rows = std::min<int64_t>(sp.size[rrow], kChunkElems / ncol);
  }
  int64_t ncoltiles = div_up(ncol, rt.cols);
  int64_t nrowtiles = rrow >= 0 ? div_up(sp.size[rrow], rt.rows) : 1;
  int64_t nrouter = product(sp, router);
  int64_t ntiles = nrouter * nrowtiles * ncoltiles;
  if (items == 1 && nq == 1 && !rows_mode && ntiles > kTilesPerBlock) {
    run_split_reduction(k, plan, sp, router, rt, rrow, nrowtiles, ncoltiles, ntiles);
    return;
  }
  runtime::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    Runner run(k, plan, sp, t_scratch, kChunkElems);
    int64_t* off = t_offsets.get(4 * static_cast<size_t>(sp.nops));
    int64_t* poff = off + sp.nops;
    int64_t* roff = poff + sp.nops;
    int64_t* toff = roff + sp.nops;
    for (int64_t it = begin; it < end; ++it) {
      int64_t bt = it % nbatches;
      run.set_offsets(outer, it / nbatches, nullptr, off);
      int64_t p0 = bt * batch;
      int64_t np = std::min(batch, nq - p0);
      for (int o = 0; o < sp.nops; ++o) off[o] += p0 * sp.st(q, o);
      if (rows_mode) {
        Tile t;
        t.col_dim = cdim;
        t.cols = ncol;
        t.row_dim = q;
        int64_t per = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(ncol, 1));
        for (int64_t p = 0; p < np; p += per) {
          t.rows = std::min(per, np - p);
          for (int o = 0; o < sp.nops; ++o) poff[o] = off[o] + p * sp.st(q, o);
          run.compute(plan.full, run.slots_full, t, poff);
          for (int r = 0; r < run.nred; ++r) {
            Kind kd = run.red_kind(r);
            int64_t kb = kind_bytes(kd);
            ValueId src = k.node(plan.reductions[r]).args[0];
            for (int64_t row = 0; row < t.rows; ++row) {
              fill_identity(kd, run.red_op(r), run.lane_buf(r), kLanes);
              accumulate(kd, run.red_op(r), true, run.lane_buf(r),
                         static_cast<const char*>(run.ptr[src]) + row * ncol * kb, ncol);
              finish_lanes(kd, run.red_op(r), run.lane_buf(r), run.acc_buf(r), p + row);
            }
          }
          run.store(plan.full, t, poff);
        }
      } else {
        for (int64_t p = 0; p < np; ++p) {
          for (int o = 0; o < sp.nops; ++o) poff[o] = off[o] + p * sp.st(q, o);
          for (int r = 0; r < run.nred; ++r)
            fill_identity(run.red_kind(r), run.red_op(r), run.lane_buf(r), kLanes);
          for (int64_t rl = 0; rl < nrouter; ++rl) {
            run.set_offsets(router, rl, poff, roff);
            for (int64_t rtile = 0; rtile < nrowtiles; ++rtile) {
              for (int64_t ct = 0; ct < ncoltiles; ++ct) {
                Tile t = rt;
                t.cols = std::min(rt.cols, ncol - ct * rt.cols);
                for (int o = 0; o < sp.nops; ++o) toff[o] = roff[o] + ct * rt.cols * sp.st(cdim, o);
                if (rrow >= 0) {
                  t.rows = std::min(rt.rows, sp.size[rrow] - rtile * rt.rows);
                  for (int o = 0; o < sp.nops; ++o) toff[o] += rtile * rt.rows * sp.st(rrow, o);
                }
                run.compute(plan.full, run.slots_full, t, toff);
                run.accumulate_all(t, true);
                run.store(plan.full, t, toff);
              }
            }
          }
          for (int r = 0; r < run.nred; ++r)
            finish_lanes(run.red_kind(r), run.red_op(r), run.lane_buf(r), run.acc_buf(r), p);
        }
      }
      for (int r = 0; r < run.nred; ++r)
        round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), np);
      Tile et;
      et.col_dim = q;
      et.cols = np;
      run.compute(plan.reduced, run.slots_red, et, off);
      run.store(plan.reduced, et, off);
    }
  });
}

}  // namespace

struct KernelExecAccess {
  static const Plan& plan(const Kernel& k) {
    std::call_once(k.exec_once_, [&] { k.exec_plan_ = make_plan(k); });
    return *static_cast<const Plan*>(k.exec_plan_.get());
  }
};

void execute(const Kernel& k, const int64_t* sizes, int ndim, const Operand* inputs,
             const Operand* outputs) {
  if (ndim < 0 || ndim > 64) fail("ndim " + std::to_string(ndim) + " out of range [0, 64]");
  if (ndim > 0 && sizes == nullptr) fail("sizes is null");
  uint64_t mask = k.reduce_mask();
  if (ndim < 64 && (mask >> ndim) != 0)
    fail("kernel reduces axes beyond the iteration space's " + std::to_string(ndim) + " dims");
  const Plan& plan = KernelExecAccess::plan(k);
  // NOTE: per-call vectors are reused across calls on a thread (small kernels are dominated by
  // malloc otherwise); a nested call (a math hook that executes a kernel) gets fresh ones.
  thread_local Space t_space;
  thread_local bool t_space_busy = false;
  Space local_space;
  Space& sp = t_space_busy ? local_space : t_space;
  struct Release {
    bool* flag;
    ~Release() {
      if (flag) *flag = false;
    }
  } release{t_space_busy ? nullptr : &t_space_busy};
  t_space_busy = true;
  sp.base.clear();
  sp.dtype.clear();
  sp.esize.clear();
  sp.nin = k.num_inputs();
  sp.nops = k.num_inputs() + k.num_outputs();
  int64_t numel = 1, r_total = 1;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] < 0)
      fail("negative size " + std::to_string(sizes[d]) + " at dim " + std::to_string(d));
    numel *= sizes[d];
    if (mask >> d & 1) r_total *= sizes[d];
  }
  for (int o = 0; o < sp.nops; ++o) {
    const Operand& op = o < sp.nin ? inputs[o] : outputs[o - sp.nin];
    DType dt = o < sp.nin ? k.input_dtype(o) : k.output_dtype(o - sp.nin);
    if (ndim > 0 && op.strides == nullptr)
      fail(std::string(o < sp.nin ? "input " : "output ") +
           std::to_string(o < sp.nin ? o : o - sp.nin) + " has null strides");
    sp.base.push_back(static_cast<char*>(op.data));
    sp.dtype.push_back(dt);
    sp.esize.push_back(static_cast<int64_t>(dtype_size(dt)));
  }
  // Values after a reduction need broadcast inputs and keepdim outputs along reduced axes.
  for (int d = 0; d < ndim; ++d) {
    if (!(mask >> d & 1) || sizes[d] <= 1) continue;
    for (int i = 0; i < sp.nin; ++i)
      if (plan.input_in_reduced[i] && inputs[i].strides[d] != 0)
        fail("input " + std::to_string(i) +
             " is combined with a reduction's result, so it must "
             "be broadcast (stride 0) along reduced axis " +
             std::to_string(d) + ", got stride " + std::to_string(inputs[i].strides[d]) +
             "; split the kernel after the reduction");
    for (int o = 0; o < k.num_outputs(); ++o)
      if (plan.output_reduced[o] && outputs[o].strides[d] != 0)
        fail("output " + std::to_string(o) +
             " stores a reduced value, so it must have stride 0 "
             "along reduced axis " +
             std::to_string(d) + " (keepdim), got " + std::to_string(outputs[o].strides[d]));
  }
  bool has_red = !plan.reductions.empty();
  if (numel == 0 && !(has_red && r_total == 0)) return;  // empty: nothing to compute
  if (has_red && r_total == 0) {
    for (int d = 0; d < ndim; ++d)
      if (!(mask >> d & 1) && sizes[d] == 0) return;
  }
  // Simplify: drop size-1 dims (and every reduced dim of an empty reduction), order by stride
  // (outputs first, then inputs; stride-0 entries do not vote), merge contiguous neighbours.
  int dims_buf[64];
  int ndims = 0;
  for (int d = 0; d < ndim; ++d) {
    bool red = mask >> d & 1;
    if (sizes[d] == 1 || (red && r_total == 0)) continue;
    dims_buf[ndims++] = d;
  }
  int* dims = dims_buf;
  auto stride_of = [&](int d, int o) {
    return o < sp.nin ? inputs[o].strides[d] : outputs[o - sp.nin].strides[d];
  };
  // Insertion sort, outermost first: move d_inner inward while it has larger strides.
  auto outer_than = [&](int a, int b) {  // should a come before (outside) b?
    for (int i = 0; i < sp.nops; ++i) {
      int o = (i + sp.nin) % sp.nops;  // outputs first
      int64_t sa = std::abs(stride_of(a, o)), sb = std::abs(stride_of(b, o));
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa > sb;
    }
    return a < b;
  };
  for (int i = 1; i < ndims; ++i)
    for (int j = i; j > 0 && !outer_than(dims[j - 1], dims[j]); --j)
      std::swap(dims[j - 1], dims[j]);
  sp.size.clear();
  sp.red.clear();
  sp.stride.clear();
  for (int di = 0; di < ndims; ++di) {
    int d = dims[di];
    bool rd = mask >> d & 1;
    if (!sp.size.empty() && sp.red.back() == rd) {
      int64_t* prev = sp.stride.data() + sp.stride.size() - sp.nops;
      bool ok = true;
      for (int o = 0; o < sp.nops && ok; ++o) ok = prev[o] == stride_of(d, o) * sizes[d];
      if (ok) {
        sp.size.back() *= sizes[d];
        for (int o = 0; o < sp.nops; ++o) prev[o] = stride_of(d, o);
        continue;
      }
    }
    sp.size.push_back(sizes[d]);
    sp.red.push_back(rd);
    for (int o = 0; o < sp.nops; ++o) sp.stride.push_back(stride_of(d, o));
  }
  // Reductions with an inner reduced dim need a non-reduced dim for positions; every space
  // needs at least one dim.
  bool mode_a = has_red && !sp.size.empty() && sp.red.back();
  bool any_nr = std::find(sp.red.begin(), sp.red.end(), 0) != sp.red.end();
  if (sp.size.empty() || (mode_a && !any_nr)) {
    sp.size.insert(sp.size.begin(), 1);
    sp.red.insert(sp.red.begin(), 0);
    sp.stride.insert(sp.stride.begin(), sp.nops, 0);
  }
  sp.nd = static_cast<int>(sp.size.size());
  if (mode_a)
    run_inner_reduction(k, plan, sp);
  else
    run_tiled(k, plan, sp, r_total);
}

void set_float_math(Op op, VecMathFn fn, DType storage) {
  if (!hookable_unary(op))
    throw std::invalid_argument(std::string("ir::set_float_math: ") + op_name(op) +
                                " has no math hook");
  const int slot = storage == DType::kFloat32    ? 0
                   : storage == DType::kBFloat16 ? 1
                   : storage == DType::kFloat16  ? 2
                                                 : -1;
  if (slot < 0)
    throw std::invalid_argument(std::string("ir::set_float_math: storage dtype ") +
                                dtype_name(storage) + " is not float32, bfloat16 or float16");
  g_f32_unary[slot][static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_float_math2(Op op, VecMathFn2 fn) {
  if (op != Op::kPow)
    throw std::invalid_argument(std::string("ir::set_float_math2: ") + op_name(op) +
                                " has no math hook");
  g_f32_binary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_double_math(Op op, VecMathFnF64 fn) {
  if (!hookable_unary(op))
    throw std::invalid_argument(std::string("ir::set_double_math: ") + op_name(op) +
                                " has no math hook");
  g_f64_unary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}
void set_double_math2(Op op, VecMathFn2F64 fn) {
  if (op != Op::kPow)
    throw std::invalid_argument(std::string("ir::set_double_math2: ") + op_name(op) +
                                " has no math hook");
  g_f64_binary[static_cast<int>(op)].store(fn, std::memory_order_relaxed);
}

}  // namespace openneuron::ir
