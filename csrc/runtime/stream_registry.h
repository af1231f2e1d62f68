// Private to csrc/runtime: the per-device table of HAL streams behind Stream handles, for
// device-wide synchronization (device.cpp) without exposing the table in stream.h.
#pragma once

#include "hal.h"

namespace openneuron::runtime {

// Synchronizes every HAL stream created so far on device d (all of them, even if one throws);
// then throws the first AsyncError, if any.
void stream_sync_all(DeviceIndex d);

}  // namespace openneuron::runtime
