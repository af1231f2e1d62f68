// The process-wide HAL instance and the origin resolver. The HAL is created on first use from
// config() and never destroyed (see the NOTE below); the implementation is software_core.cpp.
#include "hal.h"

#include <memory>
#include <mutex>

#include "origin.h"
#include "software_core.h"

namespace openneuron::runtime {
namespace {

struct OriginState {
  std::mutex mu;
  std::shared_ptr<const OriginResolver> resolver;
};

OriginState& origin_state() {
  static auto* s = new OriginState;
  return *s;
}

}  // namespace

Hal& hal() {
  // NOTE: intentionally never destroyed: executor threads may still run work while static
  // destructors run at exit, so the HAL they use must outlive them. The pointer stays
  // reachable from this static, so LeakSanitizer does not report it.
  static Hal* const instance = software_core_create(config()).release();
  return *instance;
}

void origin_set_resolver(OriginResolver resolver) {
  auto r = resolver ? std::make_shared<const OriginResolver>(std::move(resolver)) : nullptr;
  OriginState& s = origin_state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.resolver = std::move(r);
}

std::string origin_describe(uint32_t id) {
  if (id == 0) return "";
  std::shared_ptr<const OriginResolver> r;
  {
    OriginState& s = origin_state();
    std::lock_guard<std::mutex> lk(s.mu);
    r = s.resolver;
  }
  if (!r) return "";
  try {
    return (*r)(id);
  } catch (...) {
    return "";
  }
}

}  // namespace openneuron::runtime
