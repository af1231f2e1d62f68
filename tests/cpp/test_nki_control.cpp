// The NKI executor's run-time loops (program.h kBranch, control.cpp): a counted loop over a
// trip count read from an input, the same run instruction by instruction (aliasing arguments),
// the parse-time rules and the guard against a loop that never ends; and the integer scalar
// instruction (kScalar) their bounds and offsets come from.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nki/program.h"
#include "nki_encoder.h"

namespace openneuron::nki {
namespace {

using nki_test::Encoder;

constexpr int kAdd = static_cast<int>(Op::k_add);
constexpr int kF = 4;
// slots: x [F], out [F], n (one int32), arena: counter (int32 at 0), stop (1), i (2)
constexpr int kArena = 3;

void copy_to_register(Encoder& e, int reg, int slot, int64_t offset, DType dt) {
  e.header(0, {1});
  e.operand(0, kArena, reg, {0}, 0, DType::k_int32);
  e.w.push_back(1);
  if (slot < 0)
    e.operand(1, 0, 0, {0}, static_cast<double>(offset));  // a constant
  else
    e.operand(0, slot, offset, {0}, 0, dt);
  e.w.insert(e.w.end(), {0, 0});
}

void branch(Encoder& e, int cond, std::vector<int> regs, int dst, int64_t target, int64_t step) {
  e.header(8, {1}, 0, kAdd, false, 0);
  if (dst >= 0)
    e.operand(0, kArena, dst, {0}, 0, DType::k_int32);
  else
    e.operand(1, 0, 0, {0});
  e.w.push_back(static_cast<int64_t>(regs.size()));
  for (int r : regs) e.operand(0, kArena, r, {0}, 0, DType::k_int32);
  e.w.insert(e.w.end(), {0, 0, cond, target, step});
}

// for i in dynamic_range(0, n, step): out += x; the head exits to target_after
Encoder counted_loop(int64_t step, int64_t target_after) {
  Encoder e({kF * 4, kF * 4, 4, 64});
  e.w.push_back(1);  // one instance
  e.w.push_back(5);
  copy_to_register(e, 0, -1, 0, DType::k_int32);     // 0: counter = 0
  copy_to_register(e, 1, 2, 0, DType::k_int32);      // 1: stop = n
  branch(e, kBrExitGe, {0, 1}, 2, target_after, 0);  // 2: head
  e.header(0, {kF});                                 // 3: out = out + x
  e.operand(0, 1, 0, {1});
  e.w.push_back(2);
  e.operand(0, 1, 0, {1});
  e.operand(0, 0, 0, {1});
  e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
  branch(e, kBrStep, {}, 0, 2, step);  // 4: counter += step, back to the head
  return e;
}

TEST(NkiControl, CountedLoopRunsItsBodyTheTripCountReadWhenItRuns) {
  auto p = counted_loop(1, 5).parse({"kernel.py:7"});
  for (int32_t n : {0, 1, 3, -2}) {
    std::vector<float> x = {1, 2, 3, 4}, out(kF, 0.0f);
    void* slots[] = {x.data(), out.data(), &n, nullptr};
    program_run(*p, slots);
    const float k = static_cast<float>(n > 0 ? n : 0);
    EXPECT_EQ(out, std::vector<float>({k, 2 * k, 3 * k, 4 * k})) << n;
  }
  auto two = counted_loop(2, 5).parse({"kernel.py:7"});  // i = 0, 2, 4 < 5
  int32_t n = 5;
  std::vector<float> x = {1, 2, 3, 4}, out(kF, 0.0f);
  void* slots[] = {x.data(), out.data(), &n, nullptr};
  program_run(*two, slots);
  EXPECT_EQ(out, std::vector<float>({3, 6, 9, 12}));
}

TEST(NkiControl, AliasingArgumentsRunTheLoopInstructionByInstruction) {
  auto p = counted_loop(1, 5).parse({"kernel.py:7"});
  int32_t n = 3;
  std::vector<float> buf = {1, 2, 3, 4};  // out = out + out, three times
  void* slots[] = {buf.data(), buf.data(), &n, nullptr};
  program_run(*p, slots);
  EXPECT_EQ(buf, std::vector<float>({8, 16, 24, 32}));
}

TEST(NkiControl, MalformedBranchesFailToParse) {
  auto error = [](Encoder e) {
    try {
      e.parse({"kernel.py:7"});
    } catch (const std::invalid_argument& ex) {
      return std::string(ex.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(counted_loop(1, 6)).find("kernel.py:7: in kernel 'test': branch target 6 past"),
            std::string::npos);
  EXPECT_NE(error(counted_loop(0, 5)).find("malformed branch"), std::string::npos);
}

// Two instances, each: for _ in range(n[g]): core_barrier; out[g] += x. The barriers the
// instances reach are matched as they run: the same counts meet, different ones are an error
// (the hardware would hang).
TEST(NkiControl, LoopsAroundSyncPointsMeetAsTheyRun) {
  Encoder e({kF * 4, 2 * kF * 4, 8, 64});
  e.w.push_back(2);
  for (int g = 0; g < 2; ++g) {
    e.w.push_back(6);
    copy_to_register(e, 0, -1, 0, DType::k_int32);  // 0: counter = 0
    copy_to_register(e, 1, 2, g, DType::k_int32);   // 1: stop = n[g]
    branch(e, kBrExitGe, {0, 1}, 2, 6, 0);          // 2: head
    e.header(7, {1, 1}, 0, kAdd, false, 0);         // 3: core barrier
    e.operand(0, 1, 0, {0, 0});
    e.w.insert(e.w.end(), {0, 0, 0, -1, -1});
    e.header(0, {kF});  // 4: out[g] += x
    e.operand(0, 1, g * kF, {1});
    e.w.push_back(2);
    e.operand(0, 1, g * kF, {1});
    e.operand(0, 0, 0, {1});
    e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
    branch(e, kBrStep, {}, 0, 2, 1);  // 5: back to the head
  }
  auto p = e.parse({"kernel.py:7"});
  std::vector<float> x = {1, 2, 3, 4};
  for (bool same : {true, false}) {
    std::vector<float> out(2 * kF, 0.0f);
    int32_t n[2] = {3, same ? 3 : 2};
    void* slots[] = {x.data(), out.data(), n, nullptr};
    if (same) {
      program_run(*p, slots);
      EXPECT_EQ(out, std::vector<float>({3, 6, 9, 12, 3, 6, 9, 12}));
      continue;
    }
    try {
      program_run(*p, slots);
      FAIL() << "no error";
    } catch (const std::runtime_error& ex) {
      EXPECT_NE(std::string(ex.what()).find("kernel.py:7: in kernel 'test': instance 0 reaches a "
                                            "core barrier that instance 1 never reaches"),
                std::string::npos)
          << ex.what();
    }
  }
}

TEST(NkiControl, ALoopThatNeverEndsStopsWithAnErrorNamingItsLine) {
  Encoder e({kF * 4, kF * 4, 4, 64});
  e.w.insert(e.w.end(), {1, 3});
  copy_to_register(e, 0, -1, 1, DType::k_int32);  // cond = 1, never changed
  branch(e, kBrExitZero, {0}, 2, 3, 0);           // while cond != 0
  branch(e, kBrAlways, {}, -1, 1, 0);
  auto p = e.parse({"kernel.py:7"});
  std::vector<float> x(kF), out(kF);
  int32_t n = 0;
  void* slots[] = {x.data(), out.data(), &n, nullptr};
  try {
    program_run(*p, slots);
    FAIL() << "no error";
  } catch (const std::runtime_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("kernel.py:7: in kernel 'test': a run-time loop has "
                                          "gone round 16777216 times"),
              std::string::npos)
        << ex.what();
  }
}

// out[k] = op_k(n, c_k) by the integer scalar instruction (n an int32 input, c_k a constant).
std::vector<int32_t> scalar_ops(int32_t n, const std::vector<std::pair<Op, int64_t>>& ops) {
  const int64_t k = static_cast<int64_t>(ops.size());
  Encoder e({kF * 4, k * 4, 4, 64});
  e.w.insert(e.w.end(), {1, k});
  for (int64_t i = 0; i < k; ++i) {
    e.header(9, {1}, 0, kAdd, false, 0);
    e.operand(0, 1, i, {0}, 0, DType::k_int32);
    e.w.push_back(2);
    e.operand(0, 2, 0, {0}, 0, DType::k_int32);
    e.operand(1, 0, 0, {0});
    e.w.insert(e.w.end(), {0, 0, static_cast<int64_t>(ops[static_cast<size_t>(i)].first), 0,
                           ops[static_cast<size_t>(i)].second});
  }
  auto p = e.parse({"kernel.py:9"});
  std::vector<float> x(kF);
  std::vector<int32_t> out(static_cast<size_t>(k), -1);
  void* slots[] = {x.data(), out.data(), &n, nullptr};
  program_run(*p, slots);
  return out;
}

TEST(NkiControl, IntegerScalarsWrapTruncateAndCompareExactly) {
  const std::vector<std::pair<Op, int64_t>> ops = {
      {Op::k_multiply, 100000}, {Op::k_divide, 4},  {Op::k_mod, 4},          {Op::k_add, 1},
      {Op::k_subtract, 3},      {Op::k_less, 0},    {Op::k_maximum, 7},      {Op::k_copy, 0},
      {Op::k_neg, 0},           {Op::k_equal, -17}, {Op::k_greater_equal, 5}};
  EXPECT_EQ(scalar_ops(100000, ops), std::vector<int32_t>({1410065408, 25000, 0, 100001, 99997, 0,
                                                           100000, 100000, -100000, 0, 1}));
  EXPECT_EQ(scalar_ops(-17, ops),
            std::vector<int32_t>({-1700000, -4, -1, -16, -20, 1, 7, -17, 17, 1, 0}));
  EXPECT_EQ(scalar_ops(INT32_MAX, {{Op::k_add, 1}}), std::vector<int32_t>({INT32_MIN}));
  try {
    scalar_ops(5, {{Op::k_divide, 0}});
    FAIL() << "no error";
  } catch (const std::runtime_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("kernel.py:9: in kernel 'test': integer scalar division "
                                          "by zero (5 / 0)"),
              std::string::npos)
        << ex.what();
  }
}

}  // namespace
}  // namespace openneuron::nki
