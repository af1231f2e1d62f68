// The Python extension module openneuron._C: calls each bind_* of bindings.h and prepares the
// runtime's executor threads for ATen work. Importing it also registers (by static
// initializers) the guard, hooks, allocators and op kernels. Registration of the "neuron"
// name with torch is the Python package's job (openneuron/__init__.py).
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include "aten/bindings.h"
#include "runtime/parallel.h"
#include "runtime/software_core.h"

PYBIND11_MODULE(_C, m) {
  namespace aten = openneuron::aten;
  m.doc() = "OpenNeuron C++ core: the neuron device for PyTorch.";
  // NOTE: work items run ATen CPU kernels on executor threads; they must use ATen's shared
  // intra-op pool with the process's settings, not a pool of their own.
  openneuron::runtime::executor_set_thread_init([] { at::init_num_threads(); });
  openneuron::runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t grain, openneuron::runtime::ParallelBody body,
         void* ctx) {
        at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
      });
  aten::bind_device(m);
  aten::bind_streams(m);
  aten::bind_memory(m);
  aten::bind_random(m);
  aten::bind_ops(m);
  aten::bind_profiler(m);
}
