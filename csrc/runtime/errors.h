// Exceptions thrown by the runtime. The PyTorch glue (csrc/aten) translates them into the
// matching c10 errors (OutOfMemoryError -> torch.OutOfMemoryError, the rest -> RuntimeError).
// Messages are complete sentences a user can act on; see STYLE.md "Errors a user reads".
#pragma once

#include <stdexcept>
#include <string>

namespace openneuron::runtime {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An invalid environment variable (NEURON_RT_VISIBLE_CORES, OPENNEURON_DEVICE_MEMORY, ...).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A device index out of range, or another misuse of the runtime API.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// The caching allocator could not satisfy a request even after releasing its cache.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// Work that failed asynchronously, raised at the next sync point on its device. The message
// names the op, its sequence number and where it was enqueued.
class AsyncError : public Error {
 public:
  using Error::Error;
};

}  // namespace openneuron::runtime
