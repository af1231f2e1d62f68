// The NKI executor (csrc/nki) on hand-encoded programs: an elementwise instruction with a
// per-row predicate, a reduction, a tile matmul, the parser's refusal of any operand that
// leaves its slot (the guarantee that no traced program can fault), and the schedule: chains
// run in row blocks (partition-broadcast reads and one-axis column instructions among them), a
// cross-row dependency or aliasing arguments keep the written order; K tiles of one accumulator
// merged into one matmul.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "nki/program.h"
#include "nki_encoder.h"

namespace openneuron::nki {
namespace {

constexpr int kAdd = static_cast<int>(Op::k_add);
constexpr int kMul = static_cast<int>(Op::k_multiply);
using nki_test::Encoder;

TEST(Nki, MaskedAddAndRowSum) {
  // slots: a[4x8], b[4x8], out[4x8], sums[4], arena
  Encoder e({128, 128, 128, 16, 64});
  e.w.push_back(1);  // one instance
  e.w.push_back(2);  // two instructions
  e.header(0, {4, 8});
  e.operand(0, 2, 0, {8, 1});  // dst out
  e.w.push_back(2);
  e.operand(0, 0, 0, {8, 1});
  e.operand(0, 1, 0, {8, 1});
  e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0});  // one step: add(r0, r1)
  e.w.insert(e.w.end(), {1, 5, -1, -1});      // one predicate: 5 - p - f >= 0
  e.header(0, {4, 8}, 1, kAdd);
  e.operand(0, 3, 0, {1, 0});
  e.w.push_back(1);
  e.operand(0, 0, 0, {8, 1});
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  std::vector<float> a(32), b(32), out(32, -1.0f), sums(4);
  for (int i = 0; i < 32; ++i) a[i] = static_cast<float>(i), b[i] = 100.0f;
  void* slots[] = {a.data(), b.data(), out.data(), sums.data(), nullptr};
  program_run(*p, slots);
  for (int r = 0; r < 4; ++r) {
    float s = 0;
    for (int c = 0; c < 8; ++c) {
      s += a[r * 8 + c];
      EXPECT_EQ(out[r * 8 + c], r + c <= 5 ? a[r * 8 + c] + 100.0f : -1.0f) << r << "," << c;
    }
    EXPECT_FLOAT_EQ(sums[r], s);
  }
}

TEST(Nki, Matmul) {
  const int K = 3, M = 2, N = 5;
  Encoder e({K * M * 4, K * N * 4, M * N * 4, 64});
  e.w.insert(e.w.end(), {1, 1});
  e.header(1, {M, N, K});
  e.operand(0, 2, 0, {N, 1, 0});
  e.w.push_back(2);
  e.operand(0, 0, 0, {1, 0, M});  // stationary [K, M]
  e.operand(0, 1, 0, {0, 1, N});  // moving [K, N]
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  std::vector<float> st(K * M), mv(K * N), out(M * N);
  for (int i = 0; i < K * M; ++i) st[i] = static_cast<float>(i + 1);
  for (int i = 0; i < K * N; ++i) mv[i] = static_cast<float>(i % 7) - 3.0f;
  void* slots[] = {st.data(), mv.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float ref = 0;
      for (int k = 0; k < K; ++k) ref += st[k * M + m] * mv[k * N + n];
      EXPECT_FLOAT_EQ(out[m * N + n], ref);
    }
}

TEST(Nki, OperandOutsideItsSlotIsRejected) {
  Encoder e({64, 64});  // a 16-float slot, and the arena
  e.w.insert(e.w.end(), {1, 1});
  e.header(0, {4, 8});
  e.operand(0, 0, 0, {8, 1});  // 32 floats: past the slot
  e.w.push_back(1);
  e.operand(1, 0, 0, {0, 0}, 1.0);
  e.w.insert(e.w.end(), {0, 0});
  EXPECT_THROW(e.parse(), std::invalid_argument);
}

// A [4 x F] float32 view of `slot` at `offset` (rows of F).
void rows_view(Encoder& e, int slot, int64_t offset, int64_t F) {
  e.operand(0, slot, offset, {F, 1});
}

