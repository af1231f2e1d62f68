// The kernel IR interpreter against the scalar reference in ir_reference.h. Covers all dtypes,
// broadcasting, arbitrary/negative strides, reductions, odd/empty/0-d sizes, per-intermediate
// bf16/fp16 rounding, the parallel backend and math hooks. Throughput is measured in
// benchmarks/ir_interpreter.cpp, not here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"
#include "ir_reference.h"
#include "runtime/parallel.h"

namespace openneuron::ir {
namespace {

// --- tests ----------------------------------------------------------------------------------

TEST(IrExecute, UnaryOpsAllFloatDTypes) {
  const Op ops[] = {
      Op::kNeg,   Op::kAbs,  Op::kSign,  Op::kReciprocal, Op::kExp,     Op::kExp2,      Op::kExpm1,
      Op::kLog,   Op::kLog2, Op::kLog10, Op::kLog1p,      Op::kSqrt,    Op::kRsqrt,     Op::kSin,
      Op::kCos,   Op::kTan,  Op::kAtan,  Op::kTanh,       Op::kSigmoid, Op::kErf,       Op::kErfc,
      Op::kFloor, Op::kCeil, Op::kTrunc, Op::kRound,      Op::kIsNan,   Op::kLogicalNot};
  for (DType dt : kFloatDTypes)
    for (Op op : ops) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*unary_kernel(op, dt), {1031});
    }
}

TEST(IrExecute, BinaryOpsAllDTypes) {
  const Op float_ops[] = {Op::kAdd,        Op::kSub,       Op::kMul,       Op::kDiv,      Op::kMax,
                          Op::kMin,        Op::kPow,       Op::kRemainder, Op::kFloorDiv, Op::kEq,
                          Op::kNe,         Op::kLt,        Op::kLe,        Op::kGt,       Op::kGe,
                          Op::kLogicalAnd, Op::kLogicalOr, Op::kLogicalXor};
  const Op int_ops[] = {
      Op::kAdd,        Op::kSub,       Op::kMul,       Op::kDiv,    Op::kMax,   Op::kMin,
      Op::kPow,        Op::kRemainder, Op::kFloorDiv,  Op::kBitAnd, Op::kBitOr, Op::kBitXor,
      Op::kEq,         Op::kNe,        Op::kLt,        Op::kLe,     Op::kGt,    Op::kGe,
      Op::kLogicalAnd, Op::kLogicalOr, Op::kLogicalXor};
  const Op bool_ops[] = {Op::kMax, Op::kMin, Op::kBitAnd, Op::kBitOr,      Op::kBitXor,    Op::kEq,
                         Op::kNe,  Op::kLt,  Op::kGe,     Op::kLogicalAnd, Op::kLogicalXor};
  for (DType dt : kAllDTypes) {
    std::vector<Op> ops;
    if (is_float(dt))
      ops.assign(std::begin(float_ops), std::end(float_ops));
    else if (dt == DType::kBool)
      ops.assign(std::begin(bool_ops), std::end(bool_ops));
    else
      ops.assign(std::begin(int_ops), std::end(int_ops));
    for (Op op : ops) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*binary_kernel(op, dt), {3, 347}, {}, {}, Fill::kSpecial, 3);
      if (!is_float(dt) && dt != DType::kBool && op != Op::kPow)
        check(*binary_kernel(op, dt), {1000}, {}, {}, Fill::kWideInt, 4);
    }
  }
}

TEST(IrExecute, IntUnaryAndTernary) {
  for (DType dt : {DType::kInt32, DType::kInt64}) {
    for (Op op : {Op::kNeg, Op::kAbs, Op::kSign, Op::kBitNot, Op::kLogicalNot}) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + dtype_name(dt));
      check(*unary_kernel(op, dt), {777}, {}, {}, Fill::kWideInt);
    }
  }
  check(*unary_kernel(Op::kBitNot, DType::kBool), {77});
  check(*unary_kernel(Op::kLogicalNot, DType::kBool), {77});
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    KernelBuilder b;
    int c = b.add_input(DType::kBool), x = b.add_input(dt), y = b.add_input(dt);
    b.store(b.add_output(dt), b.where(b.load(c), b.load(x), b.load(y)));
    check(*b.build(), {5, 201});
    if (dt == DType::kBool) continue;
    KernelBuilder f;
    x = f.add_input(dt);
    y = f.add_input(dt);
    int z = f.add_input(dt);
    f.store(f.add_output(dt), f.fma(f.load(x), f.load(y), f.load(z)));
    check(*f.build(), {1100});
  }
}

