// Events: markers in a stream's queue, for cross-stream ordering and timing. Owning RAII
// handle over a HAL event; not copyable, movable.
#pragma once

#include "hal.h"
#include "stream.h"

namespace openneuron::runtime {

class Event {
 public:
  explicit Event(unsigned flags = kEventDefault);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;

  // On a stream capturing a graph: a point in the capture (graph.h), nothing on the device.
  void record(const Stream& s);
  // Work enqueued on s from now on waits for this event's latest record. A record inside a
  // capture: s joins that capture (or, capturing it, needs nothing); after the capture ended,
  // nothing to wait for.
  void block(const Stream& s) const;
  bool query() const;        // true if never recorded or the latest record has been reached
  void synchronize() const;  // sync point (none for a record inside a capture)
  // Milliseconds from this event's record to end's; both need kEventTiming and must be reached.
  float elapsed_ms(const Event& end) const;
  // Device of the latest record; -1 if never recorded.
  DeviceIndex device() const { return device_; }
  HalEvent* hal_event() const { return event_; }

 private:
  HalEvent* event_ = nullptr;
  DeviceIndex device_ = -1;
  uint64_t capture_ = 0;  // the capture the latest record is a point of (0: on the device)
};

}  // namespace openneuron::runtime
