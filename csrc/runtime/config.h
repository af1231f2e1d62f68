// The settings module: every environment variable the backend reads, read once per process into
// one Config (config.cpp holds the table of names and meanings). Parsing is separate from reading
// so tests feed strings directly. Not the place for per-op state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/isa.h"

namespace openneuron::runtime {

// What the synchronous CPU fallback does when an op takes it (OPENNEURON_FALLBACK).
enum class FallbackMode : uint8_t { kWarn, kSilent, kError };

struct Config {
  std::vector<int> visible_cores;  // NEURON_RT_VISIBLE_CORES; default {0,1,2,3}
  uint64_t device_memory = 0;      // OPENNEURON_DEVICE_MEMORY per device; default: host RAM / count
  bool launch_blocking = false;    // NEURON_LAUNCH_BLOCKING=1
  std::optional<Isa> isa;          // OPENNEURON_ISA; nullopt = the best this CPU has
  FallbackMode fallback = FallbackMode::kWarn;  // OPENNEURON_FALLBACK=warn|silent|error
  bool native_kernels = true;                   // OPENNEURON_NATIVE_KERNELS=0 turns them off
  bool origin = true;                           // OPENNEURON_ORIGIN=0 turns origin capture off
  // TORCH_NEURONX_ENABLE_CONCATENATION=1 (adaptive eager); off under NEURON_LAUNCH_BLOCKING=1.
  bool fusion = false;
  bool fusion_log = false;         // OPENNEURON_FUSION_LOG=1
  int fusion_max_ops = 0;          // OPENNEURON_FUSION_MAX_OPS; 0 = the recorder's default
  size_t profiler_max_events = 0;  // OPENNEURON_PROFILER_MAX_EVENTS; 0 = the trace default
  std::string oom_snapshot;        // OPENNEURON_OOM_SNAPSHOT: path written on out-of-memory
  std::string host_id;  // OPENNEURON_HOST_ID: ranks with equal ids share memory (default: host)
  int local_rank = -1;  // LOCAL_RANK (torchrun): the process's initial current device; -1 unset
  // torch.compile: TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1 raises a compile failure instead of
  // running the graph eagerly; TORCH_NEURONX_NEFF_CACHE_DIR is the compile cache's folder.
  bool compile_fallback = true;
  std::string compile_cache_dir;
  // OPENNEURON_COMPILE_ASYNC=1: a graph runs eagerly while Inductor compiles it in a background
  // process (openneuron/_inductor/async_compile.py).
  bool compile_async = false;
  // libgomp's GOMP_SPINCOUNT or OMP_WAIT_POLICY set (values are libgomp's to check): its spin is
  // bounded, so a host thread about to wait for a stream may free its OpenMP pool (parallel.h).
  bool omp_spin_bounded = false;
};

// One environment variable: its name and what it does (README lists the same).
struct Setting {
  const char* name;
  const char* meaning;
};
const std::vector<Setting>& settings();
// settings()[i]'s value as this process read it (nullopt: unset), for `openneuron ls`.
const std::vector<std::optional<std::string>>& setting_values();

// name -> value, nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// "0-3", "1", "0,2,5", "0-1,4" -> sorted unique core ids. Throws ConfigError naming the
// variable, the value and the expected form.
std::vector<int> parse_visible_cores(const std::string& value);
// "8GiB", "512MiB", "1.5GB", "1048576" -> bytes (GiB/MiB/KiB binary, GB/MB/KB decimal, also
// "G"/"M"/"K" as binary). Throws ConfigError for anything else, zero, or negative values.
uint64_t parse_memory_size(const std::string& value);
// "1.0 GiB", "512.0 MiB", "100 B": the form used in user-facing messages.
std::string format_bytes(uint64_t bytes);

// Builds a Config from env (host_ram gives the default device memory). Throws ConfigError naming
// the first invalid variable, its value and the accepted form.
Config make_config(const EnvLookup& env, uint64_t host_ram);
// The process configuration, read from the environment on first call. Throws ConfigError.
const Config& config();
// The same without throwing: the defaults when a variable is invalid (config() reports it, and
// no device is usable then). For readers that run before a device exists (static initializers).
const Config& config_or_defaults() noexcept;

}  // namespace openneuron::runtime
