// runtime::parallel_for's backend on ATen's OpenMP intra-op pool (see omp_parallel.cpp).
#pragma once

#include <cstdint>

#include "runtime/parallel.h"

namespace openneuron::aten {

// Splits [begin, end) over the calling thread's OpenMP team (at::get_num_threads() threads,
// chunks of at least grain) like at::parallel_for; serial inside a parallel region.
void omp_parallel_for(int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                      void* ctx);

}  // namespace openneuron::aten
