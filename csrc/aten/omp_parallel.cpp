// runtime::parallel_for's backend: ATen's OpenMP intra-op pool, entered directly.
// NOTE: at::parallel_for is header-only for the OpenMP backend and parallelizes only in
// translation units compiled with -fopenmp (ATen/ParallelOpenMP.h: INTRA_OP_PARALLEL needs
// _OPENMP). The extension is not (and must not link a second libgomp), so at::parallel_for
// called from here ran every fused kernel / IR loop on the executor thread alone. This calls
// the entry point `#pragma omp parallel` compiles to (GOMP_parallel, from the libgomp torch
// loads) with the same chunking as ATen's invoke_parallel.
#include "aten/omp_parallel.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>
#include <dlfcn.h>

#include <algorithm>

extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_num_threads();
int omp_get_thread_num();
int omp_in_parallel();
int omp_get_max_threads();
void omp_set_num_threads(int n);
#if AT_MKL_ENABLED()
int MKL_Set_Num_Threads_Local(int n);  // MKL's own thread-local count; returns the previous
#endif
}

namespace openneuron::aten {
namespace {

struct Job {
  int64_t begin, end, grain;
  runtime::ParallelBody body;
  void* ctx;
};

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

void run_team_member(void* p) {
  const Job& j = *static_cast<const Job*>(p);
  int64_t n = j.end - j.begin;
  int64_t nt = omp_get_num_threads();
  if (j.grain > 0) nt = std::min(nt, div_up(n, j.grain));
  int64_t tid = omp_get_thread_num();
  int64_t chunk = div_up(n, nt);
  int64_t b = j.begin + tid * chunk;
  if (tid >= nt || b >= j.end) return;
  c10::ParallelGuard guard(true);  // as at::parallel_for: nested ATen loops run serially
  j.body(j.ctx, b, std::min(j.end, b + chunk));
}

// omp_pause_resource_all (OpenMP 5.0) of the libgomp torch loaded, looked up there: an older
// libgomp without it leaves release as a no-op instead of failing the import.
using PauseAll = int (*)(int kind);
PauseAll find_pause_all() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&omp_in_parallel), &info) == 0 || !info.dli_fname) {
    return nullptr;
  }
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto* fn = reinterpret_cast<PauseAll>(dlsym(lib, "omp_pause_resource_all"));
  dlclose(lib);  // NOTE: RTLD_NOLOAD took a reference; torch's own keeps the library loaded
  return fn;
}

}  // namespace

void omp_release_pool() {
  static const PauseAll pause_all = find_pause_all();
  constexpr int kPauseSoft = 1;  // omp_pause_soft
  // libgomp frees the calling thread's pool (gomp_pause_host); never inside a region
  if (pause_all != nullptr && !omp_in_parallel()) pause_all(kPauseSoft);
}

SerialScope::SerialScope(bool serial) {
  if (!serial || omp_in_parallel()) return;
  omp_threads_ = omp_get_max_threads();
  if (omp_threads_ <= 1) {
    omp_threads_ = 0;
    return;
  }
  omp_set_num_threads(1);
#if AT_MKL_ENABLED()
  mkl_threads_ = MKL_Set_Num_Threads_Local(1);
#endif
}

SerialScope::~SerialScope() {
  if (omp_threads_ == 0) return;
  omp_set_num_threads(omp_threads_);
#if AT_MKL_ENABLED()
  MKL_Set_Num_Threads_Local(mkl_threads_);  // 0: back to MKL's process-wide count
#endif
}

void omp_parallel_for(int64_t begin, int64_t end, int64_t grain, runtime::ParallelBody body,
                      void* ctx) {
  if (begin >= end) return;
  if (end - begin <= std::max<int64_t>(grain, 1) || omp_in_parallel() || at::in_parallel_region() ||
      at::get_num_threads() <= 1) {
    c10::ParallelGuard guard(true);
    body(ctx, begin, end);
    return;
  }
  Job j{begin, end, grain, body, ctx};
  GOMP_parallel(&run_team_member, &j, 0, 0);  // 0: the thread's OpenMP team size
}

}  // namespace openneuron::aten
