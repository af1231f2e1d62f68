// Devices as the layers above see them: count, properties, the calling thread's current
// device, and device-wide synchronization. Thin over the HAL.
#pragma once

#include "hal.h"

namespace openneuron::runtime {

// Number of NeuronCores; 0 if the configuration is invalid. Must not throw.
int device_count() noexcept;
// Throws DeviceError ("invalid device index 7: neuron has 4 devices (0..3) ...") or ConfigError.
void device_check(DeviceIndex d);
DeviceProps device_props(DeviceIndex d);  // checks d

// The calling thread's current device (default 0). set checks the index.
DeviceIndex device_current();
void device_set_current(DeviceIndex d);

// Blocks until all work on every stream of device d has run. Sync point (throws AsyncError).
void device_synchronize(DeviceIndex d);

}  // namespace openneuron::runtime