TEST(IrExecute, CastsBetweenAllDTypes) {
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      if (from == to) continue;
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      KernelBuilder b;
      int x = b.add_input(from);
      ValueId v = b.load(x);
      if (is_float(from)) v = b.binary(Op::kMul, v, b.constant(1000.5, from));  // wide range
      b.store(b.add_output(to), b.cast(v, to));
      check(*b.build(), {1029}, {}, {}, is_float(from) ? Fill::kSpecial : Fill::kWideInt);
    }
}

// A chain of ops in each dtype: the typical fused elementwise kernel.
std::shared_ptr<const Kernel> chain_kernel(DType dt) {
  KernelBuilder b;
  int x = b.add_input(dt), y = b.add_input(dt);
  int o = b.add_output(dt), m = b.add_output(DType::kBool);
  ValueId vx = b.load(x), vy = b.load(y);
  ValueId r;
  if (dt == DType::kBool) {
    r = b.binary(Op::kBitXor, b.binary(Op::kMax, vx, vy), b.unary(Op::kBitNot, vy));
  } else {
    ValueId two = b.constant(2, dt);
    ValueId t = b.binary(Op::kAdd, b.binary(Op::kMul, vx, two), vy);
    t = b.binary(Op::kSub, b.binary(Op::kMax, t, vx), b.unary(Op::kAbs, vy));
    if (is_float(dt)) t = b.binary(Op::kMul, b.unary(Op::kTanh, t), b.unary(Op::kExp, vy));
    r = b.where(b.binary(Op::kGt, vx, vy), t, b.unary(Op::kNeg, vx));
  }
  b.store(o, r);
  b.store(m, b.binary(Op::kNe, r, vx));
  return b.build();
}

TEST(IrExecute, ChainsAllDTypesOddSizes) {
  for (DType dt : kAllDTypes)
    for (int64_t n : {1, 7, 1023, 1024, 1025, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      check(*chain_kernel(dt), {n});
    }
}

TEST(IrExecute, BroadcastingStrideZero) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    auto k = chain_kernel(dt);
    std::vector<int64_t> s = {37, 53};
    check(*k, s, {{{0, 1}}, {{1, 0}}});  // row vector, column vector
    check(*k, s, {{{0, 0}}, {}});        // scalar broadcast
    check(*k, {3, 5, 700}, {{{0, 700, 1}}, {{1, 0, 0}}});
    check(*k, {600, 3}, {{{0, 1}}, {}});  // short inner dim with broadcast
  }
}

TEST(IrExecute, ArbitraryAndNegativeStrides) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32}) {
    auto k = chain_kernel(dt);
    std::vector<int64_t> s = {41, 67};
    check(*k, s, {{{1, 41}}, {{-67, -1}}});                   // transposed, reversed
    check(*k, s, {{{134, 2}}, {{-1, 41}}}, {{{1, 41}}, {}});  // gaps, transposed output
    check(*k, s, {{{67, -1}}, {}}, {{{-67, 1}}, {{-1, -41}}});
    check(*k, {5, 4, 3, 2}, {{{1, 5, 20, 60}}, {{-24, 6, -2, 1}}});
  }
}

TEST(IrExecute, EmptyAndZeroDim) {
  auto k = chain_kernel(DType::kFloat32);
  check(*k, {});  // 0-d: one element
  check(*k, {0});
  check(*k, {5, 0, 3});
  // Nothing is written for an empty space.
  float out = 7.f;
  uint8_t m = 9;
  float in = 1.f;
  int64_t sz = 0, st = 1;
  Operand ins[2] = {{&in, &st}, {&in, &st}};
  Operand outs[2] = {{&out, &st}, {&m, &st}};
  execute(*k, &sz, 1, ins, outs);
  EXPECT_EQ(out, 7.f);
  EXPECT_EQ(m, 9);
}

std::shared_ptr<const Kernel> reduce_kernel(Op rop, DType dt, uint64_t mask, bool epilogue) {
  KernelBuilder b;
  int x = b.add_input(dt);
  ValueId v = b.load(x);
  if (dt != DType::kBool) v = b.binary(Op::kMul, v, v);
  if (is_float(dt)) v = b.binary(Op::kSub, v, b.constant(1.5, dt));
  ValueId r = b.reduce(rop, v, mask);
  int o = b.add_output(dt);
  if (epilogue && dt != DType::kBool) {
    int bias = b.add_input(dt);
    r = b.binary(Op::kAdd, b.binary(Op::kMul, r, b.constant(3, dt)), b.load(bias));
  }
  b.store(o, r);
  return b.build();
}

