// Origin capture for asynchronous error reports. The id table is bounded; each entry keeps its
// code object alive (so ids stay unambiguous) and its text pre-formatted, so the resolver never
// needs the GIL. Allocation stacks (stack_*) are interned the same way, reference-counted by the
// blocks that hold them. Neighbours: runtime/origin.h (the id -> text hook), ops/fallback.cpp and
// allocator.cpp (callers).
#include "aten/origin_capture.h"

#include <Python.h>
#include <frameobject.h>
// NOTE: CPython 3.11-3.14's interpreter-frame layout, for the GIL-free origin lookup below (the
// same use greenlet and py-spy make of it). Other versions take the GIL path only.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030F0000
#define OPENNEURON_FAST_ORIGIN 1
#define Py_BUILD_CORE 1
// NOTE: 3.14's internal headers have unused parameters (-Wextra).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#if PY_VERSION_HEX >= 0x030E0000
#include <internal/pycore_interpframe.h>  // 3.14 moved _PyInterpreterFrame here
#else
#include <internal/pycore_frame.h>
#endif
#pragma GCC diagnostic pop
#undef Py_BUILD_CORE
#else
#define OPENNEURON_FAST_ORIGIN 0
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/config.h"
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

struct OriginTable {
  std::mutex mu;
  std::unordered_map<const void*, bool> internal;  // code object -> inside torch/openneuron
  // (code object, instruction offset) -> id; the line is computed only on a miss.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> ids;
  std::vector<std::string> texts{""};  // id 0 = unknown
};

OriginTable& origin_table() {
  static OriginTable* t = new OriginTable();  // NOTE: leaked on purpose; resolver may run at exit
  return *t;
}

// Per-thread, 2-way set-associative copies of the table's answers for code objects the table
// pins (a pinned code object is never freed, so its address can never name another one): with
// them, the common case (the same few user lines issuing ops) needs neither the GIL nor t.mu.
// NOTE: 2-way, so two busy code objects that hash to one set do not evict each other on every
// op (direct-mapped, ~1 program in 4 with 10 busy functions kept taking the GIL path).
constexpr size_t kFastSlots = 1024;
struct FastCode {
  const void* code = nullptr;
  bool internal = false;
};
struct FastId {
  const void* code = nullptr;
  int lasti = 0;
  uint32_t id = 0;
};
thread_local FastCode tl_codes[kFastSlots];
thread_local FastId tl_ids[kFastSlots];
std::atomic<uint64_t> slow_captures{0};  // capture_locked() calls, for tests

// The first slot of (code, lasti)'s set; the set is {slot, slot ^ 1}.
size_t fast_slot(const void* code, int lasti) {
  auto h = reinterpret_cast<uintptr_t>(code) >> 4;
  h ^= static_cast<uintptr_t>(lasti) * 0x9E3779B1u;
  return (h ^ (h >> 8)) & (kFastSlots - 2);
}

bool same_key(const FastCode& e, const void* code, int) { return e.code == code; }
bool same_key(const FastId& e, const void* code, int lasti) {
  return e.code == code && e.lasti == lasti;
}

template <class E>
const E* fast_find(const E* table, const void* code, int lasti) {
  const size_t s = fast_slot(code, lasti);
  if (same_key(table[s], code, lasti)) return &table[s];
  if (same_key(table[s ^ 1], code, lasti)) return &table[s ^ 1];
  return nullptr;
}

// The newest entry goes first in its set; the one it displaces moves to the second way.
template <class E>
void fast_fill(E* table, const void* code, int lasti, const E& e) {
  const size_t s = fast_slot(code, lasti);
  if (!same_key(table[s], code, lasti)) table[s ^ 1] = table[s];
  table[s] = e;
}

