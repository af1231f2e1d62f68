#include "runtime/parallel.h"

#include <atomic>

namespace openneuron::runtime {
namespace {
std::atomic<ParallelBackend> g_backend{nullptr};
std::atomic<ParallelRelease> g_release{nullptr};
std::atomic<unsigned> g_release_on{0};
}  // namespace

void set_parallel_backend(ParallelBackend backend) {
  g_backend.store(backend, std::memory_order_release);
}

ParallelBackend parallel_backend() { return g_backend.load(std::memory_order_acquire); }

void set_parallel_release(ParallelRelease release, unsigned on) {
  g_release_on.store(on, std::memory_order_relaxed);
  g_release.store(release, std::memory_order_release);
}

void parallel_release_calling_thread(ReleaseOn caller) noexcept {
  ParallelRelease release = g_release.load(std::memory_order_acquire);
  if (release != nullptr && (g_release_on.load(std::memory_order_relaxed) & caller)) release();
}

}  // namespace openneuron::runtime
