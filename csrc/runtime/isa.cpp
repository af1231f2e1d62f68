// SIMD variant detection and selection (see isa.h). OPENNEURON_ISA is read and parsed by the
// settings module (config.cpp), where a bad value is a configuration error.
#include "runtime/isa.h"

#include <atomic>

#include "runtime/config.h"
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

Isa isa() noexcept {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v != kUnset) return static_cast<Isa>(v);
  // NOTE: an invalid OPENNEURON_ISA leaves the defaults here; config() reports it.
  const Isa chosen = config_or_defaults().isa.value_or(host_isa());
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
