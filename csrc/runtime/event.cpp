// Event: the owning handle over a HAL event (record, block, query, synchronize, elapsed time).
// What a record means lives in the HAL (software_core.cpp); this file only forwards and tracks
// the device of the latest record.
#include "event.h"

#include <string>
#include <utility>

#include "graph.h"

namespace openneuron::runtime {

Event::Event(unsigned flags) : event_(hal().event_create(flags)) {}

Event::~Event() {
  if (event_ != nullptr) hal().event_destroy(event_);
}

Event::Event(Event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(std::exchange(o.device_, -1)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    std::swap(event_, o.event_);
    std::swap(device_, o.device_);
  }
  return *this;
}

void Event::record(const Stream& s) {
  run_flush_hook(FlushPoint::kEventRecord);
  if (Graph* g = stream_capture_graph(s)) {
    g->fail(
        "an event recorded on a stream capturing a neuron graph (events inside a graph "
        "are not supported; record before the capture or after replay())");
  }
  hal().event_record(event_, s.hal_stream());
  device_ = s.device();
}

void Event::block(const Stream& s) const {
  run_flush_hook(FlushPoint::kEventWait);
  if (Graph* g = stream_capture_graph(s)) {
    g->fail(
        "a stream capturing a neuron graph waiting on an event (make the capture stream "
        "wait before capture_begin)");
  }
  hal().stream_wait_event(s.hal_stream(), event_);
}

bool Event::query() const {
  run_flush_hook(FlushPoint::kEventQuery);
  return event_ == nullptr || hal().event_query(event_);
}

void Event::synchronize() const {
  run_flush_hook(FlushPoint::kEventSync);
  if (event_ != nullptr) hal().event_sync(event_);
}

float Event::elapsed_ms(const Event& end) const {
  return hal().event_elapsed_ms(event_, end.event_);
}

}  // namespace openneuron::runtime
