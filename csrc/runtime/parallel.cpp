#include "runtime/parallel.h"

#include <atomic>

namespace openneuron::runtime {
namespace {
std::atomic<ParallelBackend> g_backend{nullptr};
std::atomic<ParallelRelease> g_release{nullptr};
}  // namespace

void set_parallel_backend(ParallelBackend backend) {
  g_backend.store(backend, std::memory_order_release);
}

ParallelBackend parallel_backend() { return g_backend.load(std::memory_order_acquire); }

void set_parallel_release(ParallelRelease release) {
  g_release.store(release, std::memory_order_release);
}

void parallel_release_calling_thread() noexcept {
  if (ParallelRelease release = g_release.load(std::memory_order_acquire)) release();
}

}  // namespace openneuron::runtime
