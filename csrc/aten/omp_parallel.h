// runtime::parallel_for's backend on ATen's OpenMP intra-op pool (see omp_parallel.cpp).
#pragma once

#include <cstdint>

#include "runtime/parallel.h"

namespace openneuron::aten {

// Splits [begin, end) over the calling thread's OpenMP team (at::get_num_threads() threads,
// chunks of at least grain) like at::parallel_for; serial inside a parallel region.
void omp_parallel_for(int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                      void* ctx);

// runtime::set_parallel_release's hook: frees the calling thread's OpenMP pool
// (omp_pause_resource_all: libgomp's gomp_pause_host), outside a parallel region.
void omp_release_pool();
// Whether libgomp's spin is bounded (GOMP_SPINCOUNT or OMP_WAIT_POLICY set): only then is
// omp_release_pool installed (parallel.h says why).
bool omp_spin_bounded();

}  // namespace openneuron::aten
