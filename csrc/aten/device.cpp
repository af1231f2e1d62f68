// Device bindings of openneuron._C (_init, _device_count, _get_device, _synchronize, ...) and
// the runtime's lazy initialization (device.h). The c10 device guard is guard.cpp; the
// PrivateUse1 hooks are hooks.cpp.
#include "aten/device.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "aten/bindings.h"
#include "aten/errors.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/hal.h"
#include "runtime/isa.h"

namespace openneuron::aten {
namespace {

namespace py = pybind11;

std::atomic<bool> g_initialized{false};
std::mutex g_init_mutex;

std::optional<std::string> config_error() {
  try {
    runtime::config();
    return std::nullopt;
  } catch (const runtime::Error& e) {
    return std::string(e.what());
  }
}

std::string props_repr(const runtime::DeviceProps& p) {
  std::ostringstream os;
  os << "_NeuronDeviceProperties(name='" << p.name
     << "', total_memory=" << p.total_memory / (1024 * 1024) << "MB, cores=" << p.cores << ")";
  return os.str();
}

int exchange_device(int device) {
  if (device < 0) return -1;
  return with_torch_errors([&] {
    int previous = runtime::device_current();
    if (previous != device) runtime::device_set_current(device);
    return previous;
  });
}

void synchronize(int device) {
  py::gil_scoped_release no_gil;
  with_torch_errors(
      [&] { runtime::device_synchronize(device < 0 ? runtime::device_current() : device); });
}

py::tuple mem_get_info(int device) {
  uint64_t free = 0, total = 0;
  with_torch_errors([&] {
    runtime::hal().memory_info(device < 0 ? runtime::device_current() : device, &free, &total);
  });
  return py::make_tuple(free, total);
}

}  // namespace

void runtime_init() {
  if (g_initialized.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_initialized.load(std::memory_order_relaxed)) return;
  with_torch_errors([] {
    runtime::config();
    runtime::hal();
  });
  g_initialized.store(true, std::memory_order_release);
}

bool runtime_initialized() { return g_initialized.load(std::memory_order_acquire); }

void bind_device(py::module_& m) {
  m.def(
      "_init",
      [] {
        torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
        runtime_init();
        at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
      },
      "Validates the configuration and creates the devices (idempotent).");
  m.def("_is_initialized", &runtime_initialized);
  m.def("_is_in_bad_fork", [] { return torch::utils::is_device_in_bad_fork(at::kPrivateUse1); });
  m.def(
      "_device_count", [] { return runtime::device_count(); }, "Never raises; 0 if invalid.");
  m.def("_config_error", &config_error, "The configuration error text, or None.");
  m.def(
      "_settings",
      [] {
        std::vector<std::tuple<std::string, std::optional<std::string>, std::string>> out;
        const auto& values = runtime::setting_values();
        for (size_t i = 0; i < runtime::settings().size(); ++i)
          out.emplace_back(runtime::settings()[i].name, values[i], runtime::settings()[i].meaning);
        return out;
      },
      "Every environment variable the backend reads: (name, value as read or None, meaning).");
  m.def(
      "_compile_settings",
      [] {
        const runtime::Config& c = runtime::config_or_defaults();
        return std::make_tuple(c.compile_fallback, c.compile_cache_dir, c.compile_async);
      },
      "torch.compile's settings: (fall back to eager on failure, cache folder or '', compile "
      "in the background).");
  // SIMD variant of the IR and native kernels (runtime/isa.h; OPENNEURON_ISA).
  m.def("_isa", [] { return std::string(runtime::isa_name(runtime::isa())); });
  m.def("_host_isas", [] {
    std::vector<std::string> names;
    for (runtime::Isa i : runtime::host_isas()) names.emplace_back(runtime::isa_name(i));
    return names;
  });
  m.def(
      "_set_isa",
      [](const std::string& name) {
        with_torch_errors([&] {
          if (runtime_initialized())
            for (int d = 0; d < runtime::device_count(); ++d) runtime::device_synchronize(d);
          runtime::set_isa(runtime::parse_isa(name));
        });
      },
      py::arg("name"), "Drains every device, then switches the variant (tests, benchmarks).");
  m.def("_get_device", [] { return runtime::device_current(); });
  m.def(
      "_set_device",
      [](int device) { with_torch_errors([&] { runtime::device_set_current(device); }); },
      py::arg("device"));
  m.def("_exchange_device", &exchange_device, py::arg("device"));
  m.def("_synchronize", &synchronize, py::arg("device") = -1);
  m.def("_mem_get_info", &mem_get_info, py::arg("device") = -1);

  py::class_<runtime::DeviceProps>(m, "_NeuronDeviceProperties")
      .def_readonly("name", &runtime::DeviceProps::name)
      .def_readonly("total_memory", &runtime::DeviceProps::total_memory)
      .def_readonly("cores", &runtime::DeviceProps::cores)
      .def("__repr__", &props_repr);
  m.def(
      "_get_device_properties",
      [](int device) {
        return with_torch_errors(
            [&] { return runtime::device_props(device < 0 ? runtime::device_current() : device); });
      },
      py::arg("device") = -1);
}

}  // namespace openneuron::aten
