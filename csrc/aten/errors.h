// Turns runtime exceptions into the c10 errors PyTorch users expect: runtime::OutOfMemoryError
// becomes torch.OutOfMemoryError, every other runtime::Error a RuntimeError with the same text.
// Wrap every call into csrc/runtime that can throw.
#pragma once

#include <c10/util/Exception.h>

#include "runtime/errors.h"

namespace openneuron::aten {

template <class F>
decltype(auto) with_torch_errors(F&& f) {
  try {
    return f();
  } catch (const runtime::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const runtime::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace openneuron::aten
