#include "kernels/foreach.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/parallel.h"

namespace openneuron::kernels {
namespace {

constexpr int64_t kChunk = 32768;

template <class D, ForeachOp kOp>
OPENNEURON_INLINE void apply_range(const ForeachTensor& t, int64_t begin, int64_t end) {
  using T = typename D::T;
  T* out = static_cast<T*>(t.out);
  const T* a = static_cast<const T*>(t.a);
  const T* b = static_cast<const T*>(t.b);
  const T* c = static_cast<const T*>(t.c);
  const float s = t.s;
  for (int64_t i = begin; i < end; ++i) {
    const float x = D::load(a[i]);
    float r;
    if constexpr (kOp == ForeachOp::MulScalar) {
      r = x * s;
    } else if constexpr (kOp == ForeachOp::AddScalar) {
      r = x + s;
    } else if constexpr (kOp == ForeachOp::DivScalar) {
      r = x / s;
    } else if constexpr (kOp == ForeachOp::Lerp) {
      const float y = D::load(b[i]);
      r = std::fabs(s) < 0.5f ? x + s * (y - x) : y - (y - x) * (1.0f - s);
    } else if constexpr (kOp == ForeachOp::Addcmul) {
      r = x + s * D::load(b[i]) * D::load(c[i]);
    } else if constexpr (kOp == ForeachOp::Addcdiv) {
      r = x + s * D::load(b[i]) / D::load(c[i]);
    } else {
      r = std::sqrt(x);
    }
    out[i] = D::store(r);
  }
}

template <class D>
OPENNEURON_INLINE void apply_op(ForeachOp op, const ForeachTensor& t, int64_t b, int64_t e) {
  switch (op) {
    case ForeachOp::MulScalar:
      apply_range<D, ForeachOp::MulScalar>(t, b, e);
      break;
    case ForeachOp::AddScalar:
      apply_range<D, ForeachOp::AddScalar>(t, b, e);
      break;
    case ForeachOp::DivScalar:
      apply_range<D, ForeachOp::DivScalar>(t, b, e);
      break;
    case ForeachOp::Lerp:
      apply_range<D, ForeachOp::Lerp>(t, b, e);
      break;
    case ForeachOp::Addcmul:
      apply_range<D, ForeachOp::Addcmul>(t, b, e);
      break;
    case ForeachOp::Addcdiv:
      apply_range<D, ForeachOp::Addcdiv>(t, b, e);
      break;
    case ForeachOp::Sqrt:
      apply_range<D, ForeachOp::Sqrt>(t, b, e);
      break;
  }
}

OPENNEURON_ISA_BODY void apply_chunk_body(ForeachOp op, DType dt, const ForeachTensor& t, int64_t b,
                                          int64_t e) {
  switch (dt) {
    case DType::kFloat32:
      apply_op<F32>(op, t, b, e);
      break;
    case DType::kBFloat16:
      apply_op<BF16>(op, t, b, e);
      break;
    case DType::kFloat16:
      apply_op<F16>(op, t, b, e);
      break;
    default:  // not a kernel dtype: callers take only these three
      break;
  }
}
OPENNEURON_ISA_DISPATCH(void, apply_chunk,
                        (ForeachOp op, DType dt, const ForeachTensor& t, int64_t b, int64_t e),
                        (op, dt, t, b, e))

}  // namespace

void foreach_apply(ForeachOp op, DType dtype, const ForeachTensor* tensors, size_t count) {
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < count; ++i)
    for (int64_t b = 0; b < tensors[i].numel; b += kChunk)
      chunks.push_back({i, b, std::min(tensors[i].numel, b + kChunk)});
  int64_t work = 0;
  for (const Chunk& ch : chunks) work += ch.end - ch.begin;
  runtime::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, work, [&](int64_t b, int64_t e) {
    for (int64_t x = b; x < e; ++x) {
      const Chunk& ch = chunks[static_cast<size_t>(x)];
      apply_chunk(op, dtype, tensors[ch.tensor], ch.begin, ch.end);
    }
  });
}

}  // namespace openneuron::kernels
