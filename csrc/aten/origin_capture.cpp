// Origin capture for asynchronous error reports. The id table is bounded; each entry keeps its
// code object alive (so ids stay unambiguous) and its text pre-formatted, so the resolver never
// needs the GIL. Neighbours: runtime/origin.h (the id -> text hook), ops/fallback.cpp (caller).
#include "aten/origin_capture.h"

#include <Python.h>
#include <frameobject.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/origin.h"

namespace openneuron::aten {
namespace {

constexpr size_t kMaxOrigins = 1 << 16;
constexpr size_t kMaxCodes = 1 << 14;
constexpr int kMaxFrames = 8;

struct PairHash {
  size_t operator()(const std::pair<const void*, int>& p) const noexcept {
    return std::hash<const void*>()(p.first) * 31 + static_cast<size_t>(p.second);
  }
};

struct Table {
  std::mutex mu;
  std::unordered_map<const void*, bool> internal;  // code object -> inside torch/openneuron
  // (code object, instruction offset) -> id; the line is computed only on a miss.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> ids;
  std::vector<std::string> texts{""};  // id 0 = unknown
};

Table& table() {
  static Table* t = new Table();  // NOTE: leaked on purpose; resolver may run at exit
  return *t;
}

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("OPENNEURON_ORIGIN");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

std::string utf8(PyObject* s) {
  const char* c = s ? PyUnicode_AsUTF8(s) : nullptr;
  if (!c) {
    PyErr_Clear();
    return "?";
  }
  return c;
}

bool is_internal_file(const std::string& f) {
  return f.find("/torch/") != std::string::npos || f.find("/openneuron/") != std::string::npos ||
         f.rfind("<frozen", 0) == 0;
}

// Caller holds the GIL and t.mu. Takes a reference to code when it is cached.
bool code_is_internal(Table& t, PyCodeObject* code) {
  auto it = t.internal.find(code);
  if (it != t.internal.end()) return it->second;
  bool internal = is_internal_file(utf8(code->co_filename));
  if (t.internal.size() < kMaxCodes) {
    Py_INCREF(code);
    t.internal.emplace(code, internal);
  }
  return internal;
}

uint32_t intern(Table& t, PyFrameObject* frame, PyCodeObject* code) {
  auto key = std::make_pair(static_cast<const void*>(code), PyFrame_GetLasti(frame));
  auto it = t.ids.find(key);
  if (it != t.ids.end()) return it->second;
  if (t.texts.size() >= kMaxOrigins) return 0;
  const int line = PyFrame_GetLineNumber(frame);
  std::string file = utf8(code->co_filename);
  auto slash = file.find_last_of('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  std::string text = file + ":" + std::to_string(line) + " in " + utf8(code->co_name);
  Py_INCREF(code);
  uint32_t id = static_cast<uint32_t>(t.texts.size());
  t.texts.push_back(std::move(text));
  t.ids.emplace(key, id);
  return id;
}

// Caller holds the GIL.
uint32_t capture_locked() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (!frame) return 0;
  Py_INCREF(frame);
  Table& t = table();
  uint32_t id = 0;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (int i = 0; i < kMaxFrames && frame; ++i) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      bool internal = code_is_internal(t, code);
      if (!internal) id = intern(t, frame, code);
      Py_DECREF(code);
      if (!internal) break;
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
  }
  Py_XDECREF(frame);
  return id;
}

}  // namespace

uint32_t origin_capture() {
  if (!enabled() || !Py_IsInitialized()) return 0;
  if (PyGILState_Check()) return capture_locked();
  // NOTE: PyTorch's bindings release the GIL before dispatch; this thread's frames cannot
  // change meanwhile, so re-taking the GIL briefly reads the user's line.
  if (PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE st = PyGILState_Ensure();
  uint32_t id = capture_locked();
  PyGILState_Release(st);
  return id;
}

void origin_install() {
  static std::once_flag once;
  std::call_once(once, [] {
    runtime::origin_set_resolver([](uint32_t id) -> std::string {
      Table& t = table();
      std::lock_guard<std::mutex> lock(t.mu);
      return id < t.texts.size() ? t.texts[id] : std::string();
    });
  });
}

}  // namespace openneuron::aten
