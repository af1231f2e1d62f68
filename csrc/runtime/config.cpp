// The settings module: the table of every environment variable, their parsing into a Config
// (OPENNEURON_ISA's too, see isa.h), and the byte formatting used in user-facing messages. Reads
// the environment once; holds no other state.
#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// 1/0, true/false, yes/no, on/off (any case); empty is "unset" (def).
bool parse_flag(const char* var, const std::string& value, bool def) {
  const std::string v = trim(value);
  if (v.empty()) return def;
  if (v == "0" || iequals(v, "false") || iequals(v, "no") || iequals(v, "off")) return false;
  if (v == "1" || iequals(v, "true") || iequals(v, "yes") || iequals(v, "on")) return true;
  bad_value(var, value, "it is not a switch", "expected 1 or 0 (also true/false, on/off, yes/no)");
}

// A positive decimal integer at most max; empty is "unset" (0).
int64_t parse_count(const char* var, const std::string& value, int64_t max) {
  const std::string v = trim(value);
  if (v.empty()) return 0;
  const char* form = "expected a positive whole number, e.g. 1000";
  if (!std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
    bad_value(var, value, "it is not a whole number", form);
  if (v.size() > 15 || std::stoll(v) > max)
    bad_value(var, value, "it exceeds " + std::to_string(max), form);
  if (std::stoll(v) == 0) bad_value(var, value, "it is zero", form);
  return std::stoll(v);
}

FallbackMode parse_fallback(const std::string& value) {
  const std::string v = trim(value);
  if (v.empty() || iequals(v, "warn")) return FallbackMode::kWarn;
  if (iequals(v, "silent")) return FallbackMode::kSilent;
  if (iequals(v, "error")) return FallbackMode::kError;
  bad_value("OPENNEURON_FALLBACK", value, "unknown mode",
            "expected warn (the default: warn once per op), silent or error");
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

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

struct Loaded {
  Config config;
  std::string error;
  std::vector<std::optional<std::string>> values;  // parallel to settings()
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    for (const Setting& s : settings()) r.values.push_back(process_env(s.name));
    // NOTE: make_config reads the values just read, so a variable outside the table reads unset.
    const EnvLookup read = [&r](const char* name) -> std::optional<std::string> {
      for (size_t i = 0; i < settings().size(); ++i)
        if (std::strcmp(settings()[i].name, name) == 0) return r.values[i];
      return std::nullopt;
    };
    try {
      r.config = make_config(read, host_ram_bytes());
    } catch (const ConfigError& e) {
      r.error = e.what();
      r.config =
          make_config([](const char*) { return std::optional<std::string>(); }, host_ram_bytes());
    }
    return r;
  }();
  return l;
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> kSettings = {
      {"NEURON_RT_VISIBLE_CORES", "which NeuronCores this process sees, e.g. 0-3 (default 0-3)"},
      {"OPENNEURON_DEVICE_MEMORY", "memory per device, e.g. 8GiB (default: host RAM / devices)"},
      {"NEURON_LAUNCH_BLOCKING", "1: every op runs as it is issued (debugging; fusion off)"},
      {"OPENNEURON_ISA", "baseline|avx2|avx512: the SIMD variant of our kernels (default: best)"},
      {"OPENNEURON_FALLBACK", "warn|silent|error: what the synchronous CPU fallback does"},
      {"OPENNEURON_NATIVE_KERNELS", "0: ATen's CPU kernels instead of the native ones"},
      {"OPENNEURON_ORIGIN", "0: no Python line in asynchronous error reports"},
      {"TORCH_NEURONX_ENABLE_CONCATENATION", "1: adaptive eager (fuses pointwise/reductions)"},
      {"OPENNEURON_FUSION_LOG", "1: log each fused kernel's IR to stderr"},
      {"OPENNEURON_FUSION_MAX_OPS", "most ops in one fused group"},
      {"OPENNEURON_PROFILER_MAX_EVENTS", "device trace ring-buffer size in events"},
      {"OPENNEURON_OOM_SNAPSHOT", "path: write a memory snapshot on out-of-memory"},
      {"OPENNEURON_HOST_ID", "ranks with the same id share memory (default: hostname + boot id)"},
      {"LOCAL_RANK", "set by torchrun: the current device starts as neuron:LOCAL_RANK"},
      {"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",
       "1: torch.compile raises when a graph fails to compile (default: runs it eagerly)"},
      {"TORCH_NEURONX_NEFF_CACHE_DIR",
       "folder of torch.compile's caches (TORCHINDUCTOR_CACHE_DIR)"},
      {"OPENNEURON_COMPILE_ASYNC",
       "1: a graph runs eagerly while Inductor compiles it in a background process"},
      {"GOMP_SPINCOUNT",
       "libgomp's; set (bounded spin): a thread waiting for the device frees its OpenMP pool"},
      {"OMP_WAIT_POLICY", "libgomp's; set: as GOMP_SPINCOUNT"},
  };
  return kSettings;
}

Isa parse_isa(const std::string& value) {
  const std::string v = trim(value);
  Isa want;
  if (v.empty() || iequals(v, "default") || iequals(v, "auto")) {
    return host_isa();
  } else if (iequals(v, "baseline")) {
    want = Isa::kBaseline;
  } else if (iequals(v, "avx2")) {
    want = Isa::kAvx2;
  } else if (iequals(v, "avx512")) {
    want = Isa::kAvx512;
  } else {
    throw ConfigError("OPENNEURON_ISA=\"" + value +
                      "\" is invalid: expected baseline, avx2 or avx512 (this CPU supports " +
                      host_isa_description() + ").");
  }
  if (static_cast<int>(want) > static_cast<int>(host_isa()))
    throw ConfigError("OPENNEURON_ISA=\"" + value + "\": this CPU does not support " +
                      isa_name(want) + "; it supports " + host_isa_description() +
                      ". Unset OPENNEURON_ISA or pick one of those.");
  return want;
}

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

Config make_config(const EnvLookup& env, uint64_t host_ram) {
  Config c;
  const auto cores = env("NEURON_RT_VISIBLE_CORES");
  c.visible_cores = cores ? parse_visible_cores(*cores) : std::vector<int>{0, 1, 2, 3};
  if (const auto v = env("OPENNEURON_DEVICE_MEMORY")) {
    c.device_memory = parse_memory_size(*v);
  } else {
    c.device_memory = std::max<uint64_t>(host_ram / c.visible_cores.size(), 1);
  }
  const auto flag = [&](const char* var, bool def) {
    const auto v = env(var);
    return v ? parse_flag(var, *v, def) : def;
  };
  c.launch_blocking = flag("NEURON_LAUNCH_BLOCKING", false);
  if (const auto v = env("OPENNEURON_ISA")) c.isa = parse_isa(*v);
  if (const auto v = env("OPENNEURON_FALLBACK")) c.fallback = parse_fallback(*v);
  c.native_kernels = flag("OPENNEURON_NATIVE_KERNELS", true);
  c.origin = flag("OPENNEURON_ORIGIN", true);
  // NOTE: launch blocking (debugging: every op runs as it is issued) wins over the fusion switch;
  // torch.neuron.set_fusion_enabled(True) still turns fusion on explicitly.
  c.fusion = flag("TORCH_NEURONX_ENABLE_CONCATENATION", false) && !c.launch_blocking;
  c.fusion_log = flag("OPENNEURON_FUSION_LOG", false);
  if (const auto v = env("OPENNEURON_FUSION_MAX_OPS"))
    c.fusion_max_ops = static_cast<int>(parse_count("OPENNEURON_FUSION_MAX_OPS", *v, 1 << 20));
  if (const auto v = env("OPENNEURON_PROFILER_MAX_EVENTS"))
    c.profiler_max_events =
        static_cast<size_t>(parse_count("OPENNEURON_PROFILER_MAX_EVENTS", *v, int64_t{1} << 32));
  if (const auto v = env("OPENNEURON_OOM_SNAPSHOT")) c.oom_snapshot = trim(*v);
  if (const auto v = env("OPENNEURON_HOST_ID")) c.host_id = trim(*v);
  c.compile_fallback = !flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", false);
  if (const auto v = env("TORCH_NEURONX_NEFF_CACHE_DIR")) c.compile_cache_dir = trim(*v);
  c.compile_async = flag("OPENNEURON_COMPILE_ASYNC", false);
  c.omp_spin_bounded = env("GOMP_SPINCOUNT").has_value() || env("OMP_WAIT_POLICY").has_value();
  if (const auto v = env("LOCAL_RANK")) {
    const std::string r = trim(*v);
    if (r.empty() || r.size() > 6 ||
        !std::all_of(r.begin(), r.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      bad_value("LOCAL_RANK", *v, "it is not a whole number", "expected 0, 1, 2, ...");
    c.local_rank = std::stoi(r);
  }
  return c;
}

const Config& config() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw ConfigError(l.error);
  return l.config;
}

const Config& config_or_defaults() noexcept { return loaded().config; }

const std::vector<std::optional<std::string>>& setting_values() { return loaded().values; }

}  // namespace openneuron::runtime
