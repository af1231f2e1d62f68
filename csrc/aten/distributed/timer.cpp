// DDP's timer for neuron modules (c10d::TimerRegistry; CUDA has one, CPU has one): DDP records
// forward / backward / communication events every iteration for its logging data
// (`model._get_ddp_logging_data()`), and without a timer for the device warns on every run
// ("Time stats are currently only collected for CPU and CUDA devices"). As CUDA's, it records
// timing events on the current stream and measures between them once both have been reached.
#include <array>
#include <optional>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "runtime/event.h"
#include "runtime/stream.h"

namespace openneuron::aten::distributed {
namespace {

class NeuronTimer : public c10d::Timer {
 public:
  explicit NeuronTimer(c10::Device device) : device_(device.index() < 0 ? 0 : device.index()) {}

  void record(Event event) override {
    Timer::record(event);  // the host timestamp DDP also reads
    runtime::Event& e = event_of(event);
    e.record(runtime::stream_current(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    if (!getTimestamp(start) || !getTimestamp(end)) return std::nullopt;
    runtime::Event& a = event_of(start);
    runtime::Event& b = event_of(end);
    // NOTE: like CUDA's, never waits: not reached yet means not measured this iteration.
    if (!a.query() || !b.query()) return std::nullopt;
    const double ms = a.elapsed_ms(b);
    if (ms < 0) return std::nullopt;  // recorded out of order on two streams
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  runtime::Event& event_of(Event event) { return events_[static_cast<size_t>(event)]; }

  c10::DeviceIndex device_;
  std::array<runtime::Event, 5> events_{
      runtime::Event(runtime::kEventTiming), runtime::Event(runtime::kEventTiming),
      runtime::Event(runtime::kEventTiming), runtime::Event(runtime::kEventTiming),
      runtime::Event(runtime::kEventTiming)};
};

}  // namespace
}  // namespace openneuron::aten::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1,
                         openneuron::aten::distributed::NeuronTimer);
}  // namespace c10d
