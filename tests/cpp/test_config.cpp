// gtests for config.cpp, the settings module: parsing of every environment variable, their error
// messages, defaults, and format_bytes.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "runtime/config.h"
#include "runtime/errors.h"

namespace openneuron::runtime {
namespace {

using Env = std::map<std::string, std::string>;

Config make(const Env& env, uint64_t host_ram = uint64_t{16} << 30) {
  return make_config(
      [&](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      host_ram);
}

Env cores_memory(const std::optional<std::string>& cores,
                 const std::optional<std::string>& memory) {
  Env env;
  if (cores) env["NEURON_RT_VISIBLE_CORES"] = *cores;
  if (memory) env["OPENNEURON_DEVICE_MEMORY"] = *memory;
  return env;
}

std::string config_error(const Env& env) {
  try {
    make(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, VisibleCoresForms) {
  EXPECT_EQ(parse_visible_cores("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse_visible_cores("1"), (std::vector<int>{1}));
  EXPECT_EQ(parse_visible_cores("0,2,5"), (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(parse_visible_cores("0-1,4"), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(parse_visible_cores(" 5, 1-2 ,1"), (std::vector<int>{1, 2, 5}));
}

TEST(Config, VisibleCoresErrorsNameVariableValueAndForm) {
  for (const char* bad : {"", "abc", "3-1", "1,,2", "-1", "0-", "1.5", "0-99999"}) {
    const std::string msg = config_error(cores_memory(std::string(bad), std::nullopt));
    EXPECT_NE(msg.find("NEURON_RT_VISIBLE_CORES"), std::string::npos) << bad;
    EXPECT_NE(msg.find("\"" + std::string(bad) + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("e.g. \"0-3\""), std::string::npos) << msg;
  }
}

TEST(Config, MemorySizes) {
  EXPECT_EQ(parse_memory_size("8GiB"), uint64_t{8} << 30);
  EXPECT_EQ(parse_memory_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5GB"), uint64_t{1500000000});
  EXPECT_EQ(parse_memory_size("1048576"), uint64_t{1048576});
  EXPECT_EQ(parse_memory_size("2G"), uint64_t{2} << 30);
  EXPECT_EQ(parse_memory_size("64 KiB"), uint64_t{64} << 10);
  EXPECT_EQ(parse_memory_size("100MB"), uint64_t{100000000});
}

TEST(Config, MemoryErrors) {
  for (const char* bad : {"", "abc", "0", "-1GiB", "8XB", "1.2.3G", "0.1B", "GiB"}) {
    const std::string msg = config_error(cores_memory(std::nullopt, std::string(bad)));
    EXPECT_NE(msg.find("OPENNEURON_DEVICE_MEMORY=\"" + std::string(bad) + "\""), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("e.g. \"8GiB\""), std::string::npos) << msg;
  }
}

TEST(Config, Defaults) {
  const Config c = make({});
  EXPECT_EQ(c.visible_cores, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(c.device_memory, uint64_t{4} << 30);
  EXPECT_FALSE(c.launch_blocking);
  const Config two =
      make({{"NEURON_RT_VISIBLE_CORES", "0,7"}, {"NEURON_LAUNCH_BLOCKING", "1"}}, 1000);
  EXPECT_EQ(two.visible_cores.size(), 2u);
  EXPECT_EQ(two.device_memory * 2, 1000u);
  EXPECT_TRUE(two.launch_blocking);
}

TEST(Config, LaunchBlockingValues) {
  EXPECT_FALSE(make({{"NEURON_LAUNCH_BLOCKING", "0"}}).launch_blocking);
  EXPECT_TRUE(make({{"NEURON_LAUNCH_BLOCKING", "1"}}).launch_blocking);
  EXPECT_NE(
      config_error({{"NEURON_LAUNCH_BLOCKING", "maybe"}}).find("NEURON_LAUNCH_BLOCKING=\"maybe\""),
      std::string::npos);
}

TEST(Config, EverySettingParsed) {
  const Config d = make({});
  EXPECT_EQ(d.fallback, FallbackMode::kWarn);
  EXPECT_TRUE(d.native_kernels);
  EXPECT_TRUE(d.origin);
  EXPECT_FALSE(d.fusion);
  EXPECT_FALSE(d.isa.has_value());
  EXPECT_TRUE(d.compile_fallback);
  EXPECT_FALSE(d.compile_async);
  EXPECT_FALSE(d.omp_spin_bounded);
  const Config c = make({{"OPENNEURON_FALLBACK", "Error"},
                         {"OPENNEURON_NATIVE_KERNELS", "off"},
                         {"OPENNEURON_ORIGIN", "0"},
                         {"TORCH_NEURONX_ENABLE_CONCATENATION", "1"},
                         {"OPENNEURON_FUSION_LOG", "1"},
                         {"OPENNEURON_FUSION_MAX_OPS", "64"},
                         {"OPENNEURON_PROFILER_MAX_EVENTS", "1000"},
                         {"OPENNEURON_OOM_SNAPSHOT", "/tmp/snap.pickle"},
                         {"OPENNEURON_ISA", "baseline"},
                         {"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1"},
                         {"TORCH_NEURONX_NEFF_CACHE_DIR", " /tmp/cc "},
                         {"OPENNEURON_COMPILE_ASYNC", "1"}});
  EXPECT_EQ(c.fallback, FallbackMode::kError);
  EXPECT_FALSE(c.native_kernels);
  EXPECT_FALSE(c.origin);
  EXPECT_TRUE(c.fusion);
  EXPECT_TRUE(c.fusion_log);
  EXPECT_EQ(c.fusion_max_ops, 64);
  EXPECT_EQ(c.profiler_max_events, 1000u);
  EXPECT_EQ(c.oom_snapshot, "/tmp/snap.pickle");
  EXPECT_EQ(c.isa, Isa::kBaseline);
  EXPECT_FALSE(c.compile_fallback);
  EXPECT_EQ(c.compile_cache_dir, "/tmp/cc");
  EXPECT_TRUE(c.compile_async);
  EXPECT_TRUE(make({{"GOMP_SPINCOUNT", "10000"}}).omp_spin_bounded);
  EXPECT_TRUE(make({{"OMP_WAIT_POLICY", "passive"}}).omp_spin_bounded);
  // Launch blocking (debugging) wins over the fusion switch.
  EXPECT_FALSE(
      make({{"TORCH_NEURONX_ENABLE_CONCATENATION", "1"}, {"NEURON_LAUNCH_BLOCKING", "1"}}).fusion);
}

TEST(Config, BadSettingsNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"OPENNEURON_FALLBACK", "loud"},
      {"OPENNEURON_NATIVE_KERNELS", "maybe"},
      {"OPENNEURON_ORIGIN", "2"},
      {"TORCH_NEURONX_ENABLE_CONCATENATION", "yes please"},
      {"OPENNEURON_FUSION_MAX_OPS", "-3"},
      {"OPENNEURON_FUSION_MAX_OPS", "0"},
      {"OPENNEURON_PROFILER_MAX_EVENTS", "1e6"},
      {"OPENNEURON_ISA", "avx1024"},
      {"OPENNEURON_COMPILE_ASYNC", "later"},
  };
  for (const auto& [name, value] : bad) {
    const std::string msg = config_error({{name, value}});
    EXPECT_NE(msg.find(std::string(name) + "=\"" + value + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  }
}

TEST(Config, SettingsTableListsEveryVariable) {
  std::map<std::string, int> seen;
  for (const Setting& s : settings()) ++seen[s.name];
  for (const char* name :
       {"NEURON_RT_VISIBLE_CORES", "OPENNEURON_DEVICE_MEMORY", "NEURON_LAUNCH_BLOCKING",
        "OPENNEURON_ISA", "OPENNEURON_FALLBACK", "OPENNEURON_NATIVE_KERNELS", "OPENNEURON_ORIGIN",
        "TORCH_NEURONX_ENABLE_CONCATENATION", "OPENNEURON_FUSION_LOG", "OPENNEURON_FUSION_MAX_OPS",
        "OPENNEURON_PROFILER_MAX_EVENTS", "OPENNEURON_OOM_SNAPSHOT",
        "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "TORCH_NEURONX_NEFF_CACHE_DIR",
        "OPENNEURON_COMPILE_ASYNC", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"})
    EXPECT_EQ(seen[name], 1) << name;
}

TEST(Config, FormatBytes) {
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(uint64_t{1} << 30), "1.0 GiB");
  EXPECT_EQ(format_bytes(uint64_t{512} << 20), "512.0 MiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(uint64_t{8} << 30), "8.0 GiB");
}

}  // namespace
}  // namespace openneuron::runtime
