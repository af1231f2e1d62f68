// Kernel IR construction: typing errors, hash-consing, canonical structure, text form and
// serialization. The interpreter is tested in test_ir_execute.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "ir/kernel.h"

namespace openneuron::ir {
namespace {

// y = x * 0.5 + b over f32.
std::shared_ptr<const Kernel> axpb(DType dt = DType::kFloat32, double c = 0.5) {
  KernelBuilder b;
  int x = b.add_input(dt);
  int bias = b.add_input(dt);
  int y = b.add_output(dt);
  ValueId v = b.binary(Op::kMul, b.load(x), b.constant(c, dt));
  b.store(y, b.binary(Op::kAdd, v, b.load(bias)));
  return b.build();
}

TEST(IrBuilder, DTypeBasics) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bf16");
  EXPECT_STREQ(op_name(Op::kAmin), "amin");
  EXPECT_STREQ(op_name(Op::kLogicalXor), "logical_xor");
  EXPECT_EQ(op_arity(Op::kWhere), 3);
  EXPECT_EQ(op_arity(Op::kGe), 2);
  EXPECT_EQ(op_arity(Op::kTanh), 1);
  EXPECT_EQ(op_arity(Op::kConstant), 0);
}

TEST(IrBuilder, TypingErrorsAreClear) {
  KernelBuilder b;
  int f = b.add_input(DType::kFloat32);
  int h = b.add_input(DType::kBFloat16);
  int i = b.add_input(DType::kInt32);
  int m = b.add_input(DType::kBool);
  b.add_output(DType::kFloat32);
  ValueId vf = b.load(f), vh = b.load(h), vi = b.load(i), vm = b.load(m);
  try {
    b.binary(Op::kAdd, vf, vh);
    FAIL() << "mixed dtypes accepted";
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  }
  EXPECT_THROW(b.unary(Op::kExp, vi), std::invalid_argument);  // transcendental on int
  EXPECT_THROW(b.unary(Op::kNeg, vm), std::invalid_argument);  // arithmetic on bool
  EXPECT_THROW(b.binary(Op::kAdd, vm, vm), std::invalid_argument);
  EXPECT_THROW(b.binary(Op::kBitAnd, vf, vf), std::invalid_argument);
  EXPECT_THROW(b.unary(Op::kAdd, vf), std::invalid_argument);  // wrong arity
  EXPECT_THROW(b.binary(Op::kExp, vf, vf), std::invalid_argument);
  EXPECT_THROW(b.unary(Op::kCast, vf), std::invalid_argument);
  EXPECT_THROW(b.where(vf, vf, vf), std::invalid_argument);  // cond not bool
  EXPECT_THROW(b.where(vm, vf, vi), std::invalid_argument);  // branches differ
  EXPECT_THROW(b.fma(vf, vf, vh), std::invalid_argument);
  EXPECT_THROW(b.load(7), std::invalid_argument);
  EXPECT_THROW(b.unary(Op::kExp, 1234), std::invalid_argument);    // no such value
  EXPECT_THROW(b.reduce(Op::kSum, vm, 1), std::invalid_argument);  // sum of bool
  EXPECT_THROW(b.reduce(Op::kExp, vf, 1), std::invalid_argument);
  EXPECT_THROW(b.reduce(Op::kSum, vf, 0), std::invalid_argument);  // no axes
  EXPECT_THROW(b.constant(2.5, DType::kInt32), std::invalid_argument);
  EXPECT_THROW(b.constant(int64_t{1} << 40, DType::kInt32), std::invalid_argument);
  ValueId s = b.reduce(Op::kSum, vf, 0b10);
  EXPECT_THROW(b.reduce(Op::kSum, s, 0b10), std::invalid_argument);    // reduce of a reduction
  EXPECT_THROW(b.reduce(Op::kAmax, vf, 0b01), std::invalid_argument);  // different axes
  EXPECT_THROW(b.store(0, vi), std::invalid_argument);                 // dtype mismatch
  EXPECT_THROW(b.store(3, vf), std::invalid_argument);                 // no such output
  b.store(0, s);
  EXPECT_THROW(b.store(0, s), std::invalid_argument);  // stored twice
  // Result dtypes.
  EXPECT_EQ(b.dtype(b.binary(Op::kLt, vf, vf)), DType::kBool);
  EXPECT_EQ(b.dtype(b.binary(Op::kLogicalAnd, vi, vi)), DType::kBool);
  EXPECT_EQ(b.dtype(b.unary(Op::kIsNan, vh)), DType::kBool);
  EXPECT_EQ(b.dtype(b.cast(vi, DType::kFloat16)), DType::kFloat16);
  EXPECT_EQ(b.dtype(b.binary(Op::kMax, vm, vm)), DType::kBool);
  EXPECT_EQ(b.cast(vf, DType::kFloat32), vf);                          // no-op cast
  EXPECT_EQ(b.unary(Op::kFloor, vi), vi);                              // floor of an int is itself
  EXPECT_EQ(b.dtype(b.reduce(Op::kMax, vh, 0b10)), DType::kBFloat16);  // kMax alias of amax
}

TEST(IrBuilder, UnstoredOutputFailsBuild) {
  KernelBuilder b;
  b.add_input(DType::kFloat32);
  b.add_output(DType::kFloat32);
  b.add_output(DType::kFloat32);
  b.store(0, b.load(0));
  EXPECT_THROW(b.build(), std::invalid_argument);
  KernelBuilder none;
  EXPECT_THROW(none.build(), std::invalid_argument);
}

TEST(IrBuilder, HashConsingDedupsNodes) {
  KernelBuilder b;
  int x = b.add_input(DType::kFloat32);
  EXPECT_EQ(b.load(x), b.load(x));
  EXPECT_EQ(b.constant(1.0, DType::kFloat32), b.constant(1.0, DType::kFloat32));
  EXPECT_EQ(b.constant(1, DType::kFloat32), b.constant(1.0, DType::kFloat32));
  EXPECT_NE(b.constant(1.0, DType::kFloat32), b.constant(1.0, DType::kFloat64));
  EXPECT_NE(b.constant(0.0, DType::kFloat32), b.constant(-0.0, DType::kFloat32));
  ValueId e1 = b.unary(Op::kExp, b.load(x));
  ValueId e2 = b.unary(Op::kExp, b.load(x));
  EXPECT_EQ(e1, e2);
  int before = b.num_values();
  b.binary(Op::kAdd, e1, e2);
  b.binary(Op::kAdd, e1, e2);
  EXPECT_EQ(b.num_values(), before + 1);
  // bf16 constants are rounded before interning: 1 + 2^-10 rounds to 1 in bf16.
  EXPECT_EQ(b.constant(1.0 + 1.0 / 1024, DType::kBFloat16), b.constant(1.0, DType::kBFloat16));
}

TEST(IrBuilder, StructuralEqualityAndHash) {
  auto a = axpb(), b = axpb();
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->hash(), b->hash());
  auto c = axpb(DType::kFloat32, 0.25);  // different constant
  auto d = axpb(DType::kBFloat16);       // different dtype
  EXPECT_NE(*a, *c);
  EXPECT_NE(a->hash(), c->hash());
  EXPECT_NE(*a, *d);
  EXPECT_NE(a->hash(), d->hash());
  // Same structure built in another order, with a dead node: equal after canonicalization.
  KernelBuilder e;
  int x = e.add_input(DType::kFloat32);
  int bias = e.add_input(DType::kFloat32);
  int y = e.add_output(DType::kFloat32);
  ValueId lb = e.load(bias);
  e.unary(Op::kExp, lb);  // dead
  ValueId cst = e.constant(0.5, DType::kFloat32);
  ValueId v = e.binary(Op::kMul, e.load(x), cst);
  e.store(y, e.binary(Op::kAdd, v, lb));
  auto ek = e.build();
  EXPECT_EQ(*a, *ek);
  EXPECT_EQ(a->hash(), ek->hash());
  EXPECT_EQ(a->to_text(), ek->to_text());
  // Operand order matters (no commutative canonicalization).
  KernelBuilder f;
  x = f.add_input(DType::kFloat32);
  bias = f.add_input(DType::kFloat32);
  y = f.add_output(DType::kFloat32);
  v = f.binary(Op::kMul, f.load(x), f.constant(0.5, DType::kFloat32));
  f.store(y, f.binary(Op::kAdd, f.load(bias), v));
  EXPECT_NE(*a, *f.build());
  std::unordered_map<std::shared_ptr<const Kernel>, int, KernelHash, KernelEqual> cache;
  cache[a] = 1;
  EXPECT_EQ(cache.count(b), 1u);
  EXPECT_EQ(cache.count(c), 0u);
}

