// The PyTorch profiler on neuron devices, both of PyTorch's PrivateUse1 paths:
// - torch.profiler.profile(activities=[CPU, PrivateUse1]) (KINETO_PRIVATEUSE1): a kineto
//   activity profiler (REGISTER_PRIVATEUSE1_PROFILER) turns the runtime's device trace
//   (runtime/trace.h: one record per work item, timed on the executor) into kernel activities,
//   one trace row per device stream ("neuron:0 stream 0"), linked to the host op that enqueued
//   them by correlation id, so key_averages() shows device time per op.
// - torch.autograd.profiler.profile(use_device="neuron", use_kineto=False) (the legacy
//   KINETO_PRIVATEUSE1_FALLBACK path): ProfilerStubs recording timing events on the current
//   stream around each host op.
#include <c10/util/ApproximateClock.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/profiler/stubs/base.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aten/bindings.h"
#include "aten/errors.h"
#include "runtime/device.h"
#include "runtime/event.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

// NOTE: the installed torch is built with kineto (torch.autograd.profiler.kineto_available());
// its PrivateUse1 profiler registry is declared only under USE_KINETO.
// NOTE: kineto's inline GenericTraceActivity code formats with fmt, whose compiled part torch
// does not export: use fmt header-only here (before any fmt include; pch.h has none).
#ifndef USE_KINETO
#define USE_KINETO 1
#endif
#define FMT_HEADER_ONLY 1
#include <kineto/libkineto.h>
#include <kineto/output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

namespace openneuron::aten {
namespace {

namespace py = pybind11;
namespace trace = runtime::trace;

// Work items that are bookkeeping, not device work: not shown as kernels.
bool is_bookkeeping(const char* name) {
  return std::strcmp(name, "event record") == 0 || std::strcmp(name, "event wait") == 0;
}

const char* display_name(const char* name) {
  return name == nullptr || *name == '\0' ? "neuron work" : name;
}

// The host-side launch event of each device op (the CUDA equivalent: cudaLaunchKernel).
constexpr const char* kLaunchName = "neuron enqueue";

libkineto::ActivityType activity_type(const char* name) {
  return std::strncmp(name, "memcpy", 6) == 0 ? libkineto::ActivityType::GPU_MEMCPY
                                              : libkineto::ActivityType::CONCURRENT_KERNEL;
}

std::string stream_row_name(int32_t device, int32_t stream) {
  return "neuron:" + std::to_string(device) + " stream " + std::to_string(stream);
}

libkineto::DeviceInfo device_info(int32_t device) {
  return libkineto::DeviceInfo{device, device, "neuron:" + std::to_string(device),
                               "neuron:" + std::to_string(device)};
}

// ---- kineto: ProfilerActivity.PrivateUse1 ------------------------------------------------

class NeuronProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  NeuronProfilerSession() = default;
  ~NeuronProfilerSession() override {
    // A session dropped while recording (profiler torn down early) must not leave tracing on.
    if (recording_) trace::session_stop(start_ns_);
  }

