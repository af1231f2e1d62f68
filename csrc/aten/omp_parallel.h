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
// Installed only when libgomp's spin is bounded (Config::omp_spin_bounded; parallel.h says why).

}  // namespace openneuron::aten