TEST(IrBuilder, TextFormGolden) {
  KernelBuilder b;
  int x = b.add_input(DType::kBFloat16);
  int m = b.add_input(DType::kBool);
  int y = b.add_output(DType::kFloat32);
  int s = b.add_output(DType::kFloat32);
  ValueId xf = b.cast(b.load(x), DType::kFloat32);
  ValueId t = b.unary(Op::kTanh, b.binary(Op::kMul, xf, b.constant(0.5, DType::kFloat32)));
  ValueId w = b.where(b.load(m), t, b.constant(0, DType::kFloat32));
  b.store(y, w);
  b.store(s, b.reduce(Op::kSum, w, 0b101));
  auto k = b.build();
  const char* golden =
      "kernel(in0: bf16, in1: bool) -> (out0: f32, out1: f32)\n"
      "  %0 = load in1 : bool\n"
      "  %1 = load in0 : bf16\n"
      "  %2 = cast %1 : f32\n"
      "  %3 = const 0.5 : f32\n"
      "  %4 = mul %2, %3 : f32\n"
      "  %5 = tanh %4 : f32\n"
      "  %6 = const 0.0 : f32\n"
      "  %7 = where %0, %5, %6 : f32\n"
      "  %8 = sum %7 axes={0,2} : f32\n"
      "  out0 = %7\n"
      "  out1 = %8\n";
  EXPECT_EQ(k->to_text(), golden);
  EXPECT_EQ(k->reduce_mask(), 0b101u);
  EXPECT_TRUE(k->is_reduced(8));
  EXPECT_FALSE(k->is_reduced(7));
  EXPECT_EQ(k->num_inputs(), 2);
  EXPECT_EQ(k->num_outputs(), 2);
  EXPECT_EQ(k->input_dtype(0), DType::kBFloat16);
  EXPECT_EQ(k->output_dtype(1), DType::kFloat32);
}

