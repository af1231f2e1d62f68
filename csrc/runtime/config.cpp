// Parsing of the runtime's environment variables (NEURON_RT_VISIBLE_CORES,
// OPENNEURON_DEVICE_MEMORY, NEURON_LAUNCH_BLOCKING; OPENNEURON_ISA is validated here, see isa.h)
// into a Config, and the byte formatting used in user-facing messages. Reads the environment once;
// holds no other state.
#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "errors.h"
#include "isa.h"

namespace openneuron::runtime {
namespace {

constexpr int kMaxCoreId = 4095;

const char* const kCoresForm =
    "expected core ids or ranges separated by commas, e.g. \"0-3\", \"1\", \"0,2,5\" or "
    "\"0-1,4\"";
const char* const kMemoryForm =
    "expected a positive size in bytes with an optional unit: KiB, MiB, GiB, TiB (binary), KB, "
    "MB, GB, TB (decimal) or K, M, G, T (binary), e.g. \"8GiB\", \"512MiB\", \"1.5GB\" or "
    "\"1048576\"";

[[noreturn]] void bad_value(const char* var, const std::string& value, const std::string& why,
                            const char* form) {
  throw ConfigError(std::string(var) + "=\"" + value + "\" is invalid: " + why + "; " + form + ".");
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// A core id: decimal digits only, at most kMaxCoreId.
int parse_core_id(const std::string& token, const std::string& value) {
  const std::string t = trim(token);
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    bad_value("NEURON_RT_VISIBLE_CORES", value, "\"" + t + "\" is not a core id", kCoresForm);
  }
  if (t.size() > 5 || std::stoi(t) > kMaxCoreId) {
    bad_value("NEURON_RT_VISIBLE_CORES", value,
              "core id " + t + " exceeds " + std::to_string(kMaxCoreId), kCoresForm);
  }
  return std::stoi(t);
}

bool iequals(const std::string& a, const char* b) {
  size_t n = 0;
  for (; b[n]; ++n) {
    if (n >= a.size() || std::tolower(static_cast<unsigned char>(a[n])) != b[n]) return false;
  }
  return n == a.size();
}

// Unit suffix -> multiplier; 0 if unknown. Case-insensitive except that "b" alone is bytes.
double unit_multiplier(const std::string& unit) {
  struct Unit {
    const char* name;
    double mult;
  };
  static const Unit kUnits[] = {
      {"", 1.0},
      {"b", 1.0},
      {"k", 1024.0},
      {"kib", 1024.0},
      {"kb", 1e3},
      {"m", 1048576.0},
      {"mib", 1048576.0},
      {"mb", 1e6},
      {"g", 1073741824.0},
      {"gib", 1073741824.0},
      {"gb", 1e9},
      {"t", 1099511627776.0},
      {"tib", 1099511627776.0},
      {"tb", 1e12},
  };
  for (const Unit& u : kUnits) {
    if (iequals(unit, u.name)) return u.mult;
  }
  return 0.0;
}

bool parse_flag(const std::string& value) {
  const std::string v = trim(value);
  if (v.empty() || v == "0" || iequals(v, "false") || iequals(v, "no") || iequals(v, "off")) {
    return false;
  }
  if (v == "1" || iequals(v, "true") || iequals(v, "yes") || iequals(v, "on")) return true;
  throw ConfigError("NEURON_LAUNCH_BLOCKING=\"" + value +
                    "\" is invalid: expected 1 (run every op synchronously) or 0, e.g. "
                    "NEURON_LAUNCH_BLOCKING=1.");
}

// Physical memory, or the container's cgroup v2 limit when that is lower.
uint64_t host_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  uint64_t ram = (pages <= 0 || page_size <= 0)
                     ? uint64_t{8} << 30
                     : static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    unsigned long long limit = 0;
    if (std::fscanf(f, "%llu", &limit) == 1 && limit > 0 && limit < ram) ram = limit;
    std::fclose(f);
  }
  return ram;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

std::vector<int> parse_visible_cores(const std::string& value) {
  std::vector<int> cores;
  if (trim(value).empty()) {
    bad_value("NEURON_RT_VISIBLE_CORES", value, "it is empty", kCoresForm);
  }
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      cores.push_back(parse_core_id(item, value));
    } else {
      const int lo = parse_core_id(item.substr(0, dash), value);
      const int hi = parse_core_id(item.substr(dash + 1), value);
      if (lo > hi) {
        bad_value("NEURON_RT_VISIBLE_CORES", value,
                  "range \"" + trim(item) + "\" ends before it starts", kCoresForm);
      }
      for (int c = lo; c <= hi; ++c) cores.push_back(c);
    }
    start = comma + 1;
  }
  std::sort(cores.begin(), cores.end());
  cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
  return cores;
}

uint64_t parse_memory_size(const std::string& value) {
  const char* var = "OPENNEURON_DEVICE_MEMORY";
  const std::string v = trim(value);
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  const std::string number = v.substr(0, i);
  const std::string unit = trim(v.substr(i));
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") {
    bad_value(var, value, "it does not start with a number", kMemoryForm);
  }
  const double mult = unit_multiplier(unit);
  if (mult == 0.0) bad_value(var, value, "unknown unit \"" + unit + "\"", kMemoryForm);
  const double bytes = std::strtod(number.c_str(), nullptr) * mult;
  if (!(bytes >= 1.0)) bad_value(var, value, "the size must be at least 1 byte", kMemoryForm);
  if (bytes >= 9.0e18) bad_value(var, value, "the size is too large", kMemoryForm);
  return static_cast<uint64_t>(std::floor(bytes));
}

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

Config make_config(const std::optional<std::string>& visible_cores,
                   const std::optional<std::string>& device_memory,
                   const std::optional<std::string>& launch_blocking, uint64_t host_ram) {
  Config c;
  c.visible_cores =
      visible_cores ? parse_visible_cores(*visible_cores) : std::vector<int>{0, 1, 2, 3};
  if (device_memory) {
    c.device_memory = parse_memory_size(*device_memory);
  } else {
    c.device_memory = std::max<uint64_t>(host_ram / c.visible_cores.size(), 1);
  }
  c.launch_blocking = launch_blocking ? parse_flag(*launch_blocking) : false;
  return c;
}

const Config& config() {
  struct Loaded {
    Config config;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    try {
      l.config = make_config(env("NEURON_RT_VISIBLE_CORES"), env("OPENNEURON_DEVICE_MEMORY"),
                             env("NEURON_LAUNCH_BLOCKING"), host_ram_bytes());
      if (auto v = env("OPENNEURON_ISA")) parse_isa(*v);  // a value the CPU lacks is an error
    } catch (const ConfigError& e) {
      l.error = e.what();
    }
    return l;
  }();
  if (!loaded.error.empty()) throw ConfigError(loaded.error);
  return loaded.config;
}

}  // namespace openneuron::runtime
