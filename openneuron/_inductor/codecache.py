"""Inductor's C++ kernels for the neuron device: compiled as for the CPU (the software
NeuronCore's memory is host memory) with a Python binding of our own that, instead of running
the kernel on the calling thread, reads its tensors' data pointers and scalars there and queues
the kernel on the current neuron stream (csrc/aten/inductor_launch.cpp). Everything else —
compilation, the on-disk cache, the parallel compile workers — is Inductor's
(`CppPythonBindingsCodeCache`).
"""
from __future__ import annotations

import os
from typing import Any, ClassVar

from torch._inductor.codecache import CppPythonBindingsCodeCache

# The binding appended to each kernel's source. {types}: the kernel's argument types (scalars
# without const); {count}: their number.
_BINDING = r"""
// openneuron: queue kernel() on the current neuron stream (openneuron/_inductor/codecache.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <type_traits>

namespace openneuron_launch {{
using Args = std::tuple<{types}>;
constexpr size_t kCount = {count};
// The kernel's arguments and the copies of CPU scalars they point to (freed after the run).
struct Packed {{
  Args args;
  void* owned[kCount > 0 ? kCount : 1] = {{}};
}};
void* (*tensor_arg)(PyObject*, int, void**) = nullptr;
const char* (*enqueue)(void (*)(void*), void*, void (*)(void*), const char*) = nullptr;
char label[96] = "inductor_kernel";

template <typename T> T arg(PyObject* args, Py_ssize_t i, void** owned) {{
  PyObject* o = PyTuple_GET_ITEM(args, i);
  if constexpr (std::is_pointer_v<T>) {{
    void* p = tensor_arg(o, std::is_const_v<std::remove_pointer_t<T>>, owned);
    if (p == nullptr && PyErr_Occurred()) throw std::runtime_error("");
    return static_cast<T>(p);
  }} else if constexpr (std::is_floating_point_v<T>) {{
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) throw std::runtime_error("");
    return static_cast<T>(v);
  }} else {{
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) throw std::runtime_error("");
    return static_cast<T>(v);
  }}
}}

void drop(void* p) {{
  auto* packed = static_cast<Packed*>(p);
  for (void* o : packed->owned) std::free(o);
  delete packed;
}}

template <size_t... I> Packed* pack(PyObject* args, std::index_sequence<I...>) {{
  auto* p = new Packed();
  try {{
    p->args = Args{{arg<std::tuple_element_t<I, Args>>(args, I, &p->owned[I])...}};
  }} catch (...) {{
    drop(p);
    throw;
  }}
  return p;
}}

void run(void* p) {{ std::apply(kernel, static_cast<Packed*>(p)->args); }}

uintptr_t address_from_env(const char* name) {{
  const char* s = std::getenv(name);
  return s == nullptr ? 0 : static_cast<uintptr_t>(std::strtoull(s, nullptr, 10));
}}
}}  // namespace openneuron_launch

static PyObject* openneuron_kernel_launch(PyObject*, PyObject* args) {{
  namespace l = openneuron_launch;
  try {{
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != {count})
      throw std::runtime_error("inductor kernel: expected {count} arguments");
    l::Packed* packed = l::pack(args, std::make_index_sequence<{count}>());
    if (const char* error = l::enqueue(l::run, packed, l::drop, l::label))
      throw std::runtime_error(error);
    Py_RETURN_NONE;
  }} catch (const std::exception& e) {{
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }}
}}

static PyObject* openneuron_kernel_label(PyObject*, PyObject* name) {{
  const char* s = PyUnicode_AsUTF8(name);
  if (s == nullptr) return nullptr;
  std::strncpy(openneuron_launch::label, s, sizeof(openneuron_launch::label) - 1);
  Py_RETURN_NONE;
}}

static PyMethodDef openneuron_kernel_methods[] = {{
    {{"kernel", openneuron_kernel_launch, METH_VARARGS, "queue the kernel on the current stream"}},
    {{"set_label", openneuron_kernel_label, METH_O, "the name of its work items"}},
    {{nullptr, nullptr, 0, nullptr}}}};

static struct PyModuleDef openneuron_kernel_module = {{
    PyModuleDef_HEAD_INIT, "kernel", nullptr, -1, openneuron_kernel_methods}};

PyMODINIT_FUNC PyInit_kernel(void) {{
  namespace l = openneuron_launch;
  l::tensor_arg = reinterpret_cast<decltype(l::tensor_arg)>(
      l::address_from_env("_OPENNEURON_KERNEL_ARG"));
  l::enqueue = reinterpret_cast<decltype(l::enqueue)>(
      l::address_from_env("_OPENNEURON_ENQUEUE_KERNEL"));
  if (l::tensor_arg == nullptr || l::enqueue == nullptr) {{
    PyErr_SetString(PyExc_RuntimeError, "openneuron inductor kernel: launch addresses not set");
    return nullptr;
  }}
  return PyModule_Create(&openneuron_kernel_module);
}}
"""


class NeuronKernelCodeCache(CppPythonBindingsCodeCache):
    """CppPythonBindingsCodeCache whose binding queues the kernel on the neuron stream."""

    cache: ClassVar[dict[str, Any]] = {}
    _loaded_module_names: ClassVar[set[str]] = set()

    @classmethod
    def _load_library_inner(cls, path: str, key: str):
        from openneuron import _C

        os.environ["_OPENNEURON_ENQUEUE_KERNEL"] = str(_C._inductor_enqueue_address())
        os.environ["_OPENNEURON_KERNEL_ARG"] = str(_C._inductor_arg_address())
        return super()._load_library_inner(path, key)

    @classmethod
    def load_pybinding_async(cls, argtypes, main_code, device_type="cpu", submit_fn=None,
                             **kwargs):
        # NOTE: pointers keep their const (read-only inputs); scalars drop it (tuple members).
        types = ", ".join(t.strip() if t.strip().endswith("*") else t.replace("const ", "").strip()
                          for t in argtypes)
        binding = _BINDING.format(types=types, count=len(argtypes))
        # NOTE: compiled as CPU code (device_type "cpu": -O3 and the host's vector ISA).
        get_result = cls.load_async(main_code + binding, "cpu", submit_fn=submit_fn)
        result = None

        def future():
            nonlocal result
            if result is None:
                result = get_result()
            return result

        return future


def pybinding(async_compile, kernel_name: str, argtypes: list[str], source_code: str):
    """What the generated wrapper calls in place of `async_compile.cpp_pybinding`: the kernel's
    launcher (compiled in Inductor's compile workers when they are on)."""
    from torch._inductor.async_compile import get_compile_threads
    from torch._inductor.codecache import LambdaFuture

    def launcher(module):
        module.set_label(f"inductor:{kernel_name}")
        return module.kernel

    if get_compile_threads() <= 1:
        return launcher(NeuronKernelCodeCache.load_pybinding_async(argtypes, source_code)())
    get_result = NeuronKernelCodeCache.load_pybinding_async(
        argtypes, source_code, submit_fn=async_compile.submit)
    return LambdaFuture(lambda: launcher(get_result()))

