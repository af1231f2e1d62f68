// The PrivateUse1 hooks: what ATen asks of a backend outside op dispatch (lazy init, device
// count and current device, generators, pinned memory, pointer -> device, storage resize for
// FSDP2). Thin: each hook forwards to the runtime or to a neighbour in csrc/aten.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "aten/allocator.h"
#include "aten/device.h"
#include "aten/errors.h"
#include "aten/generator.h"
#include "aten/streams.h"
#include "runtime/caching_allocator.h"
#include "runtime/device.h"
#include "runtime/host_allocator.h"

namespace openneuron::aten {
namespace {

class NeuronHooks final : public at::PrivateUse1HooksInterface {
 public:
  void init() const override { runtime_init(); }

  bool isBuilt() const override { return true; }

  bool isAvailable() const override { return runtime::device_count() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex) const override { return runtime_initialized(); }

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(runtime::device_count());
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    with_torch_errors([&] { runtime::device_set_current(device); });
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(runtime::device_current());
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex previous = getCurrentDevice();
    if (device >= 0 && device != previous) setCurrentDevice(device);
    return previous;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }

  // NOTE: an index past the device count is refused, as torch.Generator(device="cuda:9") is.
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return at::make_generator<NeuronGenerator>(with_torch_errors([&] {
      c10::DeviceIndex idx = resolve_device(device);
      runtime::device_check(idx);
      return idx;
    }));
  }

  at::Device getDeviceFromPtr(void* data) const override {
    int device = runtime::allocator_device_of(data);
    TORCH_CHECK(device >= 0, "pointer ", data,
                " was not allocated by the neuron allocator; cannot tell its device.");
    return neuron_device(device);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return at::getHostAllocator(at::kPrivateUse1);
  }

  bool isPinnedPtr(const void* data) const override {
    try {
      return runtime::host_is_pinned(data);
    } catch (...) {
      return false;
    }
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    storage_resize_bytes(storage, new_bytes);
  }
};

const bool g_hooks_registered [[maybe_unused]] = [] {
  at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
  return true;
}();

}  // namespace
}  // namespace openneuron::aten
