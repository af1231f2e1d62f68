// Intra-op parallelism for torch-free compute (kernel IR interpreter, native kernels). The
// runtime does not own a thread pool: the extension installs ATen's intra-op pool as the
// backend at import (DESIGN §2: one shared pool sized to the host's cores, never a second one).
// Without a backend (plain gtests) loops run serially on the calling thread.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace openneuron::runtime {

// body(ctx, begin, end) processes [begin, end).
using ParallelBody = void (*)(void* ctx, int64_t begin, int64_t end);
// Splits [begin, end) into chunks of at least `grain` and calls body on each, possibly from
// several threads; returns when all are done. Must propagate nothing: bodies do not throw.
using ParallelBackend = void (*)(int64_t begin, int64_t end, int64_t grain, ParallelBody body,
                                 void* ctx);

// nullptr restores the serial default. Set once at start-up, before work runs.
void set_parallel_backend(ParallelBackend backend);
ParallelBackend parallel_backend();

// Frees the calling thread's own share of the backend (its OpenMP thread pool), if any; the
// backend makes a new one when that thread next goes parallel. Called by a host thread about
// to block waiting for a stream (work_queue.cpp). Why: libgomp counts every pool's threads,
// and while they outnumber the cores all of its barriers sleep in the kernel after ~100 spins,
// one wake-up per parallel region (a pool left on the Python thread by CPU work made compiled
// decode 2.5x slower). The extension installs it only when the spin is bounded
// (GOMP_SPINCOUNT / OMP_WAIT_POLICY set): libgomp's default spin without that throttle made
// a 2-core training step 15x slower when the Python thread took a core from a spinning team.
using ParallelRelease = void (*)();
void set_parallel_release(ParallelRelease release);  // nullptr: nothing to free
void parallel_release_calling_thread() noexcept;

// Runs f(begin, end) over chunks of [begin, end). f must not throw.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (begin >= end) return;
  ParallelBackend backend = parallel_backend();
  if (backend == nullptr || end - begin <= grain) {
    f(begin, end);
    return;
  }
  backend(
      begin, end, grain,
      [](void* ctx, int64_t b, int64_t e) {
        (*static_cast<std::remove_reference_t<F>*>(ctx))(b, e);
      },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace openneuron::runtime