TEST(IrExecute, ReductionsOverAxes) {
  std::vector<int64_t> s = {5, 7, 9};
  for (DType dt : kAllDTypes)
    for (Op rop : {Op::kSum, Op::kProd, Op::kAmax, Op::kAmin}) {
      if (dt == DType::kBool && (rop == Op::kSum || rop == Op::kProd)) continue;
      for (uint64_t mask = 1; mask < 8; ++mask) {
        SCOPED_TRACE(std::string(op_name(rop)) + " " + dtype_name(dt) + " mask " +
                     std::to_string(mask));
        // Sums of dyadic values are exact in any order; products are not (relative tolerance:
        // the accumulation order differs from the reference's).
        Fill fill = Fill::kDyadic;
        double rtol = rop != Op::kProd || !is_float(dt) ? 0
                      : dt == DType::kFloat32           ? 1e-5
                      : dt == DType::kFloat64           ? 1e-13
                                                        : 1e-2;
        check(*reduce_kernel(rop, dt, mask, false), s, {}, {}, fill, 5, rtol);
        // Transposed input: the reduced dims move inside/outside.
        check(*reduce_kernel(rop, dt, mask, false), s, {{{1, 5, 35}}}, {}, fill, 6, rtol);
        // Epilogue with an input broadcast along the reduced axes.
        if (dt != DType::kBool)
          check(*reduce_kernel(rop, dt, mask, true), s, {{}, {contiguous(s, mask)}}, {}, fill, 7,
                rtol);
      }
    }
}

TEST(IrExecute, ReductionsLongAndOddExtents) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    for (int64_t n : {1, 7, 1023, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      check(*reduce_kernel(Op::kSum, dt, 1, false), {n}, {}, {}, Fill::kDyadic);
      check(*reduce_kernel(Op::kAmax, dt, 2, false), {3, n}, {}, {}, Fill::kSpecial);
      check(*reduce_kernel(Op::kSum, dt, 1, false), {n, 5}, {}, {}, Fill::kDyadic);
      check(*reduce_kernel(Op::kAmin, dt, 2, false), {n, 3}, {}, {}, Fill::kSpecial);
      check(*reduce_kernel(Op::kSum, dt, 0b101, true), {n, 3, 2},
            {{}, {contiguous({n, 3, 2}, 0b101)}}, {}, Fill::kDyadic);
    }
  }
  // Many short rows (a tile holds several rows) and a column reduction of a narrow matrix.
  check(*reduce_kernel(Op::kSum, DType::kFloat32, 2, false), {3000, 5}, {}, {}, Fill::kDyadic);
  check(*reduce_kernel(Op::kAmax, DType::kFloat16, 1, false), {3000, 3}, {}, {}, Fill::kSpecial);
  // Reduced + full-domain outputs together, several reductions sharing axes.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId v = b.binary(Op::kMul, b.load(x), b.constant(2.0, DType::kFloat32));
  b.store(b.add_output(DType::kFloat32), v);
  ValueId s = b.reduce(Op::kSum, v, 0b10);
  ValueId mx = b.reduce(Op::kAmax, v, 0b10);
  b.store(b.add_output(DType::kFloat32), b.binary(Op::kSub, mx, s));
  b.store(b.add_output(DType::kBool), b.binary(Op::kGt, mx, b.constant(1.0, DType::kFloat32)));
  auto k = b.build();
  check(*k, {33, 2050}, {}, {}, Fill::kDyadic);
  check(*k, {2050, 33}, {{{1, 2050}}}, {}, Fill::kDyadic);
}