// Rows of 4096 floats: two rows to a block, so the chain runs as two blocks.
TEST(Nki, ChainRunsInRowBlocks) {
  constexpr int64_t F = 4096, kBytes = 4 * F * 4;
  // slots: a, b, out, arena (two tiles)
  Encoder e({kBytes, kBytes, kBytes, 2 * kBytes});
  e.w.insert(e.w.end(), {1, 3});
  e.header(0, {4, F});  // t = load a
  rows_view(e, 3, 0, F);
  e.w.push_back(1);
  rows_view(e, 0, 0, F);
  e.w.insert(e.w.end(), {0, 0});
  e.header(0, {4, F});  // u = t * 2
  rows_view(e, 3, 4 * F, F);
  e.w.push_back(2);
  rows_view(e, 3, 0, F);
  e.operand(1, 0, 0, {0, 0}, 2.0);
  e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
  e.header(0, {4, F});  // out = u + b
  rows_view(e, 2, 0, F);
  e.w.push_back(2);
  rows_view(e, 3, 4 * F, F);
  rows_view(e, 1, 0, F);
  e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
  auto p = e.parse();
  ASSERT_EQ(p->schedules[0].size(), 1u);
  EXPECT_TRUE(p->schedules[0][0].blocked);
  EXPECT_LT(p->schedules[0][0].block_rows, 4);
  std::vector<float> a(4 * F), b(4 * F), out(4 * F);
  for (int64_t i = 0; i < 4 * F; ++i) a[i] = 0.25f * static_cast<float>(i % 37), b[i] = 1.0f;
  void* slots[] = {a.data(), b.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t i = 0; i < 4 * F; ++i) ASSERT_EQ(out[i], a[i] * 2.0f + 1.0f) << i;
}

// The second instruction reads row p + 1 of the tile the first one writes: not one group.
TEST(Nki, CrossRowReadEndsTheGroup) {
  constexpr int64_t F = 1024, kBytes = 4 * F * 4;
  Encoder e({kBytes, kBytes, kBytes});  // a, out, arena
  e.w.insert(e.w.end(), {1, 2});
  e.header(0, {4, F});  // t = a * 3
  rows_view(e, 2, 0, F);
  e.w.push_back(2);
  rows_view(e, 0, 0, F);
  e.operand(1, 0, 0, {0, 0}, 3.0);
  e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
  e.header(0, {3, F});  // out[p] = t[p + 1]
  rows_view(e, 1, 0, F);
  e.w.push_back(1);
  rows_view(e, 2, F, F);
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  EXPECT_EQ(p->schedules[0].size(), 2u);
  std::vector<float> a(4 * F), out(4 * F, -1.0f);
  for (int64_t i = 0; i < 4 * F; ++i) a[i] = static_cast<float>(i);
  void* slots[] = {a.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t i = 0; i < 3 * F; ++i) ASSERT_EQ(out[i], 3.0f * a[i + F]) << i;
}

// One buffer passed as two arguments: the first instruction updates row p + 1 before the
// second reads it, as written, although the schedule (slots as distinct memory) grouped them.
TEST(Nki, AliasingArgumentsRunAsWritten) {
  constexpr int64_t F = 2048, kBytes = 4 * F * 4;
  Encoder e({kBytes, kBytes, kBytes, 64});  // x, x again, out, arena
  e.w.insert(e.w.end(), {1, 2});
  e.header(0, {4, F});  // slot1 = slot0 + 1
  rows_view(e, 1, 0, F);
  e.w.push_back(2);
  rows_view(e, 0, 0, F);
  e.operand(1, 0, 0, {0, 0}, 1.0);
  e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
  e.header(0, {3, F});  // out[p] = slot0[p + 1]
  rows_view(e, 2, 0, F);
  e.w.push_back(1);
  rows_view(e, 0, F, F);
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  ASSERT_EQ(p->schedules[0].size(), 1u);
  std::vector<float> x(4 * F), out(4 * F);
  for (int64_t i = 0; i < 4 * F; ++i) x[i] = static_cast<float>(i);
  void* slots[] = {x.data(), x.data(), out.data(), nullptr};
  program_run(*p, slots);
  for (int64_t i = 0; i < 3 * F; ++i) ASSERT_EQ(out[i], static_cast<float>(i + F) + 1.0f) << i;
}

