// Conversions between c10 streams/devices and runtime streams, shared by the guard, the
// allocator, the copies and the bindings. A c10::Stream id is the runtime Stream id (1:1);
// device index -1 means the calling thread's current device. Bindings live in streams.cpp.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace openneuron::aten {

// -1 -> the current device; anything else unchanged (checked by the runtime where used).
inline c10::DeviceIndex resolve_device(c10::DeviceIndex d) {
  return d < 0 ? static_cast<c10::DeviceIndex>(runtime::device_current()) : d;
}

inline c10::Device neuron_device(int d) {
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d));
}

inline c10::Stream to_c10(const runtime::Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE, neuron_device(s.device()), s.id());
}

// Throws runtime::DeviceError for an id that names no stream (callers translate errors).
inline runtime::Stream to_runtime(const c10::Stream& s) {
  return runtime::stream_from_id(resolve_device(s.device_index()), s.id());
}

// The calling thread's current stream on device d (-1: current device).
inline runtime::Stream current_runtime_stream(c10::DeviceIndex d) {
  return runtime::stream_current(resolve_device(d));
}

}  // namespace openneuron::aten