bool enabled() {
  static const bool on = runtime::config_or_defaults().origin;
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
bool code_is_internal(OriginTable& t, PyCodeObject* code) {
  auto it = t.internal.find(code);
  if (it != t.internal.end()) {
    fast_fill(tl_codes, code, 0, FastCode{code, it->second});  // pinned: in t.internal
    return it->second;
  }
  bool internal = is_internal_file(utf8(code->co_filename));
  if (t.internal.size() < kMaxCodes) {
    Py_INCREF(code);
    t.internal.emplace(code, internal);
    fast_fill(tl_codes, code, 0, FastCode{code, internal});  // pinned just now
  }
  return internal;
}

uint32_t intern(OriginTable& t, PyFrameObject* frame, PyCodeObject* code) {
  auto key = std::make_pair(static_cast<const void*>(code), PyFrame_GetLasti(frame));
  auto it = t.ids.find(key);
  if (it != t.ids.end()) {
    fast_fill(tl_ids, code, key.second, FastId{code, key.second, it->second});  // pinned
    return it->second;
  }
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
  fast_fill(tl_ids, code, key.second, FastId{code, key.second, id});
  return id;
}

// Caller holds the GIL.
uint32_t capture_locked() {
  slow_captures.fetch_add(1, std::memory_order_relaxed);
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (!frame) return 0;
  Py_INCREF(frame);
  OriginTable& t = origin_table();
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

#if OPENNEURON_FAST_ORIGIN
// NOTE: 3.13 dropped tstate->cframe and made f_code f_executable (a _PyStackRef in 3.14).
#if PY_VERSION_HEX >= 0x030D0000
PyCodeObject* frame_code(_PyInterpreterFrame* f) { return _PyFrame_GetCode(f); }
#else
PyCodeObject* frame_code(_PyInterpreterFrame* f) { return f->f_code; }
#endif

// capture_locked() without the GIL, from this thread's caches only. NOTE: tstate is this
// thread's own state: its frame stack changes only while this thread runs Python code, which it
// cannot do while it is in here, and every frame on it keeps its code object alive. Returns
// false (nothing decided) on any cache miss; the caller then takes the GIL path, which fills
// the caches. Mirrors capture_locked: PyEval_GetFrame and PyFrame_GetBack skip incomplete
// frames, and PyFrame_GetLasti is the code-unit index times sizeof(_Py_CODEUNIT), or -1.
bool capture_fast(PyThreadState* tstate, uint32_t* id) {
#if PY_VERSION_HEX >= 0x030D0000
  if (tstate == nullptr) return false;
  _PyInterpreterFrame* f = tstate->current_frame;
#else
  if (tstate == nullptr || tstate->cframe == nullptr) return false;
  _PyInterpreterFrame* f = tstate->cframe->current_frame;
#endif
  for (int i = 0; i < kMaxFrames; ++i) {
    while (f != nullptr && _PyFrame_IsIncomplete(f)) f = f->previous;
    if (f == nullptr) break;
    PyCodeObject* code = frame_code(f);
    const FastCode* c = fast_find(tl_codes, code, 0);
    if (c == nullptr) return false;
    if (c->internal) {
      f = f->previous;
      continue;
    }
    const int units = _PyInterpreterFrame_LASTI(f);
    const int lasti = units < 0 ? -1 : units * static_cast<int>(sizeof(_Py_CODEUNIT));
    const FastId* e = fast_find(tl_ids, code, lasti);
    if (e == nullptr) return false;
    *id = e->id;
    return true;
  }
  *id = 0;  // no frame, or kMaxFrames internal ones: what capture_locked returns
  return true;
}
#endif

// Allocation stacks. NOTE: a key is the (code object, instruction offset) of each frame; every
// code object in a key is pinned (one reference, at most kMaxPinnedCodes of them) so a key can
// never match a different, later code object at the same address.
constexpr int kMaxStackFrames = 64;
constexpr size_t kMaxPinnedCodes = 1 << 16;
using StackKey = std::vector<std::pair<const void*, int>>;

struct StackKeyHash {
  size_t operator()(const StackKey& k) const noexcept {
    size_t h = k.size();
    for (const auto& [code, lasti] : k) h = h * 1000003 ^ PairHash()({code, lasti});
    return h;
  }
};

struct StackEntry {
  StackKey key;
  std::vector<StackFrame> frames;
  uint32_t refs = 0;
};

struct StackTable {
  std::mutex mu;
  std::unordered_map<StackKey, uint32_t, StackKeyHash> slots;  // key -> index in entries
  std::vector<StackEntry> entries;
  std::vector<uint32_t> free_slots;
  std::unordered_set<const void*> pinned;  // code objects holding one reference
  uint32_t generation = 1;
  size_t max_entries = SIZE_MAX;
};

StackTable& stack_table() {
  static StackTable* t = new StackTable();  // NOTE: leaked on purpose; blocks die at exit
  return *t;
}

uint64_t stack_id(uint32_t generation, uint32_t slot) {
  return (static_cast<uint64_t>(generation) << 32) | (static_cast<uint64_t>(slot) + 1);
}

// The live entry behind id, or nullptr. Caller holds t.mu.
StackEntry* stack_entry(StackTable& t, uint64_t id) {
  const auto slot = static_cast<uint32_t>(id & 0xFFFFFFFFu);
  if (slot == 0 || (id >> 32) != t.generation || slot > t.entries.size()) return nullptr;
  StackEntry& e = t.entries[slot - 1];
  return e.refs > 0 ? &e : nullptr;
}

// Caller holds the GIL and t.mu; frames are new references, innermost first.
uint64_t stack_intern(StackTable& t, const std::vector<PyFrameObject*>& frames) {
  StackKey key;
  key.reserve(frames.size());
  std::vector<PyCodeObject*> codes;
  for (PyFrameObject* f : frames) {
    codes.push_back(PyFrame_GetCode(f));  // new reference
    key.emplace_back(codes.back(), PyFrame_GetLasti(f));
  }
  uint64_t id = 0;
  auto it = t.slots.find(key);
  if (it != t.slots.end()) {
    ++t.entries[it->second].refs;
    id = stack_id(t.generation, it->second);
  } else if (t.slots.size() < t.max_entries) {
    bool pinnable = true;
    for (PyCodeObject* c : codes) {
      if (!t.pinned.count(c) && t.pinned.size() >= kMaxPinnedCodes) pinnable = false;
    }
    if (pinnable) {
      StackEntry e;
      for (size_t i = 0; i < frames.size(); ++i) {
        if (t.pinned.insert(codes[i]).second) Py_INCREF(codes[i]);
        e.frames.push_back({utf8(codes[i]->co_filename), PyFrame_GetLineNumber(frames[i]),
                            utf8(codes[i]->co_name)});
      }
      e.key = key;
      e.refs = 1;
      uint32_t slot;
      if (!t.free_slots.empty()) {
        slot = t.free_slots.back();
        t.free_slots.pop_back();
        t.entries[slot] = std::move(e);
      } else {
        slot = static_cast<uint32_t>(t.entries.size());
        t.entries.push_back(std::move(e));
      }
      t.slots.emplace(std::move(key), slot);
      id = stack_id(t.generation, slot);
    }
  }
  for (PyCodeObject* c : codes) Py_DECREF(c);
  return id;
}

// Caller holds the GIL.
uint64_t stack_capture_locked() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (!frame) return 0;
  Py_INCREF(frame);
  std::vector<PyFrameObject*> frames;
  while (frame && static_cast<int>(frames.size()) < kMaxStackFrames) {
    frames.push_back(frame);
    frame = PyFrame_GetBack(frame);  // new reference
  }
  Py_XDECREF(frame);
  StackTable& t = stack_table();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    id = stack_intern(t, frames);
  }
  for (PyFrameObject* f : frames) Py_DECREF(f);
  return id;
}