// Tiles laid out partition-major (the tracer's arena): rows kPitch floats apart, tile t at
// t * F in every row. A tile of weights read by every row (row stride 0) joins the group of
// the instructions around it; reading row 0 of a tile the group writes does not.
TEST(Nki, PartitionBroadcastReadJoinsTheGroupUnlessTheGroupWritesIt) {
  constexpr int64_t F = 256, kPitch = 2 * F, kBytes = 4 * F * 4;
  for (const bool reads_own_row0 : {false, true}) {
    Encoder e({kBytes, kBytes, 4 * kPitch * 4});  // a, out, arena (t at 0, w at F)
    e.w.insert(e.w.end(), {1, 2});
    e.header(0, {4, F});  // t = a * 2
    e.operand(0, 2, 0, {kPitch, 1});
    e.w.push_back(2);
    rows_view(e, 0, 0, F);
    e.operand(1, 0, 0, {0, 0}, 2.0);
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    e.header(0, {4, F});  // out[p] = t[p] * w (or * t[0])
    rows_view(e, 1, 0, F);
    e.w.push_back(2);
    e.operand(0, 2, 0, {kPitch, 1});
    e.operand(0, 2, reads_own_row0 ? 0 : F, {0, 1});
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    auto p = e.parse();
    EXPECT_EQ(p->schedules[0].size(), reads_own_row0 ? 2u : 1u);
    std::vector<float> a(4 * F), out(4 * F), arena(4 * kPitch);
    for (int64_t i = 0; i < 4 * F; ++i) a[i] = static_cast<float>(i % 53);
    for (int64_t j = 0; j < F; ++j) arena[F + j] = 0.5f * static_cast<float>(j);
    void* slots[] = {a.data(), out.data(), arena.data()};
    program_run(*p, slots);
    for (int64_t i = 0; i < 4 * F; ++i) {
      const float w = reads_own_row0 ? a[i % F] * 2.0f : 0.5f * static_cast<float>(i % F);
      ASSERT_EQ(out[i], a[i] * 2.0f * w) << i;
    }
  }
}

// A one-axis instruction over a [P, 1] column (an rstd store) runs as P rows of one lane and
// stays in its neighbours' group.
TEST(Nki, ColumnInstructionJoinsTheGroup) {
  constexpr int64_t F = 256, kPitch = 2 * F, kBytes = 4 * F * 4;
  Encoder e({kBytes, 4 * 4, 4 * kPitch * 4});  // a, col, arena (t at 0)
  e.w.insert(e.w.end(), {1, 2});
  e.header(0, {4, F});  // t = a + 1
  e.operand(0, 2, 0, {kPitch, 1});
  e.w.push_back(2);
  rows_view(e, 0, 0, F);
  e.operand(1, 0, 0, {0, 0}, 1.0);
  e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
  e.header(0, {4});  // col[p] = t[p, 3]
  e.operand(0, 1, 0, {1});
  e.w.push_back(1);
  e.operand(0, 2, 3, {kPitch});
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  ASSERT_EQ(p->schedules[0].size(), 1u);
  EXPECT_TRUE(p->schedules[0][0].blocked);
  std::vector<float> a(4 * F), col(4), arena(4 * kPitch);
  for (int64_t i = 0; i < 4 * F; ++i) a[i] = static_cast<float>(i);
  void* slots[] = {a.data(), col.data(), arena.data()};
  program_run(*p, slots);
  for (int64_t r = 0; r < 4; ++r) ASSERT_EQ(col[r], a[r * F + 3] + 1.0f) << r;
}

// Two-axis instructions take run_rows2: a row's scalar operands (a [P, 1] column read along the
// free axis, a constant) as one value, a select (three operands) with a scalar among them,
// rows longer than a chunk under a mask, and a destination that overlaps an operand read in
// place by one lane, which must go through a register (every lane reads the old row).
TEST(Nki, TwoAxisRowsWithScalarsAndOverlap) {
  constexpr int64_t F = 300;  // more than one chunk
  constexpr int kSel = static_cast<int>(Op::k_select);
  constexpr int kGt = static_cast<int>(Op::k_greater);
  Encoder e({4 * F * 4, 4 * 4, 4 * F * 4, 4 * 200 * 4, 64});  // a, col, out, x, arena
  e.w.insert(e.w.end(), {1, 2});
  // out = select(a > col, a * col + 0.5, col), lanes f <= 290 - p
  e.header(0, {4, F});
  rows_view(e, 2, 0, F);
  e.w.push_back(3);
  rows_view(e, 0, 0, F);
  e.operand(0, 1, 0, {1, 0});  // col[p], every lane
  e.operand(1, 0, 0, {0, 0}, 0.5);
  e.w.push_back(4);
  e.w.insert(e.w.end(), {kMul, 0, 1, 0});  // r3 = a * col
  e.w.insert(e.w.end(), {kAdd, 3, 2, 0});  // r4 = r3 + 0.5
  e.w.insert(e.w.end(), {kGt, 0, 1, 0});   // r5 = a > col
  e.w.insert(e.w.end(), {kSel, 5, 4, 1});  // r6 = r5 ? r4 : col
  e.w.insert(e.w.end(), {1, 290, -1, -1});
  // x[p, 1:200] = x[p, 0:199] * 2: the destination one lane after the operand
  e.header(0, {4, 199});
  e.operand(0, 3, 1, {200, 1});
  e.w.push_back(2);
  e.operand(0, 3, 0, {200, 1});
  e.operand(1, 0, 0, {0, 0}, 2.0);
  e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
  auto p = e.parse();
  std::vector<float> a(4 * F), col = {0.0f, 1.0f, -2.0f, 3.5f}, out(4 * F, -7.0f), x(800);
  for (int64_t i = 0; i < 4 * F; ++i) a[i] = 0.125f * static_cast<float>(i % 53) - 2.0f;
  for (int i = 0; i < 800; ++i) x[i] = static_cast<float>(i);
  const std::vector<float> x0 = x;
  void* slots[] = {a.data(), col.data(), out.data(), x.data(), nullptr};
  program_run(*p, slots);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < F; ++c) {
      const float v = a[r * F + c], s = col[r];
      const float want = r + c <= 290 ? (v > s ? v * s + 0.5f : s) : -7.0f;
      ASSERT_EQ(out[r * F + c], want) << r << "," << c;
    }
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(x[r * 200], x0[r * 200]);
    for (int c = 1; c < 200; ++c) ASSERT_EQ(x[r * 200 + c], 2.0f * x0[r * 200 + c - 1]) << r << c;
  }
}

