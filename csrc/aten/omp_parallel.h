// runtime::parallel_for's backend on ATen's OpenMP intra-op pool (see omp_parallel.cpp).
#pragma once

#include <cstdint>

#include "runtime/parallel.h"

namespace openneuron::aten {

// Splits [begin, end) over the calling thread's OpenMP team (at::get_num_threads() threads,
// chunks of at least grain) like at::parallel_for; serial inside a parallel region.
void omp_parallel_for(int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                      void* ctx);

// Below this many elements in its largest tensor, an ATen op queued on a stream whose results do
// not depend on the thread count (OpInfo::thread_invariant) runs on the executor thread alone
// (SerialScope), by runtime::kMinParallelWork's rule (parallel.h).
constexpr int64_t kSerialElements = runtime::kMinParallelWork;

// For its lifetime, ATen CPU kernels called on this thread run serially: OpenMP's team size for
// this thread (at::parallel_for, oneDNN) and MKL's thread-local count set to 1, both restored
// on exit. A no-op when `serial` is false or inside a parallel region.
class SerialScope {
 public:
  explicit SerialScope(bool serial);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int omp_threads_ = 0;  // 0: nothing to restore
  int mkl_threads_ = 0;
};

// runtime::set_parallel_release's hook: frees the calling thread's OpenMP pool
// (omp_pause_resource_all: libgomp's gomp_pause_host), outside a parallel region.
void omp_release_pool();
// Used by idle executors always, by host threads waiting for a stream only when libgomp's spin is
// bounded (Config::omp_spin_bounded; parallel.h says why).

}  // namespace openneuron::aten
