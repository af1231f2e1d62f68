// Test-only Python module over aten/origin_capture.cpp (no torch): captures the calling line's
// origin id with the GIL held or released, resolves ids through runtime/origin.h, and reports
// how many captures took the GIL path. Built and run by check.sh.
#include <Python.h>

#include <string>

#include "aten/origin_capture.h"
#include "runtime/origin.h"

namespace {

namespace aten = openneuron::aten;

PyObject* capture(PyObject*, PyObject*) { return PyLong_FromUnsignedLong(aten::origin_capture()); }

// NOTE: PyTorch's bindings release the GIL before dispatch; this is that case (what
// Py_BEGIN_ALLOW_THREADS / Py_END_ALLOW_THREADS expand to).
PyObject* capture_nogil(PyObject*, PyObject*) {
  PyThreadState* saved = PyEval_SaveThread();
  const uint32_t id = aten::origin_capture();
  PyEval_RestoreThread(saved);
  return PyLong_FromUnsignedLong(id);
}

PyObject* resolve(PyObject*, PyObject* arg) {
  const unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == static_cast<unsigned long>(-1) && PyErr_Occurred()) return nullptr;
  const std::string text = openneuron::runtime::origin_describe(static_cast<uint32_t>(id));
  return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

PyObject* slow_captures(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(aten::origin_slow_captures());
}

PyMethodDef methods[] = {
    {"capture", capture, METH_NOARGS, "origin id of the calling line, GIL held"},
    {"capture_nogil", capture_nogil, METH_NOARGS, "origin id of the calling line, GIL released"},
    {"resolve", resolve, METH_O, "origin id -> 'file:line in function' ('' for unknown)"},
    {"slow_captures", slow_captures, METH_NOARGS, "captures that took the GIL path so far"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "_origin_harness",
                      nullptr,
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__origin_harness() {
  aten::origin_install();
  return PyModule_Create(&module);
}
