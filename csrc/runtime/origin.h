// Where a piece of work came from: a small id stored in each Work item, resolved to text
// ("train.py:42 in forward") only when an error is reported. The runtime only stores ids;
// the PyTorch glue installs the resolver (it captures Python frames).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace openneuron::runtime {

// Resolver from origin id to text; called only when formatting an error (may take the GIL).
using OriginResolver = std::function<std::string(uint32_t)>;
void origin_set_resolver(OriginResolver resolver);
// "" when no resolver is installed or id is 0.
std::string origin_describe(uint32_t id);

}  // namespace openneuron::runtime