// `acc += nl.matmul(...)`: a matmul into a PSUM tile, then an accumulating copy of that tile.
// The add runs in the matmul's store; the tile itself is still written when a later
// instruction reads it (read_back), and only then.
TEST(Nki, MatmulAbsorbsTheAccumulateAfterIt) {
  const int K = 3, M = 4, N = 5;
  for (bool read_back : {false, true}) {
    // slots: stationary, moving, acc (HBM), copy of the tile (HBM), arena (the tile)
    Encoder e({K * M * 4, K * N * 4, M * N * 4, M * N * 4, M * N * 4});
    e.w.insert(e.w.end(), {1, read_back ? 3 : 2});
    e.header(1, {M, N, K});
    e.operand(0, 4, 0, {N, 1, 0});
    e.w.push_back(2);
    e.operand(0, 0, 0, {1, 0, M});
    e.operand(0, 1, 0, {0, 1, N});
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {M, N}, 0, kAdd, /*acc=*/true);  // acc += tile
    e.operand(0, 2, 0, {N, 1});
    e.w.push_back(1);
    e.operand(0, 4, 0, {N, 1});
    e.w.insert(e.w.end(), {0, 0});
    if (read_back) {
      e.header(0, {M, N});  // copy = tile
      e.operand(0, 3, 0, {N, 1});
      e.w.push_back(1);
      e.operand(0, 4, 0, {N, 1});
      e.w.insert(e.w.end(), {0, 0});
    }
    auto p = e.parse();
    EXPECT_TRUE(p->rewritten[0][0].absorbs_next);
    EXPECT_TRUE(p->rewritten[0][1].absorbed);
    EXPECT_EQ(p->rewritten[0][0].dst_dead, !read_back);
    std::vector<float> st(K * M), mv(K * N), acc(M * N), copy(M * N, -1.0f);
    for (int i = 0; i < K * M; ++i) st[i] = static_cast<float>(i + 1);
    for (int i = 0; i < K * N; ++i) mv[i] = static_cast<float>(i % 7) - 3.0f;
    for (int i = 0; i < M * N; ++i) acc[i] = 0.5f * static_cast<float>(i);
    const std::vector<float> acc0 = acc;
    void* slots[] = {st.data(), mv.data(), acc.data(), copy.data(), nullptr};
    program_run(*p, slots);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float ref = 0;
        for (int k = 0; k < K; ++k) ref += st[k * M + m] * mv[k * N + n];
        EXPECT_EQ(acc[m * N + n], acc0[m * N + n] + ref);
        EXPECT_EQ(copy[m * N + n], read_back ? ref : -1.0f);
      }
  }
}