TEST(IrExecute, ReductionOverEmptyAxesStoresIdentity) {
  for (Op rop : {Op::kSum, Op::kProd, Op::kAmax, Op::kAmin}) {
    KernelBuilder b;
    int x = b.add_input(DType::kFloat32);
    b.store(b.add_output(DType::kFloat32), b.reduce(rop, b.load(x), 0b10));
    auto k = b.build();
    std::vector<float> out(4, 42.f);
    float in = 0;
    int64_t sizes[2] = {4, 0};
    int64_t ist[2] = {0, 1}, ost[2] = {1, 0};
    Operand ins[1] = {{&in, ist}};
    Operand outs[1] = {{out.data(), ost}};
    execute(*k, sizes, 2, ins, outs);
    float want = rop == Op::kSum    ? 0.f
                 : rop == Op::kProd ? 1.f
                 : rop == Op::kAmax ? -INFINITY
                                    : INFINITY;
    for (float o : out) EXPECT_EQ(o, want) << op_name(rop);
  }
}

TEST(IrExecute, HalfPrecisionRoundsEveryIntermediate) {
  // (x + 1) - x with x = 2^p (p = significand bits): x + 1 is a tie that rounds to x, so the
  // stepwise result is 0; rounding only at the end would give 1.
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    KernelBuilder b;
    int x = b.add_input(dt);
    ValueId vx = b.load(x);
    ValueId t = b.binary(Op::kAdd, vx, b.constant(1.0, dt));
    b.store(b.add_output(dt), b.binary(Op::kSub, t, vx));
    auto k = b.build();
    double big = dt == DType::kBFloat16 ? 256 : 2048;
    Buf in = make_buf(dt, {1}, {1});
    Buf out = make_buf(dt, {1}, {1});
    write_elem(in, 0, V{big, 0});
    int64_t sz = 1;
    Operand ins[1] = {{in.data(), in.strides.data()}};
    Operand outs[1] = {{out.data(), out.strides.data()}};
    execute(*k, &sz, 1, ins, outs);
    double once = ref_round(dt, (big + 1) - big);
    double stepwise = ref_round(dt, ref_round(dt, big + 1) - big);
    EXPECT_EQ(once, 1.0);
    EXPECT_EQ(stepwise, 0.0);
    EXPECT_EQ(read_elem(out, 0).f, stepwise) << dtype_name(dt);
    check(*k, {4099}, {}, {}, Fill::kSpecial);
  }
  // bf16 sum accumulates in float and rounds once at the end.
  KernelBuilder b;
  int x = b.add_input(DType::kBFloat16);
  b.store(b.add_output(DType::kBFloat16), b.reduce(Op::kSum, b.load(x), 1));
  auto k = b.build();
  std::vector<uint16_t> ones(300, 0x3F80);  // 1.0
  uint16_t out = 0;
  int64_t sz = 300, st = 1, ost = 0;
  Operand ins[1] = {{ones.data(), &st}};
  Operand outs[1] = {{&out, &ost}};
  execute(*k, &sz, 1, ins, outs);
  EXPECT_EQ(out, 0x4396);  // 300 exactly (bf16 sums would stall at 256)
}

TEST(IrExecute, ParallelBackendMatchesSerial) {
  runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body, void* ctx) {
        int64_t mid = begin + std::max(grain, (end - begin) / 2);
        if (mid >= end) {
          body(ctx, begin, end);
          return;
        }
        std::thread t([&] { body(ctx, begin, mid); });
        body(ctx, mid, end);
        t.join();
      });
  check(*chain_kernel(DType::kBFloat16), {300, 1000});
  check(*chain_kernel(DType::kFloat32), {200001});
  check(*reduce_kernel(Op::kSum, DType::kFloat32, 2, true), {500, 301},
        {{}, {contiguous({500, 301}, 2)}}, {}, Fill::kDyadic);
  check(*reduce_kernel(Op::kAmax, DType::kFloat32, 1, false), {301, 500}, {}, {}, Fill::kSpecial);
  runtime::set_parallel_backend(nullptr);
}

