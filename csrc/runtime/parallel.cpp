#include "runtime/parallel.h"

#include <atomic>

namespace openneuron::runtime {
namespace {
std::atomic<ParallelBackend> g_backend{nullptr};
}  // namespace

void set_parallel_backend(ParallelBackend backend) {
  g_backend.store(backend, std::memory_order_release);
}

ParallelBackend parallel_backend() { return g_backend.load(std::memory_order_acquire); }

}  // namespace openneuron::runtime
