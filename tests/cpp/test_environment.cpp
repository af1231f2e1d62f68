// Fixes the environment the process-wide HAL reads on first use, before gtest's main runs:
// two devices of 1 GiB each, so device-index and out-of-memory tests are deterministic.
#include <cstdlib>

namespace {

const bool kEnvironmentSet = [] {
  setenv("NEURON_RT_VISIBLE_CORES", "0-1", 1);
  setenv("OPENNEURON_DEVICE_MEMORY", "1GiB", 1);
  unsetenv("NEURON_LAUNCH_BLOCKING");
  return true;
}();

}  // namespace
