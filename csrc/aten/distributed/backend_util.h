// Helpers the c10d backend's two files share (backend.cpp, collectives.cpp): error text, host
// views of tensors, the transport's error mapping. Internal to csrc/aten/distributed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "collectives/shm_comm.h"

namespace openneuron::aten::distributed {

// "[sizes] dtype on device", for error messages.
std::string shape_of(const at::Tensor& t);
// A CPU tensor over t's memory (t itself for CPU tensors).
at::Tensor host_of(const at::Tensor& t);
size_t nbytes(const at::Tensor& t);
// One tensor per call (the deprecated multi-tensor forms are refused with a clear error).
void check_one(const std::vector<at::Tensor>& ts, const std::string& what);

// Runs the wrapped call turning a transport failure into torch.distributed.DistBackendError.
template <class F>
void run_comm(F&& f) {
  try {
    f();
  } catch (const collectives::CommError& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

}  // namespace openneuron::aten::distributed
