// SIMD variant selection (runtime/isa.h): parsing and errors of OPENNEURON_ISA, switching the
// active variant, and every variant this CPU supports giving the same bits for a native kernel
// and an IR kernel (the whole suite also runs once per variant: `make test-cpp`).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"
#include "kernels/layer_norm.h"
#include "runtime/errors.h"
#include "runtime/isa.h"

namespace openneuron::runtime {
namespace {

TEST(Isa, ParsesNamesAndRejectsWhatTheCpuLacks) {
  EXPECT_EQ(parse_isa("baseline"), Isa::kBaseline);
  EXPECT_EQ(parse_isa(" Baseline "), Isa::kBaseline);
  EXPECT_EQ(parse_isa("auto"), host_isa());
  EXPECT_EQ(parse_isa("default"), host_isa());
  try {
    parse_isa("avx1024");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("OPENNEURON_ISA=\"avx1024\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("baseline"), std::string::npos) << e.what();
  }
  for (Isa i : {Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(i) <= static_cast<int>(host_isa())) {
      EXPECT_EQ(parse_isa(isa_name(i)), i);
    } else {
      EXPECT_THROW(parse_isa(isa_name(i)), ConfigError);
      EXPECT_THROW(set_isa(i), ConfigError);
    }
  }
  EXPECT_EQ(host_isas().front(), Isa::kBaseline);
  EXPECT_EQ(host_isas().back(), host_isa());
}

std::vector<float> run_layer_norm(Isa variant) {
  const Isa before = isa();
  set_isa(variant);
  EXPECT_EQ(isa(), variant);
  const int64_t rows = 37, n = 301;
  std::mt19937 g(5);
  std::normal_distribution<float> d;
  std::vector<float> x(rows * n), w(n), b(n), y(rows * n), mean(rows), rstd(rows);
  for (auto& v : x) v = d(g);
  for (auto& v : w) v = d(g);
  for (auto& v : b) v = d(g);
  kernels::layer_norm_forward({}, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(),
                              rows, n, 1e-5f);
  std::vector<float> dx(rows * n), dw(n), db(n);
  kernels::layer_norm_backward({}, x.data(), x.data(), mean.data(), rstd.data(), w.data(),
                               dx.data(), dw.data(), db.data(), rows, n);
  y.insert(y.end(), dx.begin(), dx.end());
  y.insert(y.end(), dw.begin(), dw.end());
  set_isa(before);
  return y;
}

std::vector<float> run_ir(Isa variant) {
  const Isa before = isa();
  set_isa(variant);
  ir::KernelBuilder kb;
  const int ia = kb.add_input(ir::DType::kFloat32), ic = kb.add_input(ir::DType::kBFloat16);
  const ir::ValueId t = kb.binary(ir::Op::kMul, kb.unary(ir::Op::kAbs, kb.load(ia)),
                                  kb.cast(kb.load(ic), ir::DType::kFloat32));
  kb.store(kb.add_output(ir::DType::kFloat32),
           kb.reduce(ir::Op::kSum, kb.unary(ir::Op::kSqrt, kb.unary(ir::Op::kAbs, t)), 2));
  const std::shared_ptr<const ir::Kernel> k = kb.build();
  const int64_t sizes[2] = {13, 2051};
  std::mt19937 g(9);
  std::normal_distribution<float> d;
  std::vector<float> xa(13 * 2051);
  std::vector<uint16_t> xc(13 * 2051);
  for (auto& v : xa) v = d(g);
  for (auto& v : xc) {
    float f = d(g);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  std::vector<float> out(13);
  const int64_t sa[2] = {2051, 1}, so[2] = {1, 0};
  const ir::Operand ins[2] = {{xa.data(), sa}, {xc.data(), sa}};
  const ir::Operand outs[1] = {{out.data(), so}};
  ir::execute(*k, sizes, 2, ins, outs);
  set_isa(before);
  return out;
}

TEST(Isa, EveryVariantGivesTheSameBits) {
  const std::vector<float> ln = run_layer_norm(Isa::kBaseline);
  const std::vector<float> irr = run_ir(Isa::kBaseline);
  for (Isa i : host_isas()) {
    SCOPED_TRACE(isa_name(i));
    EXPECT_EQ(std::memcmp(run_layer_norm(i).data(), ln.data(), ln.size() * 4), 0);
    EXPECT_EQ(std::memcmp(run_ir(i).data(), irr.data(), irr.size() * 4), 0);
  }
}

}  // namespace
}  // namespace openneuron::runtime
