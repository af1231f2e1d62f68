// The PrivateUse1 device guard: current device, streams and events for c10 (DeviceGuard,
// StreamGuard, torch.Stream, torch.Event, autograd's stream handling all go through here).
// A c10 event handle is a runtime::Event*, created on first record. Not the Python bindings
// (device.cpp, streams.cpp) nor the allocator (allocator.cpp).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "aten/allocator.h"
#include "aten/errors.h"
#include "aten/streams.h"
#include "runtime/device.h"
#include "runtime/event.h"

namespace openneuron::aten {
namespace {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

class NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNeuron, "neuron device guard got a ", d.type(), " device");
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }

  c10::Device getDevice() const override { return neuron_device(runtime::device_current()); }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNeuron, "neuron device guard got a ", d.type(), " device");
    with_torch_errors([&] { runtime::device_set_current(resolve_device(d.index())); });
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      runtime::device_set_current(resolve_device(d.index()));
    } catch (...) {
      // NOTE: called from guard destructors restoring a device that was valid; nothing to do.
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    return with_torch_errors([&] { return to_c10(current_runtime_stream(d.index())); });
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return with_torch_errors(
        [&] { return to_c10(runtime::stream_default(resolve_device(d.index()))); });
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? runtime::kStreamPriorityHigh : 0);
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return with_torch_errors(
        [&] { return to_c10(runtime::stream_from_pool(resolve_device(d.index()), priority)); });
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    return with_torch_errors([&] {
      runtime::Stream next = to_runtime(s);
      runtime::Stream old = runtime::stream_current(next.device());
      runtime::stream_set_current(next);
      return to_c10(old);
    });
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(runtime::device_count());
  }

  bool queryStream(const c10::Stream& s) const override {
    return with_torch_errors([&] { return to_runtime(s).query(); });
  }

  void synchronizeStream(const c10::Stream& s) const override {
    with_torch_errors([&] { to_runtime(s).synchronize(); });
  }

  void synchronizeDevice(c10::DeviceIndex d) const override {
    with_torch_errors([&] { runtime::device_synchronize(resolve_device(d)); });
  }

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device_index,
              c10::EventFlag flag) const override {
    TORCH_CHECK(
        device_index == -1 || device_index == stream.device_index(),
        "event of neuron:", static_cast<int>(device_index),
        " cannot be recorded on a stream of neuron:", static_cast<int>(stream.device_index()));
    with_torch_errors([&] {
      auto* e = static_cast<runtime::Event*>(*event);
      if (e == nullptr) {
        unsigned flags = flag == c10::EventFlag::BACKEND_DEFAULT ? runtime::kEventTiming
                                                                 : runtime::kEventDefault;
        e = new runtime::Event(flags);
        *event = e;
      }
      e->record(to_runtime(stream));
    });
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    with_torch_errors([&] { static_cast<runtime::Event*>(event)->block(to_runtime(stream)); });
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    return with_torch_errors([&] { return static_cast<runtime::Event*>(event)->query(); });
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    with_torch_errors([&] { static_cast<runtime::Event*>(event)->synchronize(); });
  }

  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    try {
      delete static_cast<runtime::Event*>(event);
    } catch (...) {
      // NOTE: destroy must not throw (c10 calls it from destructors).
    }
  }

  double elapsedTime(void* start, void* end, c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "elapsed_time needs both events recorded first (call event.record()).");
    return with_torch_errors([&] {
      return static_cast<double>(
          static_cast<runtime::Event*>(start)->elapsed_ms(*static_cast<runtime::Event*>(end)));
    });
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    allocator_record_data_ptr(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace
}  // namespace openneuron::aten
