// The element-wise reduction kernels behind reduce_into(), in the form the algorithms need (many
// inputs, one rounding): ShmComm's and the glue's inter-host leg over Gloo, so both compute the
// same bits. Torch-free.
#pragma once

#include <cstddef>

#include "shm_comm.h"

namespace openneuron::collectives {

// Whether `op` is defined on `dt`: bitwise ops take integer and bool dtypes only.
bool reduce_op_valid(DType dt, ReduceOp op);

// out[i] = ins[0][i] op ins[1][i] op ... op ins[k-1][i], combined left to right (so every caller
// that passes the inputs in the same order gets bitwise the same result). bf16/f16 accumulate in
// float32 and round once at the end. out may alias any input; k >= 1. Throws
// std::invalid_argument for an invalid (dt, op).
void reduce_many(void* out, const void* const* ins, int k, size_t n, DType dt, ReduceOp op);

}  // namespace openneuron::collectives