// NKI's loop over K tiles, `acc += matmul(a[k], b[k])` with operands the next K rows of the
// previous tile's, runs as one matmul over the whole K range (the second one dropped); operands
// that are not the next rows (variant gap: one row further) keep two matmuls. Same sums.
TEST(Nki, KTilesOfOneAccumulatorMergeIntoOneMatmul) {
  const int K = 3, M = 4, N = 5;
  for (bool gap : {false, true}) {
    const int rows = 2 * K + 1;
    // slots: stationary [rows x M], moving [rows x N], acc (HBM), arena (the result tile)
    Encoder e({rows * M * 4, rows * N * 4, M * N * 4, M * N * 4});
    e.w.insert(e.w.end(), {1, 4});
    for (int t = 0; t < 2; ++t) {
      const int k0 = t * (K + (gap ? 1 : 0));
      e.header(1, {M, N, K});  // tile = a[k0 : k0 + K]^T b[k0 : k0 + K]
      e.operand(0, 3, 0, {N, 1, 0});
      e.w.push_back(2);
      e.operand(0, 0, k0 * M, {1, 0, M});
      e.operand(0, 1, k0 * N, {0, 1, N});
      e.w.insert(e.w.end(), {0, 0});
      e.header(0, {M, N}, 0, kAdd, /*acc=*/true);  // acc += tile
      e.operand(0, 2, 0, {N, 1});
      e.w.push_back(1);
      e.operand(0, 3, 0, {N, 1});
      e.w.insert(e.w.end(), {0, 0});
    }
    auto p = e.parse();
    const std::vector<Instr>& r = p->rewritten[0];
    EXPECT_EQ(r[0].extent[2], gap ? K : 2 * K);
    EXPECT_EQ(r[2].dropped, !gap);
    std::vector<float> st(rows * M), mv(rows * N), acc(M * N);
    for (int i = 0; i < rows * M; ++i) st[i] = static_cast<float>(i % 5 + 1);
    for (int i = 0; i < rows * N; ++i) mv[i] = static_cast<float>(i % 7) - 3.0f;
    for (int i = 0; i < M * N; ++i) acc[i] = 0.5f * static_cast<float>(i);
    const std::vector<float> acc0 = acc;
    void* slots[] = {st.data(), mv.data(), acc.data(), nullptr};
    program_run(*p, slots);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float ref = 0;  // small integers: exact in any order
        for (int t = 0; t < 2; ++t)
          for (int k = t * (K + (gap ? 1 : 0)), k1 = k + K; k < k1; ++k)
            ref += st[k * M + m] * mv[k * N + n];
        EXPECT_EQ(acc[m * N + n], acc0[m * N + n] + ref) << "gap " << gap;
      }
  }
}

// Loads and stores forwarded at parse time: `a = load x; b = NaN; b = a * 2; store out <- b`
// runs as `out = x * 2` (the load and the store dropped; b's NaN fill stays; the dropped store
// lies inside the row-block group, which `out2 = 1` extends past it). Not forwarded: a store
// whose tile is read afterwards (variant 1: out2 = b), a load whose HBM source is written
// before its tile is read (variant 2: x = 7 instead of the NaN fill).
TEST(Nki, LoadsAndStoresForwardedWhereTheTileIsOnlyCopied) {
  constexpr int64_t F = 8, kPitch = 16;  // tiles a (columns 0-7) and b (8-15) of 4 partitions
  for (int variant : {0, 1, 2}) {
    Encoder e({4 * F * 4, 4 * F * 4, 4 * F * 4, 4 * kPitch * 4});  // x, out, out2, arena
    e.w.insert(e.w.end(), {1, 5});
    e.header(0, {4, F});  // a = load x
    e.operand(0, 3, 0, {kPitch, 1});
    e.w.push_back(1);
    rows_view(e, 0, 0, F);
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {4, F});  // b = NaN (variant 2: x = 7)
    if (variant == 2)
      rows_view(e, 0, 0, F);
    else
      e.operand(0, 3, F, {kPitch, 1});
    e.w.push_back(1);
    e.operand(1, 0, 0, {0, 0}, variant == 2 ? 7.0 : NAN);
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {4, F});  // b = a * 2
    e.operand(0, 3, F, {kPitch, 1});
    e.w.push_back(2);
    e.operand(0, 3, 0, {kPitch, 1});
    e.operand(1, 0, 0, {0, 0}, 2.0);
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    e.header(0, {4, F});  // out = store b
    rows_view(e, 1, 0, F);
    e.w.push_back(1);
    e.operand(0, 3, F, {kPitch, 1});
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {4, F});  // out2 = 1, or out2 = store b
    rows_view(e, 2, 0, F);
    e.w.push_back(1);
    if (variant == 0)
      e.operand(1, 0, 0, {0, 0}, 1.0);
    else
      e.operand(0, 3, F, {kPitch, 1});
    e.w.insert(e.w.end(), {0, 0});
    auto p = e.parse();
    const std::vector<Instr>& run = p->rewritten[0];
    EXPECT_EQ(run[0].dropped, variant != 2) << variant;
    EXPECT_EQ(run[3].dropped, variant == 0) << variant;
    EXPECT_EQ(run[2].src[0].slot, variant == 2 ? 3 : 0) << variant;
    std::vector<float> x(4 * F), out(4 * F), out2(4 * F);
    for (int64_t i = 0; i < 4 * F; ++i) x[i] = static_cast<float>(i) - 5.0f;
    const std::vector<float> x0 = x;
    void* slots[] = {x.data(), out.data(), out2.data(), nullptr};
    program_run(*p, slots);
    for (int64_t i = 0; i < 4 * F; ++i) {
      ASSERT_EQ(out[i], 2.0f * x0[i]) << variant << " " << i;
      ASSERT_EQ(out2[i], variant == 0 ? 1.0f : 2.0f * x0[i]) << variant << " " << i;
      ASSERT_EQ(x[i], variant == 2 ? 7.0f : x0[i]);
    }
  }
}

