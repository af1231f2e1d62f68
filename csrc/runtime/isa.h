// The SIMD variant that the torch-free compute (csrc/ir, csrc/kernels) runs: AVX-512
// (x86-64-v4), AVX2 (x86-64-v3) or the x86-64 baseline. Chosen once per process: OPENNEURON_ISA
// if set (parsed in config.cpp), else the best variant this CPU supports; set_isa() switches it
// (tests). OPENNEURON_ISA_DISPATCH compiles one function body per variant and calls the active
// one, so a single host can run every code path any host would take.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace openneuron::runtime {

enum class Isa : uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa isa);  // "baseline", "avx2", "avx512"
// The best variant this CPU supports (and every one it supports, best last). Never throw.
Isa host_isa() noexcept;
std::vector<Isa> host_isas();
// What this CPU has, for error messages: "avx512 (AVX512F/BW/CD/DQ/VL), avx2, baseline".
std::string host_isa_description();
// "baseline" | "avx2" | "avx512" (case-insensitive; "default"/"auto" = host_isa()). Throws
// ConfigError naming OPENNEURON_ISA, the value, and what this CPU supports. In config.cpp.
Isa parse_isa(const std::string& value);

// The active variant: thread-safe, one relaxed load after the first call. The first call takes
// OPENNEURON_ISA from config_or_defaults(); an invalid value falls back to host_isa() here
// (config() reports the error and no device is usable).
Isa isa() noexcept;
// Switches the active variant for later calls (tests, benchmarks). Throws ConfigError if the CPU
// lacks it. Not for use while kernels run on other threads.
void set_isa(Isa isa);

}  // namespace openneuron::runtime

// --- per-variant code generation -------------------------------------------------------------
// OPENNEURON_ISA_DISPATCH(ret, name, (params), (args)) defines `ret name(params)`, which calls
// `name##_body(args)` — an OPENNEURON_ISA_BODY function (always inlined) — compiled for the
// active variant. Only the body and what it inlines are specialised; everything else stays
// baseline code (no ODR mix of per-ISA copies of shared inline functions).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPENNEURON_ISA_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define OPENNEURON_ISA_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define OPENNEURON_ISA_MULTI 1
#else
#define OPENNEURON_ISA_MULTI 0
#endif
#define OPENNEURON_ISA_BODY __attribute__((always_inline)) inline

#if OPENNEURON_ISA_MULTI
#define OPENNEURON_ISA_DISPATCH(ret, name, params, args)                            \
  OPENNEURON_ISA_TARGET_AVX512 __attribute__((noinline)) ret name##_avx512 params { \
    return name##_body args;                                                        \
  }                                                                                 \
  OPENNEURON_ISA_TARGET_AVX2 __attribute__((noinline)) ret name##_avx2 params {     \
    return name##_body args;                                                        \
  }                                                                                 \
  __attribute__((noinline)) ret name##_baseline params { return name##_body args; } \
  ret name params {                                                                 \
    switch (::openneuron::runtime::isa()) {                                         \
      case ::openneuron::runtime::Isa::kAvx512:                                     \
        return name##_avx512 args;                                                  \
      case ::openneuron::runtime::Isa::kAvx2:                                       \
        return name##_avx2 args;                                                    \
      default:                                                                      \
        return name##_baseline args;                                                \
    }                                                                               \
  }
#else
#define OPENNEURON_ISA_DISPATCH(ret, name, params, args) \
  ret name params { return name##_body args; }
#endif
