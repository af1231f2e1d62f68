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
    : event_(std::exchange(o.event_, nullptr)),
      device_(std::exchange(o.device_, -1)),
      capture_(std::exchange(o.capture_, 0)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    std::swap(event_, o.event_);
    std::swap(device_, o.device_);
    std::swap(capture_, o.capture_);
  }
  return *this;
}

void Event::record(const Stream& s) {
  run_flush_hook(FlushPoint::kEventRecord);
  device_ = s.device();
  capture_ = graph_capture_id(s);
  if (capture_ != 0) return;  // a point in the capture: the graph's order is the edge
  hal().event_record(event_, s.hal_stream());
}

void Event::block(const Stream& s) const {
  run_flush_hook(FlushPoint::kEventWait);
  const uint64_t own = graph_capture_id(s);
  if (capture_ != 0) {
    if (own == capture_) return;  // queued after the record in the same capture
    if (own == 0) {
      graph_join_capture(capture_, s);  // false: the capture ended, nothing to wait for
      return;
    }
    if (!graph_capture_active(capture_)) return;
    stream_capture_graph(s)->fail(
        "a stream capturing a neuron graph waited on an event recorded in another graph's "
        "capture (one capture cannot wait on another)");
  }
  if (own != 0) {
    stream_capture_graph(s)->fail(
        "a stream capturing a neuron graph waited on an event recorded outside the capture "
        "(make the capture stream wait before capture_begin)");
  }
  hal().stream_wait_event(s.hal_stream(), event_);
}

bool Event::query() const {
  run_flush_hook(FlushPoint::kEventQuery);
  return event_ == nullptr || capture_ != 0 || hal().event_query(event_);
}

void Event::synchronize() const {
  run_flush_hook(FlushPoint::kEventSync);
  if (event_ != nullptr && capture_ == 0) hal().event_sync(event_);
}

float Event::elapsed_ms(const Event& end) const {
  return hal().event_elapsed_ms(event_, end.event_);
}

}  // namespace openneuron::runtime
