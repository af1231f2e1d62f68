// _C's distributed entry points: the backend factory openneuron/distributed.py registers with
// torch.distributed, and this host's identity for co-location.
#include <torch/csrc/utils/pybind.h>

#include <fstream>
#include <string>

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
  m.def(
      "_neuron_backend",
      [](int rank, int size, int64_t timeout_ms, const std::string& group_name,
         const std::string& shm_name, py::object gloo) {
        c10::intrusive_ptr<c10d::Backend> g;
        if (!gloo.is_none()) g = gloo.cast<c10::intrusive_ptr<c10d::Backend>>();
        py::gil_scoped_release no_gil;  // joining waits for the peers
        return distributed::make_backend(rank, size, std::chrono::milliseconds(timeout_ms),
                                         group_name, shm_name, std::move(g));
      },
      py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("group_name"),
      py::arg("shm_name"), py::arg("gloo"));
  m.def("_host_id", &host_id);
}

}  // namespace openneuron::aten
