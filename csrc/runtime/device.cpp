// Devices as the layers above see them: count, index checks with a message a user can act on,
// the calling thread's current device, and device-wide synchronization. Thin over hal().
#include "device.h"

#include <string>

#include "config.h"
#include "errors.h"
#include "stream_registry.h"

namespace openneuron::runtime {
namespace {

// -1 until the thread first asks: then the process's initial device (initial_device()).
thread_local DeviceIndex tl_current_device = -1;

// neuron:LOCAL_RANK under torchrun (each rank on its own device, as TorchNeuron's one core per
// process), when that device exists; else neuron:0.
DeviceIndex initial_device() {
  static const DeviceIndex d = [] {
    const int r = config_or_defaults().local_rank;
    return r >= 0 && r < device_count() ? static_cast<DeviceIndex>(r) : DeviceIndex{0};
  }();
  return d;
}

}  // namespace

int device_count() noexcept {
  static const int count = [] {
    try {
      return hal().device_count();
    } catch (...) {
      return 0;
    }
  }();
  return count;
}

void device_check(DeviceIndex d) {
  const int n = device_count();
  if (n == 0) config();  // throws the ConfigError that left no devices
  if (d >= 0 && d < n) return;
  const std::string range =
      n == 1 ? "1 device (neuron:0)"
             : std::to_string(n) + " devices (neuron:0..neuron:" + std::to_string(n - 1) + ")";
  throw DeviceError("invalid device index " + std::to_string(d) + ": neuron has " + range +
                    "; check the index or NEURON_RT_VISIBLE_CORES");
}

DeviceProps device_props(DeviceIndex d) {
  device_check(d);
  return hal().device_props(d);
}

DeviceIndex device_current() {
  if (tl_current_device < 0) tl_current_device = initial_device();
  return tl_current_device;
}

void device_set_current(DeviceIndex d) {
  device_check(d);
  tl_current_device = d;
}

void device_synchronize(DeviceIndex d) {
  device_check(d);
  stream_sync_all(d);
}

}  // namespace openneuron::runtime
