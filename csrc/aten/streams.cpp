// Stream bindings of openneuron._C: the calling thread's current stream, a device's default
// stream, and set_stream, as (stream_id, device_index, device_type) triples that torch.Stream
// takes; graph capture (`_NeuronGraph`, runtime/graph.h) on the current stream.
// Conversions live in streams.h; the c10 guard (guard.cpp) serves torch.Stream itself.
#include "aten/streams.h"

#include <pybind11/pybind11.h>

#include "aten/bindings.h"
#include "aten/errors.h"
#include "aten/generator.h"
#include "runtime/graph.h"

namespace openneuron::aten {
namespace {

namespace py = pybind11;

py::tuple stream_triple(const runtime::Stream& s) {
  return py::make_tuple(s.id(), s.device(), static_cast<int>(c10::DeviceType::PrivateUse1));
}

void set_stream(int64_t stream_id, int device_index, int device_type) {
  TORCH_CHECK(device_type == static_cast<int>(c10::DeviceType::PrivateUse1),
              "set_stream: expected a neuron stream, got one of device type ",
              c10::DeviceTypeName(static_cast<c10::DeviceType>(device_type)));
  with_torch_errors([&] {
    int device = device_index < 0 ? runtime::device_current() : device_index;
    runtime::Stream s = runtime::stream_from_id(device, stream_id);
    // NOTE: as torch.cuda.set_stream, setting a stream also makes its device current.
    if (runtime::device_current() != device) runtime::device_set_current(device);
    runtime::stream_set_current(s);
  });
}

}  // namespace

void bind_streams(py::module_& m) {
  m.def(
      "_current_stream",
      [](int device) {
        return stream_triple(with_torch_errors(
            [&] { return current_runtime_stream(static_cast<c10::DeviceIndex>(device)); }));
      },
      py::arg("device") = -1);
  m.def(
      "_default_stream",
      [](int device) {
        return stream_triple(with_torch_errors([&] {
          return runtime::stream_default(device < 0 ? runtime::device_current() : device);
        }));
      },
      py::arg("device") = -1);
  m.def("_set_stream", &set_stream, py::arg("stream_id"), py::arg("device_index"),
        py::arg("device_type"));
  bind_graphs(m);
}

void bind_graphs(py::module_& m) {
  using runtime::Graph;
  // NOTE: the GIL is released where a call may wait for the device (a full queue, the last
  // replay before a reset); captured work never needs it.
  py::class_<Graph>(m, "_NeuronGraph")
      .def(py::init<>())
      .def(
          "capture_begin",
          [](Graph& g, uint64_t pool) {
            with_torch_errors([&] { g.capture_begin(current_runtime_stream(-1), pool); });
          },
          py::arg("pool") = 0)
      .def("capture_end", [](Graph& g) { with_torch_errors([&] { g.capture_end(); }); })
      .def(
          "replay",
          [](Graph& g) {
            with_torch_errors([&] {
              // The generator state its random ops draw from, taken now, as each op would.
              runtime::ReplayRng rng;
              if (g.rng_increment() > 0) {
                NeuronGenerator* gen = generator_or_default(std::nullopt, g.device());
                std::lock_guard<std::mutex> lock(gen->mutex_);
                const PhiloxState st = gen->philox_state(g.rng_increment());
                rng = {st.seed, st.offset};
              }
              g.replay(current_runtime_stream(-1), rng);
            });
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "reset", [](Graph& g) { with_torch_errors([&] { g.reset(); }); },
          py::call_guard<py::gil_scoped_release>())
      .def("pool", &Graph::pool)
      .def("num_items", &Graph::num_items)
      .def("captured", &Graph::captured);
  m.def("_graph_pool_create", &runtime::graph_pool_create);
  m.def(
      "_stream_capturing",
      [](int64_t stream_id, int device) {
        return with_torch_errors([&] {
          const runtime::Stream s = runtime::stream_from_id(
              resolve_device(static_cast<c10::DeviceIndex>(device)), stream_id);
          return runtime::stream_capture_graph(s) != nullptr;
        });
      },
      py::arg("stream_id"), py::arg("device") = -1);
}

}  // namespace openneuron::aten
