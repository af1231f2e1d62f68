// Softmax and log-softmax over the last dimension of a [rows, n] row-major array, forward and
// backward (the math of aten::_softmax / _log_softmax and their *_backward_data). float32,
// bfloat16, float16 storage; float32 compute. Parallel over rows (runtime::parallel_for).
#pragma once

#include <cstdint>

#include "kernels/kernel_util.h"

namespace openneuron::kernels {

// y = softmax(x) (log: log_softmax(x)) per row. x and y may alias.
void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t n, bool log);

// softmax:     grad_in = out * (grad_out - sum(grad_out * out))
// log_softmax: grad_in = grad_out - exp(out) * sum(grad_out)
// grad_in may alias grad_out.
void softmax_backward(DType dtype, const void* grad_out, const void* out, void* grad_in,
                      int64_t rows, int64_t n, bool log);

}  // namespace openneuron::kernels