// The accumulator and the matmul's result in the same partitions, different columns (tiles
// partition-major: their byte ranges interleave without sharing a byte): still absorbed.
TEST(Nki, MatmulAbsorbsAnAccumulatorInterleavedWithItsResult) {
  const int K = 3, M = 4, N = 5, kPitch = 2 * N;  // acc in columns 0-4, the result in 5-9
  Encoder e({K * M * 4, K * N * 4, M * kPitch * 4, 64});
  e.w.insert(e.w.end(), {1, 2});
  e.header(1, {M, N, K});
  e.operand(0, 2, N, {kPitch, 1, 0});
  e.w.push_back(2);
  e.operand(0, 0, 0, {1, 0, M});
  e.operand(0, 1, 0, {0, 1, N});
  e.w.insert(e.w.end(), {0, 0});
  e.header(0, {M, N}, 0, kAdd, /*acc=*/true);
  e.operand(0, 2, 0, {kPitch, 1});
  e.w.push_back(1);
  e.operand(0, 2, N, {kPitch, 1});
  e.w.insert(e.w.end(), {0, 0});
  auto p = e.parse();
  EXPECT_TRUE(p->rewritten[0][0].absorbs_next);
  EXPECT_FALSE(p->rewritten[0][0].dst_dead);  // an argument, not scratch
  std::vector<float> st(K * M), mv(K * N), both(M * kPitch);
  for (int i = 0; i < K * M; ++i) st[i] = static_cast<float>(i + 1);
  for (int i = 0; i < K * N; ++i) mv[i] = static_cast<float>(i % 7) - 3.0f;
  for (int i = 0; i < M * kPitch; ++i) both[i] = 0.5f * static_cast<float>(i);
  const std::vector<float> both0 = both;
  void* slots[] = {st.data(), mv.data(), both.data(), nullptr};
  program_run(*p, slots);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float ref = 0;
      for (int k = 0; k < K; ++k) ref += st[k * M + m] * mv[k * N + n];
      EXPECT_EQ(both[m * kPitch + N + n], ref);
      EXPECT_EQ(both[m * kPitch + n], both0[m * kPitch + n] + ref);
    }
}

// A load's tile region reused by a smaller tile (a [P, 1] column written, then read) while the
// loaded tile is still read: the load is forwarded (the column read sees the column's values);
// not when a read of the loaded view follows the column write (variant 1: it must see both).
TEST(Nki, LoadForwardedPastASmallerTileInItsColumns) {
  constexpr int64_t F = 8, kPitch = 8;
  for (int variant : {0, 1}) {
    Encoder e({4 * F * 4, 4 * F * 4, 4 * 4, 4 * kPitch * 4});  // x, out, col, arena
    e.w.insert(e.w.end(), {1, 4});
    e.header(0, {4, F});  // a = load x
    e.operand(0, 3, 0, {kPitch, 1});
    e.w.push_back(1);
    rows_view(e, 0, 0, F);
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {4, 1});  // c = 3 (column 0 of a's partitions)
    e.operand(0, 3, 0, {kPitch, 0});
    e.w.push_back(1);
    e.operand(1, 0, 0, {0, 0}, 3.0);
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {4, 1});  // col = c * 2
    e.operand(0, 2, 0, {1, 0});
    e.w.push_back(2);
    e.operand(0, 3, 0, {kPitch, 0});
    e.operand(1, 0, 0, {0, 0}, 2.0);
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    e.header(0, {4, F});  // out = a + 1 (variant 0: out = x + 1)
    rows_view(e, 1, 0, F);
    e.w.push_back(2);
    if (variant == 0)
      rows_view(e, 0, 0, F);
    else
      e.operand(0, 3, 0, {kPitch, 1});
    e.operand(1, 0, 0, {0, 0}, 1.0);
    e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
    auto p = e.parse();
    EXPECT_EQ(p->rewritten[0][0].dropped, variant == 0) << variant;
    std::vector<float> x(4 * F), out(4 * F), col(4);
    for (int64_t i = 0; i < 4 * F; ++i) x[i] = static_cast<float>(i);
    void* slots[] = {x.data(), out.data(), col.data(), nullptr};
    program_run(*p, slots);
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(col[r], 6.0f);
      for (int64_t c = 0; c < F; ++c)
        EXPECT_EQ(out[r * F + c], (variant == 1 && c == 0 ? 3.0f : x[r * F + c]) + 1.0f);
    }
  }
}

