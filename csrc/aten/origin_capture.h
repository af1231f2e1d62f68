// Where an op was enqueued from: the first Python frame outside torch/ and openneuron/, captured
// cheaply at dispatch as a small id, and the resolver that turns an id back into
// "train.py:42 in forward" when an asynchronous error is reported (runtime/origin.h).
#pragma once

#include <cstdint>

namespace openneuron::aten {

// The origin id of the calling Python line, 0 if unknown (no Python frame on this thread, or
// OPENNEURON_ORIGIN=0). Takes the GIL briefly if this Python thread released it.
uint32_t origin_capture();
// Installs the resolver into the runtime (idempotent).
void origin_install();

}  // namespace openneuron::aten
