// The Tensor Engine instruction of a traced NKI program: dst[M, N] (+)= stationary[K, M]^T @
// moving[K, N] in float32 (PSUM), K, M <= 128 and N <= 512 (checked when traced and parsed).
// Operands are packed into contiguous float32 panels (converted and padded where needed); a
// register-blocked kernel compiled per SIMD variant multiplies them (column blocks split over
// threads for a large tile) and the result is written (or accumulated) through the
// destination's strides, and added into the accumulator of an absorbed `acc += result`.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/kernel_util.h"
#include "nki/convert.h"
#include "nki/program.h"
#include "runtime/parallel.h"

namespace openneuron::nki {
namespace {

using kernels::VecF;
constexpr int kRowBlock = 4;   // rows of C per block
constexpr int kColBlock = 64;  // columns of C per block (4 vectors)

// Columns [n0, n0 + 64) of c[Mp x ldc] = A^T @ B over K, from packed panels: ap holds aT
// (K x Mp) as Mp / 4 micro-panels of K x 4 floats, bp the 64 columns as K x 64 floats (32 KiB
// at K = 128, kept in L1 while every row block passes over it). Packed because tile rows lie a
// partition pitch apart (several KiB, a multiple of 4 KiB): read in place, the K rows of a
// column slice fall into the same few L1 sets and are fetched from L2 again for every row
// block.
// The accumulators of a row block on the variant's register width (kernel_util.h, VecF): W
// vectors of V per row, 4 x 4 AVX-512 registers, 4 x 2 AVX2 ones (16 of 64 columns at a time:
// 4 x 8 do not fit AVX2's 16 registers). Each output sums over k in order in every variant.
template <class V, int W>
OPENNEURON_INLINE void gemm_v(const float* ap, const float* bp, float* c, int64_t ldc, int64_t Mp,
                              int64_t K, int64_t n0) {
  constexpr int64_t L = kernels::kLanesOf<V>, kCols = W * L;
  for (int64_t m0 = 0; m0 < Mp; m0 += kRowBlock) {
    const float* a = ap + m0 * K;
    for (int64_t j0 = 0; j0 < kColBlock; j0 += kCols) {
      V acc[kRowBlock][W] = {};
      for (int64_t k = 0; k < K; ++k) {
        V bv[W];
        for (int v = 0; v < W; ++v) kernels::load_n(&bv[v], bp + k * kColBlock + j0 + L * v);
        for (int i = 0; i < kRowBlock; ++i) {
          const float s = a[k * kRowBlock + i];
          for (int v = 0; v < W; ++v) acc[i][v] += s * bv[v];
        }
      }
      for (int i = 0; i < kRowBlock; ++i)
        for (int v = 0; v < W; ++v)
          kernels::store_n(c + (m0 + i) * ldc + n0 + j0 + L * v, acc[i][v]);
    }
  }
}

OPENNEURON_ISA_BODY void gemm_body(const float* ap, const float* bp, float* c, int64_t ldc,
                                   int64_t Mp, int64_t K, int64_t n0) {
  kernels::with_native_vec([&](auto tag) OPENNEURON_LAMBDA_INLINE {
    using V = typename decltype(tag)::type;
    gemm_v<V, std::is_same_v<V, VecF> ? 4 : 2>(ap, bp, c, ldc, Mp, K, n0);
  });
}
OPENNEURON_ISA_DISPATCH(void, gemm,
                        (const float* ap, const float* bp, float* c, int64_t ldc, int64_t Mp,
                         int64_t K, int64_t n0),
                        (ap, bp, c, ldc, Mp, K, n0))

// aT (K x Mp, row k at k * lda) into micro-panels of kRowBlock columns (see gemm_body).
void pack_a(const float* aT, int64_t lda, int64_t Mp, int64_t K, float* out) {
  for (int64_t m0 = 0; m0 < Mp; m0 += kRowBlock)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(out + m0 * K + k * kRowBlock, aT + k * lda + m0, sizeof(float) * kRowBlock);
}

// Columns [n0, n0 + 64) of b (row k at k * ldb) as K x 64 floats.
void pack_b(const float* b, int64_t ldb, int64_t K, int64_t n0, float* out) {
  for (int64_t k = 0; k < K; ++k)
    std::memcpy(out + k * kColBlock, b + k * ldb + n0, sizeof(float) * kColBlock);
}

// A panel rows x ld of floats: element (r, c < cols) of the view at offset + r*sr + c*sc, the
// rest zero.
template <class T, class F>
void gather_typed(const char* base, int64_t offset, int64_t sr, int64_t sc, int64_t rows,
                  int64_t cols, float* out, int64_t ld, F cvt) {
  const T* p = reinterpret_cast<const T*>(base) + offset;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * ld;
    const T* src = p + r * sr;
    if (sc == 1) {
      for (int64_t c = 0; c < cols; ++c) row[c] = cvt(src[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) row[c] = cvt(src[c * sc]);
    }
    std::fill(row + cols, row + ld, 0.0f);
  }
}

void gather_panel(const Operand& o, const char* base, int64_t sr, int64_t sc, int64_t rows,
                  int64_t cols, float* out, int64_t ld) {
  const int64_t off = o.offset;
  switch (o.dtype) {
    case DType::k_float32:
      gather_typed<float>(base, off, sr, sc, rows, cols, out, ld, [](float v) { return v; });
      break;
    case DType::k_bfloat16:
      gather_typed<uint16_t>(base, off, sr, sc, rows, cols, out, ld,
                             [](uint16_t v) { return ir::numeric::f32_from_bf16(v); });
      break;
    case DType::k_float16:
      gather_typed<uint16_t>(base, off, sr, sc, rows, cols, out, ld,
                             [](uint16_t v) { return ir::numeric::f32_from_f16(v); });
      break;
    default:  // the tracer gives matmuls floating operands only; others read one by one
      for (int64_t r = 0; r < rows; ++r) {
        float* row = out + r * ld;
        for (int64_t c = 0; c < cols; ++c) row[c] = load_one(o.dtype, base, off + r * sr + c * sc);
        std::fill(row + cols, row + ld, 0.0f);
      }
      break;
  }
}

// Columns [n_begin, n_end) of the result c (M x N, leading dimension Np) into the
// destination, through the elementwise path's conversions (or accumulated into it).
void store_cols(const Instr& in, char* const* slots, const float* c, int64_t Np, int64_t n_begin,
                int64_t n_end) {
  const int64_t M = in.extent[0];
  const Operand& d = in.dst;
  char* base = slots[d.slot];
  if (in.absorbs_next) {  // acc[m, n] = acc[m, n] + result[m, n], as the absorbed add
    const Operand& a = in.acc_dst;
    for (int64_t m = 0; m < M; ++m) {
      float* acc = reinterpret_cast<float*>(slots[a.slot]) + a.offset + m * a.stride[0];
      const float* row = c + m * Np;
      for (int64_t n = n_begin; n < n_end; ++n) acc[n] = acc[n] + row[n];
    }
  }
  if (in.dst_dead) return;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = c + m * Np;
    const int64_t off = d.offset + m * d.stride[0];
    if (d.dtype == DType::k_float32 && d.stride[1] == 1) {
      float* out = reinterpret_cast<float*>(base) + off;
      if (in.accumulate) {
        for (int64_t n = n_begin; n < n_end; ++n) out[n] += row[n];
      } else {
        std::memcpy(out + n_begin, row + n_begin, sizeof(float) * (n_end - n_begin));
      }
      continue;
    }
    for (int64_t n = n_begin; n < n_end; ++n) {
      const int64_t i = off + n * d.stride[1];
      float v = row[n];
      if (in.accumulate) v += load_one(d.dtype, base, i);
      store_one(d.dtype, base, i, v);
    }
  }
}

std::atomic<GemmBackend> g_gemm_backend{nullptr};

}  // namespace