TEST(IrExecute, FullReductionsSplitIntoBlocksDeterministically) {
  // Reductions to one element over more than 32 tiles run as fixed blocks (in parallel when a
  // backend is set); the result must not depend on the backend.
  auto two_threads = [](int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                        void* ctx) {
    int64_t mid = begin + std::max(grain, (end - begin) / 2);
    if (mid >= end) {
      body(ctx, begin, end);
      return;
    }
    std::thread t([&] { body(ctx, begin, mid); });
    body(ctx, mid, end);
    t.join();
  };
  struct Case {
    std::vector<int64_t> sizes;
    uint64_t mask;
    Op op;
    DType dt;
    Fill fill;
  };
  const Case cases[] = {{{40000}, 1, Op::kSum, DType::kFloat32, Fill::kDyadic},
                        {{300, 301}, 3, Op::kSum, DType::kBFloat16, Fill::kDyadic},
                        {{70, 3, 1100}, 7, Op::kAmax, DType::kFloat16, Fill::kSpecial},
                        {{50001}, 1, Op::kSum, DType::kInt64, Fill::kWideInt}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)) + " " + dtype_name(c.dt));
    auto k = reduce_kernel(c.op, c.dt, c.mask, false);
    runtime::set_parallel_backend(nullptr);
    std::vector<Buf> serial = check(*k, c.sizes, {}, {}, c.fill, 11);
    runtime::set_parallel_backend(two_threads);
    std::vector<Buf> parallel = check(*k, c.sizes, {}, {}, c.fill, 11);
    runtime::set_parallel_backend(nullptr);
    EXPECT_EQ(serial[0].mem, parallel[0].mem);
  }
  // A float sum with rounding (not dyadic): serial and parallel still agree bit for bit.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  b.store(b.add_output(DType::kFloat32), b.reduce(Op::kSum, b.unary(Op::kSin, b.load(x)), 1));
  auto k = b.build();
  std::vector<float> in(100003);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.001f * static_cast<float>(i);
  float out1 = 0, out2 = 0;
  int64_t n = static_cast<int64_t>(in.size()), st = 1, ost = 0;
  Operand ins[1] = {{in.data(), &st}};
  Operand o1[1] = {{&out1, &ost}};
  Operand o2[1] = {{&out2, &ost}};
  execute(*k, &n, 1, ins, o1);
  runtime::set_parallel_backend(two_threads);
  execute(*k, &n, 1, ins, o2);
  runtime::set_parallel_backend(nullptr);
  EXPECT_EQ(std::memcmp(&out1, &out2, 4), 0) << out1 << " vs " << out2;
  double ref = 0;
  for (float v : in) ref += std::sin(v);
  EXPECT_NEAR(out1, ref, 1e-3 * std::fabs(ref) + 1e-2);
}

TEST(IrExecute, ConcurrentCallsShareOneKernel) {
  // The plan is built once (first call races with the others); per-thread scratch is separate.
  auto k = chain_kernel(DType::kFloat16);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<uint16_t> x(2000 + t), y(2000 + t), out(2000 + t);
        std::vector<uint8_t> m(2000 + t);
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = static_cast<uint16_t>(0x3C00 + (i % 50));  // 1.0 .. 1.05
          y[i] = static_cast<uint16_t>(0x3C00 + (i % 7));
        }
        int64_t n = static_cast<int64_t>(x.size()), st = 1;
        Operand ins[2] = {{x.data(), &st}, {y.data(), &st}};
        Operand outs[2] = {{out.data(), &st}, {m.data(), &st}};
        execute(*k, &n, 1, ins, outs);
        for (size_t i = 0; i < x.size(); ++i)
          if (m[i] != (out[i] != x[i])) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

std::atomic<int64_t> g_hook_calls{0};
std::atomic<int64_t> g_hook_max_n{0};
void fake_tanh(const float* x, float* y, int64_t n) {
  g_hook_calls++;
  int64_t m = g_hook_max_n.load();
  while (n > m && !g_hook_max_n.compare_exchange_weak(m, n)) {
  }
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + 0.25f;
}

TEST(IrExecute, MathHooksGetWholeChunks) {
  set_float_math(Op::kTanh, fake_tanh);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    g_hook_calls = 0;
    g_hook_max_n = 0;
    auto k = unary_kernel(Op::kTanh, dt);
    std::vector<float> x(5000, 1.0f), y(5000);
    std::vector<uint16_t> xb(5000, 0x3F80), yb(5000);
    int64_t sz = 5000, st = 1;
    Operand ins[1] = {{dt == DType::kFloat32 ? static_cast<void*>(x.data()) : xb.data(), &st}};
    Operand outs[1] = {{dt == DType::kFloat32 ? static_cast<void*>(y.data()) : yb.data(), &st}};
    execute(*k, &sz, 1, ins, outs);
    EXPECT_EQ(g_hook_calls.load(), (5000 + kChunkElems - 1) / kChunkElems);
    EXPECT_EQ(g_hook_max_n.load(), kChunkElems);
    if (dt == DType::kFloat32)
      EXPECT_EQ(y[4999], 1.25f);
    else
      EXPECT_EQ(yb[4999], 0x3FA0);  // 1.25 in bf16
  }
  set_float_math(Op::kTanh, nullptr);
  EXPECT_THROW(set_float_math(Op::kAdd, fake_tanh), std::invalid_argument);
  check(*unary_kernel(Op::kTanh, DType::kFloat32), {100});  // default restored
}