// Runs f with the GIL held when this is a Python thread; 0 otherwise.
template <class F>
uint64_t with_gil(F f) {
  if (!Py_IsInitialized()) return 0;
  if (PyGILState_Check()) return f();
  if (PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE st = PyGILState_Ensure();
  uint64_t r = f();
  PyGILState_Release(st);
  return r;
}

}  // namespace

uint32_t origin_capture() {
  if (!enabled() || !Py_IsInitialized()) return 0;
  const bool has_gil = PyGILState_Check();
#if OPENNEURON_FAST_ORIGIN
  {
    // NOTE: with the GIL held the current thread state is the one PyEval_GetFrame reads.
    PyThreadState* ts = has_gil ? PyThreadState_Get() : PyGILState_GetThisThreadState();
    uint32_t id = 0;
    if (capture_fast(ts, &id)) return id;
  }
#endif
  if (has_gil) return capture_locked();
  // NOTE: PyTorch's bindings release the GIL before dispatch; this thread's frames cannot
  // change meanwhile, so re-taking the GIL briefly reads the user's line.
  if (PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE st = PyGILState_Ensure();
  uint32_t id = capture_locked();
  PyGILState_Release(st);
  return id;
}

uint64_t origin_slow_captures() { return slow_captures.load(std::memory_order_relaxed); }

void origin_install() {
  static std::once_flag once;
  std::call_once(once, [] {
    runtime::origin_set_resolver([](uint32_t id) -> std::string {
      OriginTable& t = origin_table();
      std::lock_guard<std::mutex> lock(t.mu);
      return id < t.texts.size() ? t.texts[id] : std::string();
    });
  });
}

uint64_t stack_capture() { return with_gil(stack_capture_locked); }

void stack_release(uint64_t id) {
  if (id == 0) return;
  StackTable& t = stack_table();
  std::lock_guard<std::mutex> lock(t.mu);
  StackEntry* e = stack_entry(t, id);
  if (e == nullptr || --e->refs > 0) return;
  t.slots.erase(e->key);
  *e = StackEntry();
  t.free_slots.push_back(static_cast<uint32_t>((id & 0xFFFFFFFFu) - 1));
}

std::vector<StackFrame> stack_frames(uint64_t id) {
  StackTable& t = stack_table();
  std::lock_guard<std::mutex> lock(t.mu);
  const StackEntry* e = stack_entry(t, id);
  return e ? e->frames : std::vector<StackFrame>();
}

void stack_configure(size_t max_entries, bool clear) {
  StackTable& t = stack_table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.max_entries = max_entries;
  if (!clear) return;
  ++t.generation;
  t.slots.clear();
  t.entries.clear();
  t.free_slots.clear();
}

size_t stack_entries() {
  StackTable& t = stack_table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.slots.size();
}

}  // namespace openneuron::aten