// A [P, 1] column instruction runs as one row of P lanes (Instr::transposed), masked by rows;
// one that reads another row of what it writes does not.
TEST(Nki, ColumnInstructionRunsTransposed) {
  Encoder e({6 * 4, 6 * 4, 6 * 4, 64});  // in, out, chain, arena
  e.w.insert(e.w.end(), {1, 2});
  e.header(0, {6, 1});  // out[p] = in[p] * 2 + 0.5 for p <= 4
  e.operand(0, 1, 0, {1, 0});
  e.w.push_back(3);
  e.operand(0, 0, 0, {1, 0});
  e.operand(1, 0, 0, {0, 0}, 2.0);
  e.operand(1, 0, 0, {0, 0}, 0.5);
  e.w.insert(e.w.end(), {2, kMul, 0, 1, 0, kAdd, 3, 2, 0});
  e.w.insert(e.w.end(), {1, 4, -1, 0});  // 4 - p >= 0
  e.header(0, {5, 1});                   // chain[p] = chain[p + 1] * 2: rows depend on each other
  e.operand(0, 2, 0, {1, 0});
  e.w.push_back(2);
  e.operand(0, 2, 1, {1, 0});
  e.operand(1, 0, 0, {0, 0}, 2.0);
  e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
  auto p = e.parse();
  EXPECT_EQ(p->rewritten[0][0].transposed.size(), 1u);
  EXPECT_TRUE(p->rewritten[0][1].transposed.empty());
  std::vector<float> in = {1, 2, 3, 4, 5, 6}, out(6, -1.0f), chain = {1, 2, 3, 4, 5, 6};
  void* slots[] = {in.data(), out.data(), chain.data(), nullptr};
  program_run(*p, slots);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], i <= 4 ? in[i] * 2.0f + 0.5f : -1.0f) << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(chain[i], 2.0f * static_cast<float>(i + 2)) << i;
}

