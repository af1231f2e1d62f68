// Runtime configuration read once from the environment. Parsing is separate from reading so
// tests can feed strings directly. Not the place for per-op state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace openneuron::runtime {

struct Config {
  std::vector<int> visible_cores;  // NEURON_RT_VISIBLE_CORES; default {0,1,2,3}
  uint64_t device_memory = 0;      // OPENNEURON_DEVICE_MEMORY per device; default: host RAM / count
  bool launch_blocking = false;    // NEURON_LAUNCH_BLOCKING=1
};

// "0-3", "1", "0,2,5", "0-1,4" -> sorted unique core ids. Throws ConfigError naming the
// variable, the value and the expected form.
std::vector<int> parse_visible_cores(const std::string& value);
// "8GiB", "512MiB", "1.5GB", "1048576" -> bytes (GiB/MiB/KiB binary, GB/MB/KB decimal, also
// "G"/"M"/"K" as binary). Throws ConfigError for anything else, zero, or negative values.
uint64_t parse_memory_size(const std::string& value);
// "1.0 GiB", "512.0 MiB", "100 B": the form used in user-facing messages.
std::string format_bytes(uint64_t bytes);

// Builds a Config from explicit values (nullopt = unset); host_ram is used for the default.
Config make_config(const std::optional<std::string>& visible_cores,
                   const std::optional<std::string>& device_memory,
                   const std::optional<std::string>& launch_blocking, uint64_t host_ram);
// The process configuration, read from the environment on first call. Throws ConfigError.
const Config& config();

}  // namespace openneuron::runtime
