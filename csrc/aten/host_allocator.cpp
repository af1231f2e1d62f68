// The pinned host allocator for neuron (tensor.pin_memory(), non_blocking copies): an
// at::HostAllocator over the runtime's host_alloc, registered for PrivateUse1 and returned by
// the hooks. Caching and stream tracking are the runtime's (csrc/runtime/host_allocator.cpp).
#include "runtime/host_allocator.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstring>

#include "aten/errors.h"
#include "aten/streams.h"

namespace openneuron::aten {
namespace {

void delete_pinned(void* ptr) {
  try {
    runtime::host_free(ptr);
  } catch (...) {
    // NOTE: deleters must not throw; host_free only fails for a foreign pointer.
  }
}

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t bytes) override {
    void* ptr = with_torch_errors([&] { return runtime::host_alloc(bytes); });
    return {ptr, ptr, &delete_pinned, at::Device(at::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_pinned; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    void* block = ctx != nullptr ? ctx : ptr;
    if (block == nullptr || !runtime::host_is_pinned(block)) return false;
    with_torch_errors([&] { runtime::host_record_stream(block, to_runtime(stream)); });
    return true;
  }

  void empty_cache() override {
    with_torch_errors([] { runtime::host_empty_cache(); });
  }

  at::HostStats get_stats() override {
    runtime::HostStats s = with_torch_errors([] { return runtime::host_stats(); });
    at::HostStats out;
    out.active_bytes.current = s.allocated_bytes;
    out.allocated_bytes.current = s.reserved_bytes;
    out.active_requests.current = s.num_allocs - s.num_frees;
    out.allocations.allocated = s.num_allocs;
    out.allocations.freed = s.num_frees;
    out.allocations.current = s.num_allocs - s.num_frees;
    return out;
  }

  // NOTE: the runtime keeps only current values and totals, which are never reset.
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

NeuronHostAllocator g_host_allocator;

}  // namespace

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)

}  // namespace openneuron::aten
