// The pieces of the Python extension openneuron._C. module.cpp creates the module and calls
// each bind_* below; each lives next to the feature it exposes.
#pragma once

#include <pybind11/pybind11.h>

namespace openneuron::aten {

void bind_device(pybind11::module_& m);       // device.cpp: count, current, properties, sync
void bind_streams(pybind11::module_& m);      // streams.cpp: current/default stream, set_stream
void bind_graphs(pybind11::module_& m);       // streams.cpp: graph capture (called by bind_streams)
void bind_memory(pybind11::module_& m);       // allocator.cpp: stats, empty_cache, mem_get_info
void bind_random(pybind11::module_& m);       // generator.cpp: default generators
void bind_ops(pybind11::module_& m);          // ops/: ops_report and fallback counters
void bind_profiler(pybind11::module_& m);     // profiler.cpp: device trace state
void bind_distributed(pybind11::module_& m);  // distributed/: the c10d backend factory
void bind_inductor(pybind11::module_& m);     // inductor_launch.cpp: kernel launches
void bind_nki(pybind11::module_& m);          // nki_launch.cpp: NKI kernel programs, launches

}  // namespace openneuron::aten
