// The Tensor Engine instruction of a traced NKI program: dst[M, N] (+)= stationary[K, M]^T @
// moving[K, N] in float32 (PSUM), K, M <= 128 and N <= 512 (checked when traced and parsed).
// Operands are gathered into padded float32 panels, multiplied by a register-blocked kernel
// compiled per SIMD variant, and written (or accumulated) through the destination's strides.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kernel_util.h"
#include "nki/program.h"

namespace openneuron::nki {
namespace {

using kernels::VecF;
constexpr int kRowBlock = 4;   // rows of C per block
constexpr int kColBlock = 64;  // columns of C per block (4 vectors)

// c[Mp x Np] = a[Mp x K] @ b[K x Np]; Mp % 4 == 0, Np % 64 == 0.
OPENNEURON_ISA_BODY void gemm_body(const float* a, const float* b, float* c, int64_t Mp, int64_t Np,
                                   int64_t K) {
  for (int64_t m0 = 0; m0 < Mp; m0 += kRowBlock) {
    for (int64_t n0 = 0; n0 < Np; n0 += kColBlock) {
      VecF acc[kRowBlock][4] = {};
      for (int64_t k = 0; k < K; ++k) {
        VecF bv[4];
        for (int v = 0; v < 4; ++v) kernels::loadv(&bv[v], b + k * Np + n0 + 16 * v);
        for (int i = 0; i < kRowBlock; ++i) {
          const float s = a[(m0 + i) * K + k];
          for (int v = 0; v < 4; ++v) acc[i][v] += s * bv[v];
        }
      }
      for (int i = 0; i < kRowBlock; ++i)
        std::memcpy(c + (m0 + i) * Np + n0, acc[i], sizeof acc[i]);
    }
  }
}
OPENNEURON_ISA_DISPATCH(void, gemm,
                        (const float* a, const float* b, float* c, int64_t Mp, int64_t Np,
                         int64_t K),
                        (a, b, c, Mp, Np, K))

float load_one(DType dt, const char* base, int64_t i) {
  switch (dt) {
    case DType::k_float32:
      return reinterpret_cast<const float*>(base)[i];
    case DType::k_bfloat16:
      return ir::numeric::f32_from_bf16(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::k_float16:
      return ir::numeric::f32_from_f16(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::k_int32:
      return static_cast<float>(reinterpret_cast<const int32_t*>(base)[i]);
    case DType::k_uint8:
      return static_cast<float>(reinterpret_cast<const uint8_t*>(base)[i]);
    case DType::k_int8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(base)[i]);
    default:
      return 0.0f;
  }
}

// A panel rows x cols of floats: element (r, c) of the view at offset + r*sr + c*sc.
void gather_panel(const Operand& o, const char* base, int64_t sr, int64_t sc, int64_t rows,
                  int64_t cols, float* out, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * ld;
    const int64_t off = o.offset + r * sr;
    if (o.dtype == DType::k_float32 && sc == 1) {
      std::memcpy(row, reinterpret_cast<const float*>(base) + off, sizeof(float) * cols);
    } else {
      for (int64_t c = 0; c < cols; ++c) row[c] = load_one(o.dtype, base, off + c * sc);
    }
    std::fill(row + cols, row + ld, 0.0f);
  }
}

}  // namespace

void run_matmul(const Instr& in, char* const* slots) {
  const int64_t M = in.extent[0], N = in.extent[1], K = in.extent[2];
  if (M == 0 || N == 0) return;
  const int64_t Mp = (M + kRowBlock - 1) / kRowBlock * kRowBlock;
  const int64_t Np = (N + kColBlock - 1) / kColBlock * kColBlock;
  thread_local std::vector<float> a, b, c;
  a.assign(static_cast<size_t>(Mp * K), 0.0f);
  b.resize(static_cast<size_t>(K * Np));
  c.resize(static_cast<size_t>(Mp * Np));
  const Operand& st = in.src[0];  // stationary: strides (m, -, k)
  const Operand& mv = in.src[1];  // moving: strides (-, n, k)
  gather_panel(st, slots[st.slot], st.stride[0], st.stride[2], M, K, a.data(), K);
  gather_panel(mv, slots[mv.slot], mv.stride[2], mv.stride[1], K, N, b.data(), Np);
  gemm(a.data(), b.data(), c.data(), Mp, Np, K);
  // The destination through the elementwise path's conversions: rows of N lanes.
  const Operand& d = in.dst;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = c.data() + m * Np;
    const int64_t off = d.offset + m * d.stride[0];
    if (d.dtype == DType::k_float32 && d.stride[1] == 1) {
      float* out = reinterpret_cast<float*>(slots[d.slot]) + off;
      if (in.accumulate) {
        for (int64_t n = 0; n < N; ++n) out[n] += row[n];
      } else {
        std::memcpy(out, row, sizeof(float) * N);
      }
      continue;
    }
    for (int64_t n = 0; n < N; ++n) {
      float v = row[n];
      if (in.accumulate) v += load_one(d.dtype, slots[d.slot], off + n * d.stride[1]);
      char* base = slots[d.slot];
      const int64_t i = off + n * d.stride[1];
      switch (d.dtype) {
        case DType::k_float32:
          reinterpret_cast<float*>(base)[i] = v;
          break;
        case DType::k_bfloat16:
          reinterpret_cast<uint16_t*>(base)[i] = ir::numeric::bf16_from_f32(v);
          break;
        case DType::k_float16:
          reinterpret_cast<uint16_t*>(base)[i] = ir::numeric::f16_from_f32(v);
          break;
        default:  // the tracer gives matmuls a floating destination only
          break;
      }
    }
  }
}

}  // namespace openneuron::nki