TEST(IrExecute, BadArgumentsThrow) {
  auto k = reduce_kernel(Op::kSum, DType::kFloat32, 0b10, true);
  std::vector<float> x(12), bias(12), out(12);
  int64_t sizes[2] = {3, 4};
  int64_t cst[2] = {4, 1}, bst[2] = {1, 0};
  Operand ins[2] = {{x.data(), cst}, {bias.data(), bst}};
  Operand good_out[1] = {{out.data(), bst}};
  Operand bad_out[1] = {{out.data(), cst}};  // reduced value, stride 1 along reduced axis
  EXPECT_NO_THROW(execute(*k, sizes, 2, ins, good_out));
  EXPECT_THROW(execute(*k, sizes, 2, ins, bad_out), std::invalid_argument);
  Operand bad_in[2] = {{x.data(), cst}, {bias.data(), cst}};  // epilogue input not broadcast
  try {
    execute(*k, sizes, 2, bad_in, good_out);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("input 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(execute(*k, sizes, 1, ins, good_out), std::invalid_argument);  // axis 1 >= ndim
  EXPECT_THROW(execute(*k, sizes, 65, ins, good_out), std::invalid_argument);
  int64_t neg[2] = {3, -1};
  EXPECT_THROW(execute(*k, neg, 2, ins, good_out), std::invalid_argument);
}

TEST(IrExecute, InPlaceExactAliasing) {
  // y = x * 2 + 1 written over x itself, as an in-place op does.
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId v = b.binary(Op::kMul, b.load(x), b.constant(2.0, DType::kFloat32));
  b.store(b.add_output(DType::kFloat32), b.binary(Op::kAdd, v, b.constant(1.0, DType::kFloat32)));
  auto k = b.build();
  std::vector<float> data(3001);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  int64_t sz = 3001, st = 1;
  Operand io[1] = {{data.data(), &st}};
  execute(*k, &sz, 1, io, io);
  for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], 2.f * i + 1) << i;
}

TEST(IrExecute, ValueStoredToSeveralOutputsAndReusedAfterStore) {
  // v = x * 2 stored to out0 and out1, w = v + x (uses v after its store) to out2, tanh(w) (a
  // hooked op) to out3; contiguous, gapped (out1), row-tiled (300 x 7) and in-place (out0 over
  // x) layouts.
  set_float_math(Op::kTanh, &fake_tanh);
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  ValueId lx = b.load(x);
  ValueId v = b.binary(Op::kMul, lx, b.constant(2.0, DType::kFloat32));
  ValueId w = b.binary(Op::kAdd, v, lx);
  b.store(b.add_output(DType::kFloat32), v);
  b.store(b.add_output(DType::kFloat32), v);
  b.store(b.add_output(DType::kFloat32), w);
  b.store(b.add_output(DType::kFloat32), b.unary(Op::kTanh, w));
  auto k = b.build();
  for (std::vector<int64_t> sizes :
       {std::vector<int64_t>{3001}, std::vector<int64_t>{300, 7}, std::vector<int64_t>{5, 2049}}) {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    std::vector<int64_t> st(sizes.size()), gap(sizes.size());
    int64_t a = 1;
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      st[d] = a;
      gap[d] = 2 * a;
      a *= sizes[d];
    }
    for (bool in_place : {false, true}) {
      std::vector<float> xs(n), o0(n), o1(2 * n), o2(n), o3(n);
      for (int64_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 97) * 0.25f - 7.f;
      std::vector<float> x0 = xs;
      Operand in[1] = {{xs.data(), st.data()}};
      Operand out[4] = {{in_place ? xs.data() : o0.data(), st.data()},
                        {o1.data(), gap.data()},
                        {o2.data(), st.data()},
                        {o3.data(), st.data()}};
      execute(*k, sizes.data(), static_cast<int>(sizes.size()), in, out);
      const std::vector<float>& r0 = in_place ? xs : o0;
      for (int64_t i = 0; i < n; ++i) {
        float ev = x0[i] * 2.f, ew = ev + x0[i];
        ASSERT_EQ(r0[i], ev) << i;
        ASSERT_EQ(o1[2 * i], ev) << i;
        ASSERT_EQ(o2[i], ew) << i;
        float et;
        fake_tanh(&ew, &et, 1);
        ASSERT_EQ(o3[i], et) << i;
      }
    }
  }
  set_float_math(Op::kTanh, nullptr);
}

