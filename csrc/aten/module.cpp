// The Python extension module openneuron._C: calls each bind_* of bindings.h and prepares the
// runtime's executor threads for ATen work. Importing it also registers (by static
// initializers) the guard, hooks, allocators and op kernels. Registration of the "neuron"
// name with torch is the Python package's job (openneuron/__init__.py).
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include "aten/bindings.h"
#include "aten/omp_parallel.h"
#include "runtime/config.h"
#include "runtime/parallel.h"
#include "runtime/software_core.h"

PYBIND11_MODULE(_C, m) {
  namespace aten = openneuron::aten;
  m.doc() = "OpenNeuron C++ core: the neuron device for PyTorch.";
  // NOTE: work items run ATen CPU kernels on executor threads; they must use ATen's shared
  // intra-op pool with the process's settings, not a pool of their own. at::get_num_threads()
  // runs ATen's lazy per-thread initialization now: run later, inside a SerialScope
  // (omp_parallel.h), it would reset the scope's team size of 1.
  openneuron::runtime::executor_set_thread_init([] {
    at::init_num_threads();
    (void)at::get_num_threads();
  });
  // NOTE: not at::parallel_for: compiled here (no -fopenmp) it never goes parallel.
  openneuron::runtime::set_parallel_backend(&aten::omp_parallel_for);
  {
    namespace rt = openneuron::runtime;
    const unsigned on = rt::kReleaseOnIdleExecutor |
                        (rt::config_or_defaults().omp_spin_bounded ? rt::kReleaseOnHostWait
                                                                   : rt::kReleaseOnLongHostWait);
    rt::set_parallel_release(&aten::omp_release_pool, on);
  }
  aten::bind_device(m);
  aten::bind_streams(m);
  aten::bind_memory(m);
  aten::bind_random(m);
  aten::bind_ops(m);
  aten::bind_profiler(m);
  aten::bind_distributed(m);
  aten::bind_inductor(m);
  aten::bind_nki(m);
}