// RMSNorm's shape: sq = x * x; ms = sum(sq); a = ms + 1; r = a * 0.5; t = x * r; out = t * w;
// rstd = r. A result read only by the next instruction, element for element or a [P, 1] column
// broadcast along the row, is computed in its reader's registers: sum(x * x), (ms + 1) * 0.5 and
// x * r * w, three tiles never written. Not inlined: t read again afterwards (variant 1), or
// read under a mask other than the one that wrote it (variant 2: t for rows <= 2, out for rows
// <= 1), or the reader writing what t was computed from (variant 3: x = t * w in place of out).
// The results are the same floats either way.
TEST(Nki, ElementwiseChainsRunInTheirReadersRegisters) {
  constexpr int64_t F = 8, P = 4, kPitch = 32;  // arena: sq 0-7, ms 8, a 9, r 10, t 11-18
  constexpr int kSq = 0, kMs = 8, kA = 9, kR = 10, kT = 11;
  for (int variant : {0, 1, 2, 3}) {
    // slots: x, w, out, rstd, out2, arena
    Encoder e({P * F * 4, F * 4, P * F * 4, P * 4, P * F * 4, P * kPitch * 4});
    e.w.insert(e.w.end(), {1, variant == 1 ? 8 : 7});
    e.header(0, {P, F});  // sq = x * x
    e.operand(0, 5, kSq, {kPitch, 1});
    e.w.push_back(1);
    rows_view(e, 0, 0, F);
    e.w.insert(e.w.end(), {1, kMul, 0, 0, 0, 0});
    e.header(0, {P, F}, 1, kAdd);  // ms = sum(sq)
    e.operand(0, 5, kMs, {kPitch, 0});
    e.w.push_back(1);
    e.operand(0, 5, kSq, {kPitch, 1});
    e.w.insert(e.w.end(), {0, 0});
    e.header(0, {P, 1});  // a = ms + 1
    e.operand(0, 5, kA, {kPitch, 1});
    e.w.push_back(2);
    e.operand(0, 5, kMs, {kPitch, 1});
    e.operand(1, 0, 0, {0, 0}, 1.0);
    e.w.insert(e.w.end(), {1, kAdd, 0, 1, 0, 0});
    e.header(0, {P, 1});  // r = a * 0.5
    e.operand(0, 5, kR, {kPitch, 1});
    e.w.push_back(2);
    e.operand(0, 5, kA, {kPitch, 1});
    e.operand(1, 0, 0, {0, 0}, 0.5);
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0, 0});
    e.header(0, {P, F});  // t = x * r (rows <= 2 in variant 2)
    e.operand(0, 5, kT, {kPitch, 1});
    e.w.push_back(2);
    rows_view(e, 0, 0, F);
    e.operand(0, 5, kR, {kPitch, 0});
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0});
    if (variant == 2)
      e.w.insert(e.w.end(), {1, 2, -1, 0});  // 2 - p >= 0
    else
      e.w.push_back(0);
    e.header(0, {P, F});  // out = t * w (rows <= 1 in variant 2; x = t * w in variant 3)
    rows_view(e, variant == 3 ? 0 : 2, 0, F);
    e.w.push_back(2);
    e.operand(0, 5, kT, {kPitch, 1});
    e.operand(0, 1, 0, {0, 1});
    e.w.insert(e.w.end(), {1, kMul, 0, 1, 0});
    if (variant == 2)
      e.w.insert(e.w.end(), {1, 1, -1, 0});  // 1 - p >= 0
    else
      e.w.push_back(0);
    e.header(0, {P, 1});  // rstd = r
    e.operand(0, 3, 0, {1, 0});
    e.w.push_back(1);
    e.operand(0, 5, kR, {kPitch, 1});
    e.w.insert(e.w.end(), {0, 0});
    if (variant == 1) {
      e.header(0, {P, F});  // out2 = t
      rows_view(e, 4, 0, F);
      e.w.push_back(1);
      e.operand(0, 5, kT, {kPitch, 1});
      e.w.insert(e.w.end(), {0, 0});
    }
    auto p = e.parse();
    const std::vector<Instr>& run = p->rewritten[0];
    EXPECT_TRUE(run[0].dropped) << variant;
    EXPECT_EQ(run[1].steps.size(), 1u) << variant;
    EXPECT_EQ(run[1].src[0].slot, 0) << variant;
    EXPECT_TRUE(run[2].dropped) << variant;
    EXPECT_EQ(run[3].steps.size(), 2u) << variant;
    EXPECT_FALSE(run[3].dropped) << variant;  // read by two instructions
    EXPECT_EQ(run[4].dropped, variant == 0) << variant;
    EXPECT_EQ(run[5].steps.size(), variant == 0 ? 2u : 1u) << variant;
    std::vector<float> x(P * F), w(F), out(P * F, -1.0f), rstd(P, -1.0f), out2(P * F, -1.0f);
    for (int64_t i = 0; i < P * F; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
    for (int64_t f = 0; f < F; ++f) w[f] = 0.25f * static_cast<float>(f + 1);
    void* slots[] = {x.data(), w.data(), out.data(), rstd.data(), out2.data(), nullptr};
    const std::vector<float> x0 = x;
    program_run(*p, slots);
    const std::vector<float>& result = variant == 3 ? x : out;  // x = t * w: out untouched
    for (int64_t r = 0; r < P; ++r) {
      float ms = 0;
      for (int64_t f = 0; f < F; ++f) ms += x0[r * F + f] * x0[r * F + f];
      const float rr = (ms + 1.0f) * 0.5f;
      EXPECT_EQ(rstd[r], rr) << variant << " " << r;
      for (int64_t f = 0; f < F; ++f) {
        const float t = x0[r * F + f] * rr;
        const bool written = variant != 2 || r <= 1;
        EXPECT_EQ(result[r * F + f], written ? t * w[f] : -1.0f) << variant << " " << r << "," << f;
        EXPECT_EQ(out2[r * F + f], variant == 1 ? t : -1.0f) << variant << " " << r << "," << f;
        if (variant == 3) {
          EXPECT_EQ(out[r * F + f], -1.0f) << r << "," << f;
        }
      }
    }
  }
}

}  // namespace
}  // namespace openneuron::nki
