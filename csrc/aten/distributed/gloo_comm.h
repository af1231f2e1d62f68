// The inter-host transport: collectives::ShmComm's calls over a ProcessGroupGloo (gloo_comm.cpp).
#pragma once

#include <memory>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "collectives/shm_comm.h"

namespace openneuron::aten::distributed {

std::unique_ptr<collectives::ShmComm> make_gloo_comm(int rank, int size,
                                                     const collectives::Options& opts,
                                                     c10::intrusive_ptr<c10d::Backend> gloo);

}  // namespace openneuron::aten::distributed