TEST(IrBuilder, SerializeRoundTrips) {
  KernelBuilder b;
  int x = b.add_input(DType::kFloat16);
  int i = b.add_input(DType::kInt64);
  int y = b.add_output(DType::kFloat16);
  int z = b.add_output(DType::kInt64);
  int w = b.add_output(DType::kBool);
  ValueId vx = b.load(x);
  ValueId c1 = b.constant(std::nan(""), DType::kFloat16);
  ValueId c2 = b.constant(-0.0, DType::kFloat16);
  ValueId c3 = b.constant(1e-7, DType::kFloat16);  // a subnormal half
  ValueId s = b.fma(vx, c3, b.binary(Op::kMax, c1, c2));
  b.store(y, b.unary(Op::kErf, s));
  ValueId vi = b.load(i);
  b.store(z,
          b.reduce(Op::kProd, b.binary(Op::kPow, vi, b.constant(int64_t{-3}, DType::kInt64)), 0b1));
  b.store(w, b.binary(Op::kLogicalOr, b.unary(Op::kIsNan, vx), b.constant(1, DType::kBool)));
  auto k = b.build();
  std::string data = k->serialize();
  auto back = Kernel::deserialize(data);
  EXPECT_EQ(*back, *k);
  EXPECT_EQ(back->hash(), k->hash());
  EXPECT_EQ(back->to_text(), k->to_text());
  EXPECT_EQ(back->serialize(), data);
  // Every kernel in this file round-trips.
  for (auto& kk : {axpb(), axpb(DType::kBFloat16, 3.0)})
    EXPECT_EQ(*Kernel::deserialize(kk->serialize()), *kk);
}

TEST(IrBuilder, DeserializeRejectsCorruptInput) {
  std::string data = axpb()->serialize();
  EXPECT_THROW(Kernel::deserialize(""), std::invalid_argument);
  EXPECT_THROW(Kernel::deserialize("garbage"), std::invalid_argument);
  EXPECT_THROW(Kernel::deserialize(data.substr(0, data.size() / 2)), std::invalid_argument);
  for (size_t pos = 0; pos + 1 < data.size(); pos += 7) {
    std::string bad = data;
    bad[pos] = bad[pos] == '1' ? '2' : '1';
    EXPECT_THROW(Kernel::deserialize(bad), std::invalid_argument) << "flip at " << pos;
  }
  // A checksum-valid but ill-typed body is rejected by the builder's checks.
  std::string body =
      "onir 1\nin 0 4\nout 0\nnodes 3\n0 0 -1 -1 -1 0 0\n0 4 -1 -1 -1 1 0\n31 0 0 1 -1 -1 0\nst "
      "2\n";
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : body) {
    h ^= ch;
    h *= 0x100000001B3ull;
  }
  char sum[64];
  std::snprintf(sum, sizeof(sum), "sum %016llx\n", static_cast<unsigned long long>(h));
  EXPECT_THROW(Kernel::deserialize(body + sum), std::invalid_argument);
}

// ops.def is the one list of ops: its rows give unique names, arities the builder enforces, and
// flags only where they mean something (hooks on floating transcendentals and pow).
TEST(IrOps, TableIsConsistent) {
  std::set<std::string> names;
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const OpTraits& t = op_traits(op);
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    EXPECT_STREQ(op_name(op), t.name);
    EXPECT_GE(t.arity, 0);
    EXPECT_LE(t.arity, 3);
    if (op_is_reduction(op)) {
      EXPECT_EQ(t.arity, 1) << t.name;
    }
    if (t.has(kMathHook)) {
      EXPECT_TRUE(t.operands == OpOperands::kFloating || op == Op::kPow) << t.name;
    }
    if (t.has(kIntIdentity)) {
      EXPECT_TRUE(t.has(kExactOnValues)) << t.name;
    }
  }
  EXPECT_STREQ(op_name(static_cast<Op>(kNumOps)), "?");
  EXPECT_EQ(std::string(op_name(Op::kAmin)), "amin");  // the last row
  // The builder enforces the operands column.
  KernelBuilder b;
  const ValueId i = b.load(b.add_input(DType::kInt32));
  EXPECT_THROW(b.unary(Op::kExp, i), std::invalid_argument);
  EXPECT_EQ(b.unary(Op::kFloor, i), i);  // kIntIdentity
}

}  // namespace
}  // namespace openneuron::ir
