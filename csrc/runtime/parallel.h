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
// backend makes a new one when that thread next goes parallel. Why: libgomp counts every pool's
// threads, and while they outnumber the cores all of its barriers sleep in the kernel after
// ~100 spins, one wake-up per parallel region. Called by
// - an executor idle for kExecutorIdleRelease (work_queue.cpp): its pool would otherwise keep
//   the host's own CPU work throttled after the device went quiet (CPU-eager decoding after
//   neuron work took 5.4 ms a token against 1.65 ms);
// - a host thread about to block waiting for a stream, only when libgomp's spin is bounded
//   (GOMP_SPINCOUNT / OMP_WAIT_POLICY set): a pool left on the Python thread by CPU work made
//   compiled decode 2.5x slower, but without that bound libgomp's default spin made a 2-core
//   training step 15x slower when the Python thread took a core from a spinning team.
// - a host thread about to block waiting for a stream whose previous block lasted longer than
//   kLongHostBlockNs (by default): a training step's host blocks for tens of ms while the
//   device runs large matrix products, which ran 4-20% slower than CPU's with every region
//   waking a throttled team; freed there, the executor's team spins (GPT step of
//   bench-compile's shape: 64.6 -> 56.2 ms, Inductor on CPU 60.5). Token-by-token decoding
//   blocks ~1 ms per token and keeps its pool, so the spinning team never takes the core its
//   busy host needs (freeing at every block made eager decode 624 -> 373 tokens/s; with this
//   rule 665).
using ParallelRelease = void (*)();
enum ReleaseOn : unsigned {
  kReleaseOnIdleExecutor = 1,
  kReleaseOnHostWait = 2,
  kReleaseOnLongHostWait = 4
};
constexpr int64_t kLongHostBlockNs = 5'000'000;
// `on`: a mask of ReleaseOn, the callers that release; nullptr: nothing to free.
void set_parallel_release(ParallelRelease release, unsigned on);
void parallel_release_calling_thread(ReleaseOn caller) noexcept;

// The least work worth a parallel region, in elements of an elementwise op (a multiply-add of a
// matrix product counts kMultiplyAddsPerElement times less). Entering an OpenMP region costs
// ~5 us when libgomp's team spins and up to ~60 us when it is throttled (more OpenMP threads
// than cores, the usual state next to a Python thread: the region wakes its team with a futex;
// measured on the project machine, 2 cores in a VM), while work of this size takes ~10-30 us
// on one core: token-by-token decoding is made of such ops (its eager steps took 1.61 ms a
// token with regions, 1.29 ms without). The ATen ops a stream runs (csrc/aten/omp_parallel.h)
// and the neuron kernels Inductor generates (openneuron/_inductor/codegen.py) follow the rule.
constexpr int64_t kMinParallelWork = int64_t{1} << 16;
constexpr int64_t kMultiplyAddsPerElement = 16;

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

// As parallel_for, on the calling thread alone when the whole loop's `work` (elements, as
// kMinParallelWork counts them) is too small to be worth a parallel region.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, int64_t work, F&& f) {
  if (work < kMinParallelWork) {
    if (begin < end) f(begin, end);
    return;
  }
  parallel_for(begin, end, grain, std::forward<F>(f));
}

}  // namespace openneuron::runtime
