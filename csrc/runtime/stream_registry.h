// Private to csrc/runtime: the per-device table of HAL streams behind Stream handles, for
// device-wide synchronization (device.cpp) without exposing the table in stream.h.
#pragma once

#include "hal.h"

namespace openneuron::runtime {

// Synchronizes every HAL stream created so far on device d (all of them, even if one throws);
// then throws the first AsyncError, if any.
void stream_sync_all(DeviceIndex d);
// Waits until every HAL stream created so far on device d has run its queued work; does not
// raise or clear async errors (the allocator drains before returning memory to the HAL).
void stream_drain_all(DeviceIndex d);

}  // namespace openneuron::runtime
