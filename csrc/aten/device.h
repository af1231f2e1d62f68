// Lazy initialization of the neuron runtime, shared by the hooks (hooks.cpp), the bindings
// (device.cpp) and module init. Not the device guard (guard.cpp).
#pragma once

namespace openneuron::aten {

// Creates the devices, validating the configuration; throws a RuntimeError naming the bad
// environment variable. Idempotent and thread-safe.
void runtime_init();
// True once runtime_init has succeeded.
bool runtime_initialized();

}  // namespace openneuron::aten
