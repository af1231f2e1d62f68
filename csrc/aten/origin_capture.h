// Where an op was enqueued from: the first Python frame outside torch/ and openneuron/, captured
// cheaply at dispatch as a small id, and the resolver that turns an id back into
// "train.py:42 in forward" when an asynchronous error is reported (runtime/origin.h); and the
// same machinery for whole allocation stacks (memory snapshots, allocator.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace openneuron::aten {

// The origin id of the calling Python line, 0 if unknown (no Python frame on this thread, or
// OPENNEURON_ORIGIN=0). Takes the GIL briefly if this Python thread released it.
uint32_t origin_capture();
// Installs the resolver into the runtime (idempotent).
void origin_install();
// How many captures took the GIL path (cache misses, or no fast path on this CPython); for tests.
uint64_t origin_slow_captures();

// One Python frame of an allocation stack, as torch.cuda.memory._snapshot() reports it.
struct StackFrame {
  std::string filename;
  int line = 0;
  std::string name;
};
// Interns the calling thread's Python stack (innermost first, at most 64 frames) and returns
// an id holding one reference to it; equal stacks share one entry. 0 when there is no Python
// frame, the thread is not a Python thread, or the table holds stack_configure's maximum of
// live entries. Takes the GIL briefly if this Python thread released it.
uint64_t stack_capture();
// Drops one reference (0 is ignored); the entry is recycled when none is left. Any thread;
// never takes the GIL.
void stack_release(uint64_t id);
// The frames of a live id; empty for 0, a released id, or one from before a clear. Any thread;
// never takes the GIL.
std::vector<StackFrame> stack_frames(uint64_t id);
// At most max_entries live entries from now on; clear forgets every entry (ids still held by
// blocks then resolve to no frames). Thread-safe.
void stack_configure(size_t max_entries, bool clear);
// Live entries (for tests and bounds checks).
size_t stack_entries();

}  // namespace openneuron::aten
