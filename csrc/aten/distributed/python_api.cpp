// _C's distributed entry points: the backend factory openneuron/distributed.py registers with
// torch.distributed, the split factory it gives the backend, and this host's identity for
// co-location.
#include <torch/csrc/utils/pybind.h>

#include <fstream>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "aten/bindings.h"
#include "aten/distributed/backend.h"
#include "runtime/config.h"

namespace openneuron::aten {

namespace {

// OPENNEURON_HOST_ID, else hostname + boot id: ranks with equal ids share memory.
std::string host_id() {
  const std::string& forced = runtime::config().host_id;
  if (!forced.empty()) return forced;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(name) + "/" + boot;
}

}  // namespace

void bind_distributed(pybind11::module_& m) {
  namespace py = pybind11;
  using distributed::NeuronBackendOptions;
  m.def(
      "_neuron_backend",
      [](int rank, int size, int64_t timeout_ms, const std::string& group_name,
         const std::string& shm, int local_size, py::object gloo, py::object leaders) {
        distributed::Transports t;
        t.shm = shm;
        t.local_size = local_size;
        if (!gloo.is_none()) t.gloo = gloo.cast<c10::intrusive_ptr<c10d::Backend>>();
        if (!leaders.is_none()) t.leaders = leaders.cast<c10::intrusive_ptr<c10d::Backend>>();
        py::gil_scoped_release no_gil;  // joining waits for the peers
        return distributed::make_backend(rank, size, std::chrono::milliseconds(timeout_ms),
                                         group_name, t);
      },
      py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("group_name"), py::kw_only(),
      py::arg("shm") = "", py::arg("local_size") = 0, py::arg("gloo") = py::none(),
      py::arg("leaders") = py::none());
  m.def("_host_id", &host_id);
  // split_group / DeviceMesh: NeuronBackend::split calls back into the Python rendezvous.
  m.def("_set_split_factory", [](py::function fn) {
    auto shared =
        std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
          // NOTE: dropped only while Python runs (never at exit: the factory is leaked).
          py::gil_scoped_acquire gil;
          delete f;
        });
    distributed::set_split_factory([shared](const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, std::chrono::milliseconds timeout,
                                            const std::string& name) {
      py::gil_scoped_acquire gil;
      py::object b = (*shared)(store, rank, size, timeout.count(), name);
      return b.cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  });
  // The backend's Python type (what pg._get_backend(device) returns): split_group reads
  // `options` from it.
  py::class_<distributed::NeuronBackend, c10d::Backend,
             c10::intrusive_ptr<distributed::NeuronBackend>>(m, "_NeuronBackend")
      .def_property_readonly("options", &distributed::NeuronBackend::getBackendOptions)
      // NOTE: new_group calls this on the ranks left out when the default group has a bound
      // device (NCCL's communicators split collectively); a "neuron" group is made by its
      // members alone.
      .def("perform_nocolor_split", [](distributed::NeuronBackend&, const at::Device&) {});
  // What getBackendOptions() returns; split_group deep-copies it.
  py::class_<NeuronBackendOptions, c10d::Backend::Options,
             c10::intrusive_ptr<NeuronBackendOptions>>(m, "_NeuronBackendOptions")
      .def("__copy__",
           [](const NeuronBackendOptions& o) {
             return c10::make_intrusive<NeuronBackendOptions>(o);
           })
      .def("__deepcopy__", [](const NeuronBackendOptions& o, py::dict) {
        return c10::make_intrusive<NeuronBackendOptions>(o);
      });
}

}  // namespace openneuron::aten
