// The weight gradient of an embedding lookup (the math of aten::embedding_dense_backward without
// scale_grad_by_freq): grad_weight[k] = sum of grad_output rows i with indices[i] == k, rows
// with indices[i] == padding_idx skipped. Deterministic and equal to ATen's CPU kernel: each
// output row accumulates its grad rows in index order, rounding to the storage dtype after every
// add as ATen's add_ does. Parallel over blocks of output rows (each block scans all indices).
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

// grad: [n, dim] contiguous; indices: n int64 (index32: int32); out: [num_weights, dim]
// contiguous, fully written (zeros where no index points). Indices outside [0, num_weights)
// are counted in *bad (not written) so the caller can report them.
void embedding_backward(DType dtype, const void* grad, const void* indices, bool index32, int64_t n,
                        int64_t dim, int64_t num_weights, int64_t padding_idx, void* out,
                        int64_t* bad);

}  // namespace openneuron::kernels
