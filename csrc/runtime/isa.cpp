// SIMD variant detection and selection (see isa.h). OPENNEURON_ISA is read here once; its
// validation for users happens in config.cpp (a bad value is a configuration error).
#include "runtime/isa.h"

#include <atomic>
#include <cctype>
#include <cstdlib>

#include "runtime/errors.h"

namespace openneuron::runtime {
namespace {

bool cpu_has_avx512() noexcept {
#if OPENNEURON_ISA_MULTI
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_has_avx2() noexcept {
#if OPENNEURON_ISA_MULTI
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
#else
  return false;
#endif
}

constexpr int kUnset = -1;
std::atomic<int> g_isa{kUnset};

std::string lower_trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out;
  for (size_t i = b; i < e; ++i)
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  return out;
}

bool supported(Isa isa) noexcept { return static_cast<int>(isa) <= static_cast<int>(host_isa()); }

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kBaseline:
      return "baseline";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

Isa host_isa() noexcept {
  static const Isa best =
      cpu_has_avx512() ? Isa::kAvx512 : (cpu_has_avx2() ? Isa::kAvx2 : Isa::kBaseline);
  return best;
}

std::vector<Isa> host_isas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(host_isa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

std::string host_isa_description() {
  std::string s;
  for (Isa i : host_isas()) s = std::string(isa_name(i)) + (s.empty() ? "" : ", ") + s;
  return s;
}

Isa parse_isa(const std::string& value) {
  const std::string v = lower_trimmed(value);
  Isa want;
  if (v == "default" || v == "auto" || v.empty()) {
    return host_isa();
  } else if (v == "baseline") {
    want = Isa::kBaseline;
  } else if (v == "avx2") {
    want = Isa::kAvx2;
  } else if (v == "avx512") {
    want = Isa::kAvx512;
  } else {
    throw ConfigError("OPENNEURON_ISA=\"" + value +
                      "\" is invalid: expected baseline, avx2 or avx512 (this CPU supports " +
                      host_isa_description() + ").");
  }
  if (!supported(want))
    throw ConfigError("OPENNEURON_ISA=\"" + value + "\": this CPU does not support " +
                      isa_name(want) + "; it supports " + host_isa_description() +
                      ". Unset OPENNEURON_ISA or pick one of those.");
  return want;
}

Isa isa() noexcept {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v != kUnset) return static_cast<Isa>(v);
  Isa chosen = host_isa();
  if (const char* env = std::getenv("OPENNEURON_ISA")) {
    try {
      chosen = parse_isa(env);
    } catch (const ConfigError&) {
      // config() reports it; kernels still run on what the CPU has.
    }
  }
  int expected = kUnset;
  g_isa.compare_exchange_strong(expected, static_cast<int>(chosen), std::memory_order_relaxed);
  return static_cast<Isa>(g_isa.load(std::memory_order_relaxed));
}

void set_isa(Isa isa) {
  if (!supported(isa))
    throw ConfigError(std::string("set_isa: this CPU does not support ") + isa_name(isa) +
                      "; it supports " + host_isa_description() + ".");
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace openneuron::runtime
