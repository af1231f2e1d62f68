// How TorchInductor's generated C++ kernels reach the device (DESIGN §6): the kernel's Python
// binding (openneuron/_inductor/codecache.py) reads its tensors' data pointers and scalars on the
// calling thread, then hands a closure here, which queues it on the current stream of the
// current neuron device, as a launch on a GPU. The kernel never runs on the Python thread: it
// would read buffers that queued work has not written yet.
// The generated library has no torch or openneuron headers: it finds this function by the
// address in _OPENNEURON_ENQUEUE_KERNEL (set by the Python side before loading it).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "aten/bindings.h"
#include "aten/ops/enqueue.h"
#include "aten/streams.h"
#include "runtime/device.h"

namespace openneuron::aten {
namespace {

// run(ctx) on the stream; drop(ctx) when the work item is destroyed (after its last run: a
// graph may replay it). `name` (static storage) names the work item. Returns null, or (the
// context dropped) why the launch failed, valid until the next call on this thread.
// NOTE: the context holds the arguments' pointers and malloc'd copies of CPU scalars only,
// never Python objects, so it may live until the queue slot is reused.
extern "C" const char* openneuron_enqueue_kernel(void (*run)(void*), void* ctx, void (*drop)(void*),
                                                 const char* name) {
  struct Launch {
    void (*run)(void*);
    void* ctx;
    void (*drop)(void*);
    Launch(void (*r)(void*), void* c, void (*d)(void*)) : run(r), ctx(c), drop(d) {}
    Launch(Launch&& o) noexcept : run(o.run), ctx(std::exchange(o.ctx, nullptr)), drop(o.drop) {}
    Launch(const Launch&) = delete;
    Launch& operator=(const Launch&) = delete;
    Launch& operator=(Launch&&) = delete;
    ~Launch() {
      if (ctx != nullptr) drop(ctx);
    }
    void operator()() const { run(ctx); }
  };
  Launch launch(run, ctx, drop);
  try {
    enqueue_op(runtime::stream_current(runtime::device_current()), name, std::move(launch));
  } catch (const std::exception& e) {
    thread_local std::string message;
    message = e.what();
    return message.c_str();
  }
  return nullptr;
}

// A kernel's tensor argument (called with the GIL, from the binding): a neuron tensor's device
// pointer; for a CPU tensor the kernel only reads (Dynamo passes a Python float as a 0-d CPU
// tensor), a copy of its bytes taken now, in *owned (the launch frees it): the kernel runs later,
// when the CPU tensor may be gone. Null with a Python error set otherwise.
extern "C" void* openneuron_kernel_arg(PyObject* obj, int read_only, void** owned) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "inductor kernel on neuron: expected a tensor argument");
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.device().is_privateuseone() || t.numel() == 0) return t.data_ptr();
  if (!t.device().is_cpu() || !read_only) {
    PyErr_Format(PyExc_RuntimeError,
                 "inductor kernel on neuron: a %s argument on %s; compiled neuron kernels read "
                 "and write neuron tensors (and read CPU scalars)",
                 read_only ? "read" : "written", t.device().str().c_str());
    return nullptr;
  }
  // The bytes the kernel may index: from the first element to the last, by the strides.
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) {
      PyErr_SetString(PyExc_RuntimeError, "inductor kernel on neuron: negative strides");
      return nullptr;
    }
    span += (t.size(d) - 1) * t.stride(d);
  }
  const size_t bytes = static_cast<size_t>(span) * t.element_size();
  void* copy = std::malloc(bytes);
  if (copy == nullptr) {
    PyErr_NoMemory();
    return nullptr;
  }
  std::memcpy(copy, t.data_ptr(), bytes);
  *owned = copy;
  return copy;
}

}  // namespace

void bind_inductor(pybind11::module_& m) {
  // Whether inputs[idxs[k]] still has data pointer ptrs[k] for every k: a replayed graph's
  // static inputs (openneuron/_inductor/graphs.py), checked on every call.
  m.def("_inductor_data_ptrs_equal",
        [](const pybind11::list& inputs, const std::vector<int64_t>& idxs,
           const std::vector<uintptr_t>& ptrs) {
          const Py_ssize_t n = PyList_GET_SIZE(inputs.ptr());
          for (size_t k = 0; k < idxs.size() && k < ptrs.size(); ++k) {
            if (idxs[k] < 0 || idxs[k] >= n) return false;
            PyObject* o = PyList_GET_ITEM(inputs.ptr(), idxs[k]);
            if (!THPVariable_Check(o)) return false;
            if (reinterpret_cast<uintptr_t>(THPVariable_Unpack(o).data_ptr()) != ptrs[k])
              return false;
          }
          return true;
        });
  m.def("_inductor_enqueue_address",
        [] { return reinterpret_cast<uintptr_t>(&openneuron_enqueue_kernel); });
  m.def("_inductor_arg_address",
        [] { return reinterpret_cast<uintptr_t>(&openneuron_kernel_arg); });
}

}  // namespace openneuron::aten