// Random kernels over random shapes and layouts (permuted, broadcast, reversed, gapped).
std::vector<int64_t> random_strides(const std::vector<int64_t>& sizes, std::mt19937& rng,
                                    bool allow_broadcast) {
  int nd = static_cast<int>(sizes.size());
  std::vector<int> perm(nd);
  for (int d = 0; d < nd; ++d) perm[d] = d;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> st(nd);
  int64_t s = 1 + (rng() % 3 == 0 ? 1 : 0);  // sometimes a gap between elements
  for (int i = nd - 1; i >= 0; --i) {
    int d = perm[i];
    bool bcast = allow_broadcast && rng() % 5 == 0;
    st[d] = bcast ? 0 : (rng() % 5 == 0 ? -s : s);
    if (!bcast) s *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

TEST(IrExecute, FuzzRandomKernelsAndLayouts) {
  std::mt19937 rng(20261202);
  const DType dts[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                       DType::kFloat64, DType::kInt32,    DType::kInt64};
  for (int iter = 0; iter < 300; ++iter) {
    DType dt = dts[rng() % 6];
    bool fl = is_float(dt);
    int nd = static_cast<int>(rng() % 5);
    std::vector<int64_t> sizes(nd);
    for (auto& x : sizes)
      x = rng() % 8 == 0 ? 1 + rng() % 300 : rng() % 12 == 0 ? 0 : 1 + rng() % 9;
    KernelBuilder b;
    std::vector<ValueId> pool;
    int nin = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < nin; ++i) pool.push_back(b.load(b.add_input(dt)));
    auto any = [&] { return pool[rng() % pool.size()]; };
    int nops = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < nops; ++i) {
      ValueId v;
      switch (rng() % 7) {
        case 0:
          v = b.unary(Op::kNeg, any());
          break;
        case 1:
          v = b.unary(Op::kAbs, any());
          break;
        case 2:
          v = b.binary(Op::kAdd, any(), any());
          break;
        case 3:
          v = b.binary(rng() % 2 ? Op::kMax : Op::kMin, any(), any());
          break;
        case 4:
          v = b.where(b.binary(Op::kLt, any(), any()), any(), any());
          break;
        case 5:
          v = b.binary(Op::kMul, any(), b.constant(fl && rng() % 2 ? 0.5 : -2.0, dt));
          break;
        default:
          v = fl ? b.unary(Op::kTanh, any()) : b.binary(Op::kSub, any(), any());
      }
      pool.push_back(v);
    }
    ValueId last = pool.back();
    bool full_out = true;
    uint64_t mask = 0;
    if (nd > 0 && rng() % 2) {
      mask = 1 + rng() % ((uint64_t{1} << nd) - 1);
      // Float sums depend on order: reduce floats with amax/amin only.
      Op rop = fl ? (rng() % 2 ? Op::kAmax : Op::kAmin)
                  : (rng() % 3 == 0 ? Op::kSum
                     : rng() % 2    ? Op::kAmax
                                    : Op::kAmin);
      ValueId r = b.reduce(rop, last, mask);
      if (rng() % 2) r = b.binary(Op::kAdd, r, b.constant(1, dt));
      b.store(b.add_output(dt), r);
      full_out = rng() % 2;
    }
    if (full_out) b.store(b.add_output(dt), pool[nin + rng() % nops]);
    auto k = b.build();
    std::vector<Layout> in_l(k->num_inputs()), out_l(k->num_outputs());
    for (auto& l : in_l) l.strides = random_strides(sizes, rng, true);
    for (int o = 0; o < k->num_outputs(); ++o) {
      if (k->is_reduced(k->output_value(o))) continue;  // keepdim contiguous
      out_l[o].strides = random_strides(sizes, rng, false);
    }
    std::string shape;
    for (int64_t x : sizes) shape += std::to_string(x) + " ";
    SCOPED_TRACE("iter " + std::to_string(iter) + " sizes [" + shape + "] mask " +
                 std::to_string(mask));
    check(*k, sizes, in_l, out_l, Fill::kSpecial, iter);
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace openneuron::ir
