// The NKI executor's storage dtypes and its two instructions whose lanes depend on data
// (csrc/nki/gather_scan.cpp) on hand-encoded programs: conversions to and from uint16 / int16 /
// uint32 / float8 (saturation, rounding, NaN and infinity as torch converts tensors), the scan
// along the free axis (reversed operands, a masked row, a narrow destination's carry), the gather
// by run-time indices, the copy at a run-time offset (tensor_copy_dynamic_src / _dst), the DMA's
// indirect copy (HBM rows gathered / scattered by a tile of row indices), and the parser's and
// executor's refusals (a scan with foreign registers, a gather index tile past its slot, a
// dynamic or indirect copy whose far end leaves its slot, an index or offset past the tensor as
// an error naming the line), and random numbers from the run's seed or the kernel's own key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "nki/convert.h"
#include "nki/program.h"
#include "nki_encoder.h"

namespace openneuron::nki {
namespace {

using nki_test::Encoder;

constexpr int kAdd = static_cast<int>(Op::k_add);
constexpr int kSub = static_cast<int>(Op::k_subtract);
constexpr int kMul = static_cast<int>(Op::k_multiply);

// in (n float32) -> out (n of dtype dt) -> back (n float32), one program of two copies.
std::vector<float> round_trip(DType dt, const std::vector<float>& in, std::vector<uint8_t>* raw) {
  const int64_t n = static_cast<int64_t>(in.size());
  const int64_t size = static_cast<int64_t>(dtype_size(dt));
  Encoder e({n * 4, n * size, n * 4, 64});
  e.w.insert(e.w.end(), {1, 2});
  e.header(0, {1, n});
  e.operand(0, 1, 0, {0, 1}, 0, dt);
  e.w.push_back(1);
  e.operand(0, 0, 0, {0, 1});
  e.w.insert(e.w.end(), {0, 0});
  e.header(0, {1, n});
  e.operand(0, 2, 0, {0, 1});
  e.w.push_back(1);
  e.operand(0, 1, 0, {0, 1}, 0, dt);
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  raw->assign(static_cast<size_t>(n * size), 0);
  std::vector<float> src = in, back(in.size(), -1.0f);
  void* slots[] = {src.data(), raw->data(), back.data(), nullptr};
  program_run(*p, slots);
  return back;
}

TEST(NkiIsa, IntegerDtypesSaturateAndTruncate) {
  std::vector<uint8_t> raw;
  const std::vector<float> in = {-5.0f, 3.7f, 70000.0f, NAN, 65535.0f, -3.7f};
  EXPECT_EQ(round_trip(DType::k_uint16, in, &raw), (std::vector<float>{0, 3, 65535, 0, 65535, 0}));
  EXPECT_EQ(round_trip(DType::k_int16, in, &raw), (std::vector<float>{-5, 3, 32767, 0, 32767, -3}));
  const std::vector<float> big = {-1.0f, 4.0e9f, 5.0e9f, 16777216.0f, 4294967040.0f};
  EXPECT_EQ(round_trip(DType::k_uint32, big, &raw),
            (std::vector<float>{0, 4.0e9f, 4294967296.0f, 16777216.0f, 4294967040.0f}));
  uint32_t word[5];
  std::memcpy(word, raw.data(), sizeof word);
  EXPECT_EQ(word[1], 4000000000u);
  EXPECT_EQ(word[2], UINT32_MAX);  // past the range: the maximum, not the largest float below
  EXPECT_EQ(word[4], 4294967040u);
  EXPECT_EQ(round_trip(DType::k_int32, {3.0e9f, -3.0e9f, 2147483520.0f}, &raw),
            (std::vector<float>{2147483648.0f, -2147483648.0f, 2147483520.0f}));
  int32_t words[3];
  std::memcpy(words, raw.data(), sizeof words);
  EXPECT_EQ(words[0], INT32_MAX);
  EXPECT_EQ(words[1], INT32_MIN);
}

TEST(NkiIsa, Float8RoundsToNearestEvenWithTorchsOverflowRules) {
  std::vector<uint8_t> raw;
  // e4m3fn: 1, the largest finite, a tie that rounds down to it, past it and infinity (both
  // saturate: no infinity), NaN, the smallest subnormal, half of it (a tie to zero), -1e6.
  const std::vector<float> in = {1.0f, 448.0f,       464.0f,        470.0f, INFINITY,
                                 NAN,  0.001953125f, 0.0009765625f, -1e6f};
  std::vector<float> back = round_trip(DType::k_float8_e4m3, in, &raw);
  EXPECT_EQ(raw[0], 0x38);
  EXPECT_EQ(raw[1], 0x7E);
  EXPECT_EQ(back[2], 448.0f);
  EXPECT_EQ(back[3], 448.0f);
  EXPECT_EQ(back[4], 448.0f);
  EXPECT_EQ(raw[5], 0x7F);
  EXPECT_EQ(raw[6], 0x01);
  EXPECT_EQ(back[7], 0.0f);
  EXPECT_EQ(raw[8], 0xFE);
  // e5m2: the largest finite, infinity from 65536 on, NaN, a subnormal (2^-16), rounding.
  const std::vector<float> in2 = {57344.0f, 65536.0f, NAN, 1.52587890625e-05f, 1.1f, -3.0f};
  back = round_trip(DType::k_float8_e5m2, in2, &raw);
  EXPECT_EQ(raw[0], 0x7B);
  EXPECT_EQ(raw[1], 0x7C);
  EXPECT_TRUE(std::isinf(back[1]));
  EXPECT_TRUE(std::isnan(back[2]));
  EXPECT_EQ(raw[3], 0x01);
  EXPECT_EQ(back[4], 1.0f);
  EXPECT_EQ(back[5], -3.0f);
  // Every byte decodes to a value that encodes back to the same byte (NaNs aside).
  for (int b = 0; b < 256; ++b) {
    const auto u = static_cast<uint8_t>(b);
    const float x = f32_from_fp8_e4m3(u), y = f32_from_fp8_e5m2(u);
    if (!std::isnan(x)) {
      EXPECT_EQ(fp8_e4m3_from_f32(x), u) << b;
    }
    if (!std::isnan(y)) {
      EXPECT_EQ(fp8_e5m2_from_f32(y), u) << b;
    }
  }
}

// A scan over [P, F] float32 rows of slots 0 (data0) and 1 (data1), initial from slot 2 ([P]),
// into slot 3 of dtype dst_dt; op0 = (reverse0 ? carry op0 data0 : data0 op0 carry).
std::unique_ptr<Program> scan_program(int64_t P, int64_t F, int op0, bool reverse0, int op1,
                                      DType dst_dt, std::vector<std::vector<int64_t>> preds) {
  Encoder e({P * F * 4, P * F * 4, P * 4, P * F * 4, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(2, {P, F});
  e.operand(0, 3, 0, {F, 1}, 0, dst_dt);
  e.w.push_back(3);
  e.operand(0, 0, 0, {F, 1});
  e.operand(0, 1, 0, {F, 1});
  e.operand(0, 2, 0, {1, 0});
  e.w.push_back(2);
  if (reverse0)
    e.w.insert(e.w.end(), {op0, 2, 0, 0});
  else
    e.w.insert(e.w.end(), {op0, 0, 2, 0});
  e.w.insert(e.w.end(), {op1, 3, 1, 0});
  e.w.push_back(static_cast<int64_t>(preds.size()));
  for (auto& pr : preds) e.w.insert(e.w.end(), pr.begin(), pr.end());
  return e.parse();
}

// Shifts take their count modulo 32 (no shift past the width: UB in C++); right shifts keep a
// negative value's sign, as numpy's on int32.
TEST(NkiIsa, BitwiseShiftsAndInvertOnInt32Lanes) {
  EXPECT_EQ(bits_op(Op::k_left_shift, 3.0f, 4.0f), 48.0f);
  EXPECT_EQ(bits_op(Op::k_left_shift, 1.0f, 33.0f), 2.0f);
  EXPECT_EQ(bits_op(Op::k_left_shift, -3.0f, 2.0f), -12.0f);
  EXPECT_EQ(bits_op(Op::k_right_shift, -7.0f, 1.0f), -4.0f);
  EXPECT_EQ(bits_op(Op::k_right_shift, -1.0f, 31.0f), -1.0f);
  EXPECT_EQ(bits_op(Op::k_right_shift, 1024.0f, 3.0f), 128.0f);
  EXPECT_EQ(bits_op(Op::k_invert, 5.0f, 0.0f), -6.0f);
  EXPECT_EQ(bits_op(Op::k_invert, -1.0f, 0.0f), 0.0f);
  EXPECT_EQ(bits_op(Op::k_bitwise_xor, 6.0f, 3.0f), 5.0f);
}

TEST(NkiIsa, ScanAlongTheFreeAxis) {
  const int64_t P = 3, F = 6;
  std::vector<float> a(P * F), b(P * F), init = {0.5f, -1.0f, 2.0f}, out(P * F, -7.0f);
  for (int i = 0; i < P * F; ++i) a[i] = 0.25f * static_cast<float>(i % 5) + 0.5f;
  for (int i = 0; i < P * F; ++i) b[i] = static_cast<float>(i % 3) - 1.0f;
  void* slots[] = {a.data(), b.data(), init.data(), out.data(), nullptr};
  // out = a * carry + b, every lane.
  program_run(*scan_program(P, F, kMul, false, kAdd, DType::k_float32, {}), slots);
  for (int p = 0; p < P; ++p) {
    float c = init[p];
    for (int f = 0; f < F; ++f) {
      c = a[p * F + f] * c + b[p * F + f];
      EXPECT_EQ(out[p * F + f], c) << p << "," << f;
    }
  }
  // out = (carry - a) + b with reverse0, only lanes f <= 2 of rows p >= 1 (the rest kept).
  std::fill(out.begin(), out.end(), -7.0f);
  program_run(*scan_program(P, F, kSub, true, kAdd, DType::k_float32, {{2, 0, -1}, {-1, 1, 0}}),
              slots);
  for (int p = 0; p < P; ++p) {
    float c = init[p];
    for (int f = 0; f < F; ++f) {
      if (p < 1 || f > 2) {
        EXPECT_EQ(out[p * F + f], -7.0f);
        continue;
      }
      c = (c - a[p * F + f]) + b[p * F + f];
      EXPECT_EQ(out[p * F + f], c);
    }
  }
}

TEST(NkiIsa, ScanCarriesTheValueAsStored) {
  const int64_t P = 1, F = 40;
  std::vector<float> a(F, 1.0f), b(F, 0.01f), init = {0.0f};
  std::vector<uint16_t> out(F);
  void* slots[] = {a.data(), b.data(), init.data(), out.data(), nullptr};
  program_run(*scan_program(P, F, kMul, false, kAdd, DType::k_bfloat16, {}), slots);
  float c = 0.0f;
  for (int f = 0; f < F; ++f) {
    c = round_to(DType::k_bfloat16, c + 0.01f);  // the numpy formula on a bfloat16 result
    EXPECT_EQ(out[f], ir::numeric::bf16_from_f32(c)) << f;
  }
}

TEST(NkiIsa, ScanWithForeignRegistersIsRejected) {
  Encoder e({64, 64, 16, 64, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(2, {4, 4});
  e.operand(0, 3, 0, {4, 1});
  e.w.push_back(3);
  e.operand(0, 0, 0, {4, 1});
  e.operand(0, 1, 0, {4, 1});
  e.operand(0, 2, 0, {1, 0});
  e.w.push_back(2);
  e.w.insert(e.w.end(), {kMul, 0, 1, 0});  // op0 over data0 and data1: not a scan
  e.w.insert(e.w.end(), {kAdd, 3, 1, 0});
  e.w.push_back(0);
  EXPECT_THROW(e.parse(), std::invalid_argument);
}

// The scan reads its data as views: an iota operand there is malformed, not memory to read.
TEST(NkiIsa, ScanOverAnIotaIsRejected) {
  Encoder e({64, 64, 16, 64, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(2, {4, 4});
  e.operand(0, 3, 0, {4, 1});
  e.w.push_back(3);
  e.operand(2, 0, 1000000, {4, 1});  // an iota where data0 goes
  e.operand(0, 1, 0, {4, 1});
  e.operand(0, 2, 0, {1, 0});
  e.w.push_back(2);
  e.w.insert(e.w.end(), {kAdd, 0, 2, 0});
  e.w.insert(e.w.end(), {kAdd, 3, 1, 0});
  e.w.push_back(0);
  EXPECT_THROW(e.parse(), std::invalid_argument);
}

// A gather of n_valid x n_elem from a [P, S] float32 source by a [P, K] uint16 index tile.
Encoder gather_encoder(int64_t P, int64_t S, int64_t K, int64_t n_valid, int64_t n_elem,
                       int64_t index_bytes, bool own_row = false) {
  Encoder e({P * S * 4, index_bytes, P * n_valid * n_elem * 4, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(3, {P, n_valid, n_elem}, 0, kAdd, false, 0);
  e.operand(0, 2, 0, {n_valid * n_elem, n_elem, 1});
  e.w.push_back(2);
  e.operand(0, 0, 0, {S, 0, 1});
  e.operand(0, 1, 0, {K, 1, 0}, 0, DType::k_uint16);
  e.w.push_back(0);  // no steps
  e.w.push_back(0);  // no predicates
  e.w.insert(e.w.end(), {S, K, own_row ? 1 : 0});
  return e;
}

// nl.gather_flattened: each partition by its own index row, any partition count.
TEST(NkiIsa, GatherByOwnIndexRow) {
  const int64_t P = 5, S = 9, K = 4;
  auto p = gather_encoder(P, S, K, K, 1, P * K * 2, true).parse({"kernel.py:3"});
  std::vector<float> src(P * S), out(P * K, -1.0f);
  std::vector<uint16_t> index(P * K);
  for (int i = 0; i < P * S; ++i) src[i] = static_cast<float>(i);
  for (int i = 0; i < P * K; ++i) index[i] = static_cast<uint16_t>((i * 5) % S);
  void* slots[] = {src.data(), index.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t j = 0; j < K; ++j) EXPECT_EQ(out[q * K + j], src[q * S + index[q * K + j]]);
  index[3 * K + 2] = static_cast<uint16_t>(S);  // past the row
  try {
    program_run(*p, slots);
    FAIL() << "no error";
  } catch (const std::runtime_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("gather_flattened index 9"), std::string::npos)
        << ex.what();
  }
}

TEST(NkiIsa, GatherByRunTimeIndices) {
  const int64_t P = 32, S = 10, K = 2, n_valid = 20, n_elem = 2;
  auto p = gather_encoder(P, S, K, n_valid, n_elem, P * K * 2).parse({"kernel.py:7"});
  std::vector<float> src(P * S), out(P * n_valid * n_elem, -1.0f);
  std::vector<uint16_t> index(P * K);
  for (int i = 0; i < P * S; ++i) src[i] = static_cast<float>(i);
  for (int i = 0; i < P * K; ++i) index[i] = static_cast<uint16_t>((i * 7) % (S - n_elem + 1));
  void* slots[] = {src.data(), index.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t j = 0; j < n_valid; ++j) {
      const int64_t core0 = q / 16 * 16;
      const int64_t i = index[(core0 + j % 16) * K + j / 16];
      for (int64_t el = 0; el < n_elem; ++el)
        EXPECT_EQ(out[(q * n_valid + j) * n_elem + el], src[q * S + i + el]) << q << "," << j;
    }
  index[17 * K + 1] = static_cast<uint16_t>(S - 1);  // j = 17 of core 1 reads past the source
  try {
    program_run(*p, slots);
    FAIL() << "no error";
  } catch (const std::runtime_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("kernel.py:7"), std::string::npos) << ex.what();
    EXPECT_NE(std::string(ex.what()).find("local_gather index 9"), std::string::npos) << ex.what();
  }
}

TEST(NkiIsa, GatherIndexTilePastItsSlotIsRejected) {
  EXPECT_THROW(gather_encoder(16, 8, 2, 20, 1, 16 * 2 * 2 - 2).parse({"k.py:1"}),
               std::invalid_argument);
  EXPECT_THROW(gather_encoder(16, 8, 1, 20, 1, 16 * 2).parse({"k.py:1"}),  // 20 > 16 x 1
               std::invalid_argument);
}

// A [P, n] float32 copy between slot 0 ([P, S] source, or [P, n] when the destination moves)
// and slot 2 (the other), at an offset read from element `at` of slot 1 (dtype vt): target 0
// moves the source, 1 the destination, over offsets [lo, hi]; `preds`: c, coef0, coef1 each;
// `mode`: Instr::dyn_mode.
Encoder dynamic_encoder(int target, int64_t P, int64_t S, int64_t n, int64_t lo, int64_t hi,
                        DType vt, int64_t at, std::vector<int64_t> preds = {}, int mode = 0) {
  Encoder e({P * (target == 0 ? S : n) * 4, 8, P * (target == 0 ? n : S) * 4, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(4, {P, n}, 0, kAdd, false, 0);
  e.operand(0, 2, target == 1 ? lo : 0, {target == 1 ? S : n, 1});
  e.w.push_back(2);
  e.operand(0, 0, target == 0 ? lo : 0, {target == 0 ? S : n, 1});
  e.operand(0, 1, at, {0, 0}, 0, vt);
  e.w.push_back(0);  // no steps
  e.w.push_back(static_cast<int64_t>(preds.size() / 3));
  e.w.insert(e.w.end(), preds.begin(), preds.end());
  e.w.insert(e.w.end(), {target, 1, lo, hi, mode});
  return e;
}

void expect_offset_error(const Program& p, void* const* slots, const std::string& what) {
  try {
    program_run(p, slots);
    FAIL() << "no error";
  } catch (const std::runtime_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("kernel.py:3"), std::string::npos) << ex.what();
    EXPECT_NE(std::string(ex.what()).find(what), std::string::npos) << ex.what();
  }
}

TEST(NkiIsa, DynamicSourceOffsetReadWhenRun) {
  const int64_t P = 4, S = 16, n = 3;
  auto p = dynamic_encoder(0, P, S, n, 0, S - n, DType::k_int32, 1).parse({"kernel.py:3"});
  std::vector<float> src(P * S), out(P * n, -1.0f);
  int32_t offset[2] = {99, 0};  // element 1 holds the offset
  for (int i = 0; i < P * S; ++i) src[i] = static_cast<float>(i);
  void* slots[] = {src.data(), offset, out.data(), nullptr};
  for (int32_t v : {0, 5, 13}) {
    offset[1] = v;
    program_run(*p, slots);
    for (int64_t q = 0; q < P; ++q)
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(out[q * n + j], src[q * S + v + j]) << v;
  }
  offset[1] = 14;  // the last element would be column 16 of 16
  expect_offset_error(*p, slots, "tensor_copy_dynamic_src offset 14");
  offset[1] = -1;
  expect_offset_error(*p, slots, "offsets must be in [0, 13]");
}

TEST(NkiIsa, DynamicDestinationOffsetUnderAMask) {
  const int64_t P = 4, S = 10, n = 4;
  // rows p <= 2 only (2 - p >= 0); the offset is a uint8 at byte 5
  auto p =
      dynamic_encoder(1, P, S, n, 2, S - n, DType::k_uint8, 5, {2, -1, 0}).parse({"kernel.py:3"});
  std::vector<float> src(P * n), out(P * S, -1.0f);
  uint8_t offset[8] = {};
  for (int i = 0; i < P * n; ++i) src[i] = static_cast<float>(i + 1);
  offset[5] = 3;
  void* slots[] = {src.data(), offset, out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t f = 0; f < S; ++f) {
      const bool written = q <= 2 && f >= 3 && f < 3 + n;
      EXPECT_EQ(out[q * S + f], written ? src[q * n + f - 3] : -1.0f) << q << "," << f;
    }
  offset[5] = 1;  // below the lowest offset the tracer allowed
  expect_offset_error(*p, slots, "tensor_copy_dynamic_dst offset 1");
  offset[5] = 255;
  expect_offset_error(*p, slots, "destination outside its tensor");
}

// An access pattern's scalar_offset (nisa.dma_copy): out of range, an error naming it, or with
// oob_mode.skip nothing copied.
TEST(NkiIsa, ScalarOffsetOutOfRangeFailsOrCopiesNothing) {
  const int64_t P = 2, S = 8, n = 4;
  for (int mode : {kDynScalarOffset, kDynScalarOffset | kDynSkip}) {
    auto p =
        dynamic_encoder(0, P, S, n, 0, S - n, DType::k_int32, 0, {}, mode).parse({"kernel.py:3"});
    std::vector<float> src(P * S), out(P * n, -1.0f);
    for (int i = 0; i < P * S; ++i) src[i] = static_cast<float>(i);
    int32_t offset[2] = {2, 0};
    void* slots[] = {src.data(), offset, out.data(), nullptr};
    program_run(*p, slots);
    EXPECT_EQ(out[n], src[S + 2]);
    offset[0] = 5;
    std::fill(out.begin(), out.end(), -1.0f);
    if (mode & kDynSkip) {
      program_run(*p, slots);
      EXPECT_EQ(out, std::vector<float>(P * n, -1.0f));
    } else {
      expect_offset_error(*p, slots, "dma_copy access pattern's scalar_offset 5");
    }
  }
}

TEST(NkiIsa, DynamicCopyConcurrentRunsOfOneProgram) {
  // Each run moves its own copy of the instruction: runs from several threads (several
  // streams) share the parsed program and nothing else.
  const int64_t P = 8, S = 32, n = 4;
  auto p = dynamic_encoder(0, P, S, n, 0, S - n, DType::k_int32, 0).parse({"kernel.py:3"});
  std::vector<float> src(P * S);
  for (int i = 0; i < P * S; ++i) src[i] = static_cast<float>(i);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> out(P * n);
      int32_t offset[2] = {static_cast<int32_t>(t * 7), 0};
      void* slots[] = {src.data(), offset, out.data(), nullptr};
      for (int rep = 0; rep < 50; ++rep) {
        program_run(*p, slots);
        for (int64_t q = 0; q < P; ++q)
          for (int64_t j = 0; j < n; ++j) bad[t] += out[q * n + j] != src[q * S + t * 7 + j];
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(NkiIsa, DynamicCopyPastItsSlotIsRejected) {
  // the far end (offset 14 of a 16-column source, 3 wide) leaves the slot
  EXPECT_THROW(dynamic_encoder(0, 4, 16, 3, 0, 14, DType::k_int32, 0).parse({"k.py:1"}),
               std::invalid_argument);
  EXPECT_THROW(dynamic_encoder(1, 4, 10, 4, -1, 6, DType::k_int32, 0).parse({"k.py:1"}),
               std::invalid_argument);
  // the offset must be one element of an integer tile
  EXPECT_THROW(dynamic_encoder(0, 4, 16, 3, 0, 13, DType::k_float32, 0).parse({"k.py:1"}),
               std::invalid_argument);
  EXPECT_THROW(
      dynamic_encoder(0, 4, 16, 3, 0, 13, DType::k_int32, 2).parse({"k.py:1"}),  // past 8 bytes
      std::invalid_argument);
  EXPECT_THROW(
      dynamic_encoder(0, 4, 16, 3, 5, 4, DType::k_int32, 0).parse({"k.py:1"}),  // empty range
      std::invalid_argument);
  EXPECT_NO_THROW(dynamic_encoder(0, 4, 16, 3, 0, 13, DType::k_int32, 1).parse({"k.py:1"}));
}

// kIndirect over [P, F]: slot 0 an HBM table of R rows of F (dtype ht), slot 1 the P row
// indices (dtype it), slot 2 a [P, F] tile (dtype tt). Target 0 gathers table rows into the
// tile, 1 scatters the tile's rows into the table (`acc`: adds them); rows [lo, hi] admitted
// (hi < 0: the whole table); `preds`: c, coef0, coef1 each.
struct IndirectSpec {
  int target = 0;
  int64_t P = 4, R = 10, F = 5;
  DType it = DType::k_int32, ht = DType::k_float32, tt = DType::k_float32;
  bool skip = false, acc = false;
  int64_t lo = 0, hi = -1;
  std::vector<int64_t> preds;
  std::vector<int64_t> index_strides = {1, 0};
};

Encoder indirect_encoder(const IndirectSpec& s) {
  const int64_t hi = s.hi < 0 ? s.R - 1 : s.hi;
  const auto bytes = [](DType dt, int64_t n) { return n * static_cast<int64_t>(dtype_size(dt)); };
  Encoder e({bytes(s.ht, s.R * s.F), bytes(s.it, s.P), bytes(s.tt, s.P * s.F), 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(5, {s.P, s.F}, 0, kAdd, s.acc, 0);
  auto table = [&] { e.operand(0, 0, s.lo * s.F, {0, 1}, 0, s.ht); };
  auto tile = [&] { e.operand(0, 2, 0, {s.F, 1}, 0, s.tt); };
  s.target == 0 ? tile() : table();
  e.w.push_back(2);
  s.target == 0 ? table() : tile();
  e.operand(0, 1, 0, s.index_strides, 0, s.it);
  e.w.push_back(0);  // no steps
  e.w.push_back(static_cast<int64_t>(s.preds.size() / 3));
  e.w.insert(e.w.end(), s.preds.begin(), s.preds.end());
  e.w.insert(e.w.end(), {s.target, s.skip ? 1 : 0, s.F, s.lo, hi});
  return e;
}

TEST(NkiIsa, IndirectGatherReadsRowsByRunTimeIndices) {
  IndirectSpec s;
  std::vector<float> table(s.R * s.F);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) + 0.5f;
  for (DType it : {DType::k_int32, DType::k_uint32}) {
    s.it = it;
    auto p = indirect_encoder(s).parse({"kernel.py:3"});
    uint32_t index[4] = {7, 0, 9, 7};  // a repeated row reads twice
    std::vector<float> out(s.P * s.F, -1.0f);
    void* slots[] = {table.data(), index, out.data(), nullptr};
    program_run(*p, slots);
    for (int64_t q = 0; q < s.P; ++q)
      for (int64_t f = 0; f < s.F; ++f)
        EXPECT_EQ(out[q * s.F + f], table[index[q] * s.F + f]) << dtype_name(it);
  }
}

TEST(NkiIsa, IndirectGatherOfOneDtypeCopiesBytes) {
  // int32 past 2^24 would round through float32; the DMA copies bytes.
  IndirectSpec s;
  s.ht = s.tt = DType::k_int32;
  auto p = indirect_encoder(s).parse({"kernel.py:3"});
  std::vector<int32_t> table(s.R * s.F), out(s.P * s.F, 0);
  for (size_t i = 0; i < table.size(); ++i) table[i] = (1 << 24) + 1 + static_cast<int32_t>(i);
  int32_t index[4] = {3, 1, 4, 1};
  void* slots[] = {table.data(), index, out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t q = 0; q < s.P; ++q)
    for (int64_t f = 0; f < s.F; ++f) EXPECT_EQ(out[q * s.F + f], table[index[q] * s.F + f]);
}

TEST(NkiIsa, IndirectScatterRepeatedIndexLastRowWinsOrAllAdd) {
  IndirectSpec s;
  s.target = 1;
  std::vector<float> tile(s.P * s.F);
  for (size_t i = 0; i < tile.size(); ++i) tile[i] = static_cast<float>(i + 1);
  int32_t index[4] = {2, 8, 2, 5};
  for (bool acc : {false, true}) {
    s.acc = acc;
    auto p = indirect_encoder(s).parse({"kernel.py:3"});
    std::vector<float> table(s.R * s.F, 100.0f);
    void* slots[] = {table.data(), index, tile.data(), nullptr};
    program_run(*p, slots);
    for (int64_t r = 0; r < s.R; ++r)
      for (int64_t f = 0; f < s.F; ++f) {
        float want = 100.0f;
        for (int64_t q = 0; q < s.P; ++q)
          if (index[q] == r) want = acc ? want + tile[q * s.F + f] : tile[q * s.F + f];
        EXPECT_EQ(table[r * s.F + f], want) << "acc " << acc << " row " << r;
      }
  }
}

TEST(NkiIsa, IndirectIndexOutOfRangeFailsOrIsSkipped) {
  IndirectSpec s;
  std::vector<float> table(s.R * s.F, 1.0f), out(s.P * s.F, -1.0f);
  int32_t index[4] = {0, 10, 2, -1};
  void* slots[] = {table.data(), index, out.data(), nullptr};
  auto p = indirect_encoder(s).parse({"kernel.py:3"});
  expect_offset_error(*p, slots, "row index 10 (partition 1 of the int32 index tile");
  index[1] = 1;
  expect_offset_error(*p, slots, "indices must be in [0, 9]");
  s.skip = true;  // oob_mode.skip: rows 1 and 3 untouched (the failed runs wrote rows before)
  index[1] = 10;
  std::fill(out.begin(), out.end(), -1.0f);
  auto q = indirect_encoder(s).parse({"kernel.py:3"});
  program_run(*q, slots);
  for (int64_t r = 0; r < s.P; ++r)
    for (int64_t f = 0; f < s.F; ++f)
      EXPECT_EQ(out[r * s.F + f], (r == 1 || r == 3) ? -1.0f : 1.0f) << r;
  s.target = 1;  // a skipped scatter row writes nothing
  auto w = indirect_encoder(s).parse({"kernel.py:3"});
  std::vector<float> tile(s.P * s.F, 7.0f);
  void* wslots[] = {table.data(), index, tile.data(), nullptr};
  program_run(*w, wslots);
  for (int64_t r = 0; r < s.R; ++r)
    EXPECT_EQ(table[r * s.F], (r == 0 || r == 2) ? 7.0f : 1.0f) << r;
}

TEST(NkiIsa, IndirectMaskedRowReadsNoIndex) {
  IndirectSpec s;
  s.preds = {1, -1, 0};  // rows p <= 1 only
  auto p = indirect_encoder(s).parse({"kernel.py:3"});
  std::vector<float> table(s.R * s.F), out(s.P * s.F, -1.0f);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  int32_t index[4] = {4, 6, 1 << 30, -7};  // garbage where masked
  void* slots[] = {table.data(), index, out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t q = 0; q < s.P; ++q)
    for (int64_t f = 0; f < s.F; ++f)
      EXPECT_EQ(out[q * s.F + f], q <= 1 ? table[index[q] * s.F + f] : -1.0f) << q;
}

TEST(NkiIsa, IndirectCopyConcurrentRunsOfOneProgram) {
  // Each run moves its own copy of the instruction: runs from several threads (several
  // streams) share the parsed program and nothing else.
  IndirectSpec s;
  s.P = 16, s.R = 64, s.F = 8;
  auto p = indirect_encoder(s).parse({"kernel.py:3"});
  std::vector<float> table(s.R * s.F);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> out(s.P * s.F);
      std::vector<int32_t> index(s.P);
      for (int64_t q = 0; q < s.P; ++q) index[q] = static_cast<int32_t>((q * 5 + t * 11) % s.R);
      void* slots[] = {table.data(), index.data(), out.data(), nullptr};
      for (int rep = 0; rep < 50; ++rep) {
        program_run(*p, slots);
        for (int64_t q = 0; q < s.P; ++q)
          for (int64_t f = 0; f < s.F; ++f) bad[t] += out[q * s.F + f] != table[index[q] * s.F + f];
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(NkiIsa, IndirectCopyPastItsSlotIsRejected) {
  auto parse = [](IndirectSpec s) { return indirect_encoder(s).parse({"k.py:1"}); };
  IndirectSpec s;
  EXPECT_NO_THROW(parse(s));
  s.hi = s.R;  // the highest admitted row is past the table
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.lo = -1;
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.lo = 5, s.hi = 4;  // an empty range
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.it = DType::k_float32;  // indices are integers
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.index_strides = {1, 1};  // one index per row, not per lane
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.index_strides = {2, 0};  // 4 indices 2 apart leave their 16 bytes
  EXPECT_THROW(parse(s), std::invalid_argument);
  s = IndirectSpec();
  s.target = 1, s.hi = s.R;
  EXPECT_THROW(parse(s), std::invalid_argument);
}

// random numbers: `launch_random` draws from the run's seed (program_run's), `random` from a key
// the kernel holds (two float words) alone; both uniform in [0, 1), one value per lane index.
std::unique_ptr<Program> random_program(bool keyed) {
  Encoder e({128, 64});  // out[4x8], arena
  e.w.insert(e.w.end(), {1, 1});
  e.header(0, {4, 8});
  e.operand(0, 0, 0, {8, 1});
  if (keyed) {
    e.w.push_back(3);
    e.operand(1, 0, 0, {0, 0}, 42.0);
    e.operand(1, 0, 0, {0, 0}, 7.0);
    e.operand(2, 0, 0, {8, 1});  // the lane index
    e.w.insert(e.w.end(), {1, static_cast<int>(Op::k_random), 0, 1, 2});
  } else {
    e.w.push_back(1);
    e.operand(2, 0, 0, {8, 1});
    e.w.insert(e.w.end(), {1, static_cast<int>(Op::k_launch_random), 0, 0, 0});
  }
  e.w.push_back(0);
  return e.parse();
}

TEST(NkiIsa, RandomDrawsFromTheRunSeedOrTheKernelsKey) {
  auto run = [](const Program& p, uint64_t seed) {
    std::vector<float> out(32, -1.0f);
    void* slots[] = {out.data(), nullptr};
    program_run(p, slots, seed);
    for (float v : out) EXPECT_TRUE(v >= 0.0f && v < 1.0f) << v;
    return out;
  };
  auto launch = random_program(false);
  EXPECT_TRUE(launch->random);
  const std::vector<float> a = run(*launch, 7);
  EXPECT_EQ(run(*launch, 7), a);
  EXPECT_NE(run(*launch, 8), a);
  std::vector<float> distinct(a);
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto keyed = random_program(true);
  EXPECT_FALSE(keyed->random);  // no seed needed: the launch leaves the generator alone
  const std::vector<float> k = run(*keyed, 7);
  EXPECT_EQ(run(*keyed, 8), k);
  EXPECT_NE(k, a);
}

// nonzero_with_count: in partitions 0 and 16 of a [20, 6] source, the positions of the nonzero
// elements (NaN among them; -0 is zero) plus the offset, padding, then the count; the other
// rows of the destination stay. A destination without room for the count is refused.
std::unique_ptr<Program> nonzero_program(int64_t dst_bytes) {
  constexpr int64_t P = 20, T = 6;
  Encoder e({P * T * 4, dst_bytes, 64});  // src (float32), dst (int32), arena
  e.w.insert(e.w.end(), {1, 1});
  e.header(6, {P, T});
  e.operand(0, 1, 0, {T + 1, 1}, 0, DType::k_int32);
  e.w.push_back(1);
  e.operand(0, 0, 0, {T, 1});
  e.w.insert(e.w.end(), {0, 0, 100, -7});  // no steps, no predicates; offset 100, padding -7
  return e.parse();
}

TEST(NkiIsa, NonzeroWithCountInEachGpSimdCoresFirstPartition) {
  constexpr int64_t P = 20, T = 6;
  auto p = nonzero_program(P * (T + 1) * 4);
  std::vector<float> src(P * T, 0.0f);
  src[0 * T + 1] = 2.0f, src[0 * T + 4] = NAN, src[0 * T + 5] = -0.0f;
  src[1 * T + 0] = 1.0f;                                                   // partition 1: not read
  for (int64_t f = 0; f < T; ++f) src[16 * T + f] = f % 2 ? 0.0f : -1.5f;  // 0, 2, 4
  std::vector<int32_t> dst(P * (T + 1), 55);
  void* slots[] = {src.data(), dst.data(), nullptr};
  program_run(*p, slots);
  const std::vector<int32_t> row0 = {101, 104, -7, -7, -7, -7, 2};
  const std::vector<int32_t> row16 = {100, 102, 104, -7, -7, -7, 3};
  for (int64_t q = 0; q < P; ++q)
    for (int64_t f = 0; f <= T; ++f) {
      const int32_t want = q == 0 ? row0[f] : q == 16 ? row16[f] : 55;
      EXPECT_EQ(dst[q * (T + 1) + f], want) << q << "," << f;
    }
  EXPECT_THROW(nonzero_program(P * (T + 1) * 4 - 4), std::invalid_argument);
}

// Two instances (a kernel[2] launch): each doubles its row of x into an arena tile, the two
// swap tiles at a sendrecv, and each writes what it received to its row of out; a core barrier
// between them changes nothing. One instance's sendrecv without the other's is refused.
Encoder sendrecv_encoder(bool both, bool barrier) {
  constexpr int64_t F = 4;
  Encoder e({2 * F * 4, 2 * F * 4, 64});  // x [2, F], out [2, F], arena (tiles t 0-3, u 4-7)
  e.w.push_back(2);                       // two instances
  for (int g = 0; g < 2; ++g) {
    const bool sends = both || g == 0;
    e.w.push_back(2 + (sends ? 1 : 0) + (barrier ? 1 : 0));
    e.header(0, {1, F});  // t = x[g] * 2
    e.operand(0, 2, 0, {F, 1});
    e.w.push_back(2);
    e.operand(0, 0, g * F, {F, 1});
    e.operand(1, 0, 0, {0, 0}, 2.0);
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    if (barrier) {
      e.header(7, {1, 1}, 0, kAdd, false, 0);
      e.operand(0, 1, 0, {0, 0});
      e.w.insert(e.w.end(), {0, 0, 0, -1, -1});
    }
    if (sends) {
      e.header(7, {1, F}, 0, kAdd, false, 0);  // u <- the other's t
      e.operand(0, 2, F, {F, 1});
      e.w.push_back(1);
      e.operand(0, 2, 0, {F, 1});
      e.w.insert(e.w.end(), {0, 0, 1 - g, 1 - g});
    }
    e.header(0, {1, F});  // out[g] = u
    e.operand(0, 1, g * F, {F, 1});
    e.w.push_back(1);
    e.operand(0, 2, F, {F, 1});
    e.w.insert(e.w.end(), {0, 0});
  }
  return e;
}

TEST(NkiIsa, SendrecvSwapsTilesBetweenInstances) {
  for (bool barrier : {false, true}) {
    auto p = sendrecv_encoder(true, barrier).parse({"kernel.py:3"});
    std::vector<float> x = {1, 2, 3, 4, 10, 20, 30, 40}, out(8, -1.0f);
    void* slots[] = {x.data(), out.data(), nullptr};
    program_run(*p, slots);
    EXPECT_EQ(out, std::vector<float>({20, 40, 60, 80, 2, 4, 6, 8})) << barrier;
  }
  try {
    sendrecv_encoder(false, false).parse({"kernel.py:3"});
    FAIL() << "no error";
  } catch (const std::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("kernel.py:3: in kernel 'test': instance 1 reaches 0"),
              std::string::npos)
        << ex.what();
  }
}

}  // namespace
}  // namespace openneuron::nki
