// The one way an op's work reaches a stream: a work item named after the op, tagged with the
// calling Python line (origin_capture: 0 unless OPENNEURON_ORIGIN is on), queued with runtime
// errors raised as torch errors. A c10::Error the work throws becomes a plain error (its message
// without the C++ backtrace), reported asynchronously at the next sync as on CUDA.
// NOTE: fn captures raw device pointers / host views only, never tensors (stream-ordered frees
// keep the memory valid until the work has run, as on CUDA; see host_views.h).
// replayable: fn may run again with the same effect, so a graph may capture it
// (runtime/graph.h); false for work that consumes state or takes a per-launch value (a random
// seed), which a capturing stream then rejects with an error naming the op.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

#include "aten/errors.h"
#include "aten/origin_capture.h"
#include "runtime/stream.h"

namespace openneuron::aten {

// name: static storage (the trace and error reports keep the pointer).
template <class F>
void enqueue_op(const runtime::Stream& stream, const char* name, F&& fn,
                uint32_t origin = origin_capture(), bool replayable = true) {
  runtime::Work work;
  work.name = name;
  work.origin = origin;
  work.replayable = replayable;
  work.fn = [fn = std::forward<F>(fn)]() mutable {
    try {
      fn();
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  };
  with_torch_errors([&] { stream.enqueue(std::move(work)); });
}

// On the current stream of `device`.
template <class F>
void enqueue_op(c10::Device device, const char* name, F&& fn, uint32_t origin = origin_capture(),
                bool replayable = true) {
  enqueue_op(runtime::stream_current(device.index()), name, std::forward<F>(fn), origin,
             replayable);
}

}  // namespace openneuron::aten
