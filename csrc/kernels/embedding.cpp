#include "kernels/embedding.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

template <class D>
OPENNEURON_INLINE void add_row(typename D::T* dst, const typename D::T* src, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = D::store(D::load(dst[d]) + D::load(src[d]));
}

template <class D, class I>
OPENNEURON_INLINE int64_t rows_block(const void* grad, const I* idx, int64_t n, int64_t dim,
                                     int64_t num_weights, int64_t padding_idx, void* out,
                                     int64_t k0, int64_t k1) {
  using T = typename D::T;
  T* o = static_cast<T*>(out);
  std::memset(o + k0 * dim, 0, static_cast<size_t>((k1 - k0) * dim) * sizeof(T));
  const T* g = static_cast<const T*>(grad);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(idx[i]);
    if (k == padding_idx) continue;
    if (k < 0 || k >= num_weights) {
      bad += k0 == 0 ? 1 : 0;  // counted once, by the first block
      continue;
    }
    if (k >= k0 && k < k1) add_row<D>(o + k * dim, g + i * dim, dim);
  }
  return bad;
}

template <class I>
OPENNEURON_ISA_BODY int64_t block_body(DType dt, const void* grad, const I* idx, int64_t n,
                                       int64_t dim, int64_t num_weights, int64_t padding_idx,
                                       void* out, int64_t k0, int64_t k1) {
  switch (dt) {
    case DType::kFloat32:
      return rows_block<F32>(grad, idx, n, dim, num_weights, padding_idx, out, k0, k1);
    case DType::kBFloat16:
      return rows_block<BF16>(grad, idx, n, dim, num_weights, padding_idx, out, k0, k1);
    case DType::kFloat16:
      return rows_block<F16>(grad, idx, n, dim, num_weights, padding_idx, out, k0, k1);
    default:  // not a kernel dtype: callers take only these three
      break;
  }
  return 0;
}
#define OPENNEURON_EMBEDDING_BLOCK(I)                                                         \
  OPENNEURON_ISA_BODY int64_t block_##I##_body(                                               \
      DType dt, const void* grad, const I* idx, int64_t n, int64_t dim, int64_t num_weights,  \
      int64_t padding_idx, void* out, int64_t k0, int64_t k1) {                               \
    return block_body<I>(dt, grad, idx, n, dim, num_weights, padding_idx, out, k0, k1);       \
  }                                                                                           \
  OPENNEURON_ISA_DISPATCH(                                                                    \
      int64_t, block_##I,                                                                     \
      (DType dt, const void* grad, const I* idx, int64_t n, int64_t dim, int64_t num_weights, \
       int64_t padding_idx, void* out, int64_t k0, int64_t k1),                               \
      (dt, grad, idx, n, dim, num_weights, padding_idx, out, k0, k1))
OPENNEURON_EMBEDDING_BLOCK(int64_t)
OPENNEURON_EMBEDDING_BLOCK(int32_t)
#undef OPENNEURON_EMBEDDING_BLOCK

}  // namespace

void embedding_backward(DType dtype, const void* grad, const void* indices, bool index32, int64_t n,
                        int64_t dim, int64_t num_weights, int64_t padding_idx, void* out,
                        int64_t* bad) {
  *bad = 0;
  if (num_weights <= 0) return;
  // Blocks of output rows: at least ~64K elements each, and not so many that re-scanning the
  // indices per block dominates.
  const int64_t rows_per_block =
      std::max<int64_t>({1, 65536 / std::max<int64_t>(dim, 1), num_weights / 64});
  const int64_t blocks = (num_weights + rows_per_block - 1) / rows_per_block;
  std::atomic<int64_t> bad_total{0};
  runtime::parallel_for(0, blocks, 1, n * dim, [&](int64_t b0, int64_t b1) {
    int64_t local = 0;
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t k0 = bi * rows_per_block, k1 = std::min(num_weights, k0 + rows_per_block);
      local += index32 ? block_int32_t(dtype, grad, static_cast<const int32_t*>(indices), n, dim,
                                       num_weights, padding_idx, out, k0, k1)
                       : block_int64_t(dtype, grad, static_cast<const int64_t*>(indices), n, dim,
                                       num_weights, padding_idx, out, k0, k1);
    }
    bad_total.fetch_add(local, std::memory_order_relaxed);
  });
  *bad = bad_total.load();
}

}  // namespace openneuron::kernels