  void start() override {
    if (recording_) return;
    start_ns_ = trace::session_start();
    recording_ = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (!recording_) return;
    // NOTE: no synchronize here: torch's profiler synchronizes the current device before it
    // stops (a sync point here would consume the user's asynchronous errors). Work still
    // queued on other devices when the session stops is not recorded.
    dropped_ = trace::dropped();
    records_ = trace::session_stop(start_ns_);
    end_ns_ = trace::now_ns();
    recording_ = false;
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    std::vector<std::string> out = errors_;
    if (dropped_ > 0) {
      out.push_back("neuron profiler: " + std::to_string(dropped_) +
                    " device events dropped (trace buffer full); raise "
                    "OPENNEURON_PROFILER_MAX_EVENTS");
    }
    return out;
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t window_start, int64_t window_end) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "neuron");
    buffer_->gpuOpCount = 0;
    for (const trace::Record& r : records_) {
      const char* name = display_name(r.name);
      if (is_bookkeeping(name) || r.device < 0) continue;
      if (window_end > window_start && (r.end_ns < window_start || r.start_ns > window_end)) {
        continue;
      }
      const auto key = std::make_pair(r.device, r.stream);
      if (std::find(rows_.begin(), rows_.end(), key) == rows_.end()) rows_.push_back(key);
      buffer_->emplace_activity(buffer_->span, activity_type(name), std::string(name));
      libkineto::GenericTraceActivity& act =
          libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
      act.startTime = r.start_ns;
      act.endTime = r.end_ns;
      act.device = r.device;
      act.resource = r.stream;
      act.id = static_cast<int32_t>(r.correlation);
      act.addMetadata("device", r.device);
      act.addMetadata("stream", r.stream);
      act.addMetadata("op seq", r.seq);
      // NOTE: one host op may launch several device ops (a fused group flushed inside it, an
      // op and its copy): they share its correlation id, so each launch->kernel arrow gets
      // its own flow id (PyTorch warns about duplicate flow starts otherwise).
      const bool launched = r.correlation != 0 && r.enqueue_ns != 0;
      const uint32_t flow = launched ? next_flow_++ : 0;
      if (r.correlation != 0) {
        act.addMetadata("correlation", r.correlation);
        if (linked) act.linked = linked(static_cast<int32_t>(r.correlation));
      }
      if (launched) {
        act.flow.id = flow;
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = false;
      }
      ++buffer_->gpuOpCount;
      logger.handleActivity(act);
      if (launched) add_launch(r, flow, linked, logger);
    }
    records_.clear();
    records_.shrink_to_fit();
    // NOTE: kineto asks a session for one process row (getDeviceInfo: the first device used);
    // the other devices' rows are named here. Rows: pid = device index, tid = stream.
    std::sort(rows_.begin(), rows_.end());
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (i > 0 && rows_[i].first != rows_[i - 1].first) {
        logger.handleDeviceInfo(device_info(rows_[i].first), start_ns_);
      }
    }
  }

  // The host side of a device op: a runtime activity on the enqueuing thread's row, where
  // the flow arrow to the kernel starts (as cudaLaunchKernel on CUDA).
  void add_launch(const trace::Record& r, uint32_t flow,
                  const libkineto::getLinkedActivityCallback& linked,
                  libkineto::ActivityLogger& logger) {
    buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::PRIVATEUSE1_RUNTIME,
                              std::string(kLaunchName));
    libkineto::GenericTraceActivity& act =
        libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
    act.startTime = r.enqueue_ns;
    act.endTime = r.enqueue_ns;
    act.device = static_cast<int32_t>(getpid());
    act.resource = r.host_thread;
    act.threadId = r.host_thread;
    act.id = static_cast<int32_t>(r.correlation);
    act.addMetadata("correlation", r.correlation);
    act.flow.id = flow;
    act.flow.type = libkineto::kLinkAsyncCpuGpu;
    act.flow.start = true;
    if (linked) act.linked = linked(static_cast<int32_t>(r.correlation));
    logger.handleActivity(act);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        device_info(rows_.empty() ? 0 : rows_.front().first));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : rows_) {
      out.push_back(
          libkineto::ResourceInfo{stream, stream, device, stream_row_name(device, stream)});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  void pushCorrelationId(uint64_t id) override { trace::push_correlation(id); }
  void popCorrelationId() override { trace::pop_correlation(); }

  std::string getDeviceProperties() override { return ""; }

 private:
  bool recording_ = false;
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  size_t dropped_ = 0;
  uint32_t next_flow_ = 1;
  std::vector<trace::Record> records_;
  std::vector<std::pair<int32_t, int32_t>> rows_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    // Only when device activities were asked for (ProfilerActivity.PrivateUse1).
    const bool wanted = types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0 ||
                        types.count(libkineto::ActivityType::GPU_MEMCPY) > 0;
    if (!wanted) return nullptr;
    return std::make_unique<NeuronProfilerSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  const std::string name_ = "neuron";
  const std::set<libkineto::ActivityType> activities_ = {libkineto::ActivityType::CONCURRENT_KERNEL,
                                                         libkineto::ActivityType::GPU_MEMCPY};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

// ---- legacy: ProfilerStubs (use_device="neuron" without kineto device tracing) -----------

struct NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    with_torch_errors([&] {
      const runtime::DeviceIndex d = runtime::device_current();
      if (device != nullptr) *device = static_cast<c10::DeviceIndex>(d);
      auto e = std::make_unique<runtime::Event>(runtime::kEventTiming);
      e->record(runtime::stream_current(d));
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
      *event = std::shared_ptr<void>(e.release(),
                                     [](void* p) { delete static_cast<runtime::Event*>(p); });
    });
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    auto* ea = static_cast<runtime::Event*>(a->get());
    auto* eb = static_cast<runtime::Event*>(b->get());
    return with_torch_errors([&] {
      ea->synchronize();
      eb->synchronize();
      return ea->elapsed_ms(*eb) * 1000.0f;  // microseconds, as the CUDA stubs
    });
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const runtime::DeviceIndex prev = with_torch_errors([] { return runtime::device_current(); });
    for (int d = 0; d < runtime::device_count(); ++d) {
      with_torch_errors([&] { runtime::device_set_current(d); });
      op(d);
    }
    with_torch_errors([&] { runtime::device_set_current(prev); });
  }

  void synchronize() const override {
    with_torch_errors([] {
      for (int d = 0; d < runtime::device_count(); ++d) runtime::device_synchronize(d);
    });
  }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
RegisterStubs register_stubs;

}  // namespace

void bind_profiler(py::module_& m) {
  m.def(
      "_profiler_trace_size", [] { return trace::size(); },
      "Device trace records held now (0 when no profiling session is active).");
  m.def(
      "_profiler_trace_dropped", [] { return trace::dropped(); },
      "Device trace records dropped since the outermost session began (buffer full).");
  m.def(
      "_profiler_sessions", [] { return trace::sessions(); }, "Active device trace sessions.");
  m.def(
      "_profiler_kineto_registered",
      [] { return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory(); },
      "True when the neuron activity profiler is registered with PyTorch's kineto.");
}

}  // namespace openneuron::aten