void set_gemm_backend(GemmBackend gemm) { g_gemm_backend.store(gemm); }

void run_matmul(const Instr& in, char* const* slots, bool parallel) {
  const int64_t M = in.extent[0], N = in.extent[1], K = in.extent[2];
  if (M == 0 || N == 0) return;
  const int64_t Mp = (M + kRowBlock - 1) / kRowBlock * kRowBlock;
  const int64_t Np = (N + kColBlock - 1) / kColBlock * kColBlock;
  thread_local std::vector<float> a, b, c, packed_a;
  const Operand& st = in.src[0];  // stationary [K, M]: strides (m, -, k)
  const Operand& mv = in.src[1];  // moving [K, N]: strides (-, n, k)
  // A float32 operand with unit stride along its free axis and no padding needed is read in
  // place; any other is gathered into a float32 panel (the same values either way).
  const float* pa;
  int64_t lda = Mp;
  if (st.dtype == DType::k_float32 && st.stride[0] == 1 && Mp == M) {
    pa = reinterpret_cast<const float*>(slots[st.slot]) + st.offset;
    lda = st.stride[2];
  } else {
    a.resize(static_cast<size_t>(K * Mp));
    gather_panel(st, slots[st.slot], st.stride[2], st.stride[0], K, M, a.data(), Mp);
    pa = a.data();
  }
  const float* pb;
  int64_t ldb = Np;
  if (mv.dtype == DType::k_float32 && mv.stride[1] == 1 && Np == N) {
    pb = reinterpret_cast<const float*>(slots[mv.slot]) + mv.offset;
    ldb = mv.stride[2];
  } else {
    b.resize(static_cast<size_t>(K * Np));
    gather_panel(mv, slots[mv.slot], mv.stride[2], mv.stride[1], K, N, b.data(), Np);
    pb = b.data();
  }
  c.resize(static_cast<size_t>(Mp * Np));
  float* pc = c.data();
  // NOTE: a parallel region costs microseconds; a full 128 x 512 x 128 tile is ~8 M FMAs.
  constexpr int64_t kParallelFmas = int64_t{1} << 20;
  const int64_t n_blocks = Np / kColBlock;
  const bool large = parallel && n_blocks > 1 && M * N * K >= kParallelFmas;
  const GemmBackend host_gemm = g_gemm_backend.load(std::memory_order_relaxed);
  // An `acc += matmul(...)` whose own result nobody reads: the GEMM adds into the accumulator
  // itself (one pass over it instead of a result tile written, read and added).
  const Operand& acc = in.acc_dst;
  if (host_gemm != nullptr && large && in.absorbs_next && in.dst_dead &&
      acc.dtype == DType::k_float32 && acc.stride[1] == 1) {
    host_gemm(M, N, K, pa, lda, pb, ldb, reinterpret_cast<float*>(slots[acc.slot]) + acc.offset,
              acc.stride[0], true);
    return;
  }
  if (host_gemm != nullptr && large) {
    host_gemm(M, N, K, pa, lda, pb, ldb, pc, Np, false);
    runtime::parallel_for(0, n_blocks, 1, [&](int64_t blk0, int64_t blk1) {
      store_cols(in, slots, pc, Np, blk0 * kColBlock, std::min(N, blk1 * kColBlock));
    });
    return;
  }
  packed_a.resize(static_cast<size_t>(Mp * K));
  pack_a(pa, lda, Mp, K, packed_a.data());
  const float* ap = packed_a.data();
  // Column blocks split over threads: each packs, computes and stores its own columns of the
  // result (every element the same sum in the same order on any split).
  auto cols = [&](int64_t blk0, int64_t blk1) {
    thread_local std::vector<float> bp;
    bp.resize(static_cast<size_t>(K * kColBlock));
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      pack_b(pb, ldb, K, blk * kColBlock, bp.data());
      gemm(ap, bp.data(), pc, Np, Mp, K, blk * kColBlock);
    }
    store_cols(in, slots, pc, Np, blk0 * kColBlock, std::min(N, blk1 * kColBlock));
  };
  if (large)
    runtime::parallel_for(0, n_blocks, 1, cols);
  else
    cols(0, n_blocks);
}

}  // namespace openneuron::nki
