// gtests for config.cpp: parsing of NEURON_RT_VISIBLE_CORES, OPENNEURON_DEVICE_MEMORY and
// NEURON_LAUNCH_BLOCKING, their error messages, defaults, and format_bytes.
#include <gtest/gtest.h>

#include <string>

#include "runtime/config.h"
#include "runtime/errors.h"

namespace openneuron::runtime {
namespace {

std::string config_error(const std::optional<std::string>& cores,
                         const std::optional<std::string>& memory,
                         const std::optional<std::string>& blocking = std::nullopt) {
  try {
    make_config(cores, memory, blocking, uint64_t{16} << 30);
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
    const std::string msg = config_error(std::string(bad), std::nullopt);
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
    const std::string msg = config_error(std::nullopt, std::string(bad));
    EXPECT_NE(msg.find("OPENNEURON_DEVICE_MEMORY=\"" + std::string(bad) + "\""), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("e.g. \"8GiB\""), std::string::npos) << msg;
  }
}

TEST(Config, Defaults) {
  const Config c = make_config(std::nullopt, std::nullopt, std::nullopt, uint64_t{16} << 30);
  EXPECT_EQ(c.visible_cores, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(c.device_memory, uint64_t{4} << 30);
  EXPECT_FALSE(c.launch_blocking);
  const Config two = make_config(std::string("0,7"), std::nullopt, std::string("1"), 1000);
  EXPECT_EQ(two.visible_cores.size(), 2u);
  EXPECT_EQ(two.device_memory * 2, 1000u);
  EXPECT_TRUE(two.launch_blocking);
}

TEST(Config, LaunchBlockingValues) {
  EXPECT_FALSE(make_config(std::nullopt, std::nullopt, std::string("0"), 1 << 30).launch_blocking);
  EXPECT_TRUE(make_config(std::nullopt, std::nullopt, std::string("1"), 1 << 30).launch_blocking);
  EXPECT_NE(config_error(std::nullopt, std::nullopt, std::string("maybe"))
                .find("NEURON_LAUNCH_BLOCKING=\"maybe\""),
            std::string::npos);
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
