// The software NeuronCore: the built-in Hal implementation. Device memory is host memory with
// a per-device capacity; each stream is an in-order queue run by its own executor thread;
// events are sequence markers in those queues. Only hal.cpp constructs it.
#pragma once

#include <functional>
#include <memory>

#include "config.h"
#include "hal.h"

namespace openneuron::runtime {

std::unique_ptr<Hal> software_core_create(const Config& config);

// Called once on each executor thread before it runs any work (the PyTorch glue uses it to
// set up ATen's intra-op threads). Set it before the first enqueue.
void executor_set_thread_init(std::function<void()> fn);

}  // namespace openneuron::runtime
