// How a traced NKI kernel (DESIGN §8) reaches the device: the Python tracer
// (openneuron/nki/_trace.py) encodes its instruction program once; here it becomes an
// nki::Program (csrc/nki) that a launch runs over neuron tensors, queued on the current stream
// like any op (asynchronous; errors at the next sync, naming the kernel), or synchronously over
// host buffers (numpy arrays, as NKI's simulator takes). Tensors are never captured: only their
// device pointers.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "aten/bindings.h"
#include "aten/generator.h"
#include "aten/ops/enqueue.h"
#include "nki/program.h"

namespace openneuron::aten {
namespace {

namespace py = pybind11;

// Work items keep their name's pointer: kernel names are interned for the process.
const char* nki_intern_name(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.insert("nki:" + name).first->c_str();
}

struct NkiProgramHandle {
  std::shared_ptr<const nki::Program> program;
  const char* work_name;
};

// The program's slots, checked against the buffers' sizes: a launch never lets the executor
// address past a buffer even if a tensor changed since the trace.
void nki_check_slot(const nki::Program& p, size_t i, int64_t bytes) {
  if (bytes < p.slot_bytes[i])
    throw std::invalid_argument("nki kernel '" + p.name + "': argument " + std::to_string(i) +
                                " has " + std::to_string(bytes) + " bytes; the traced program " +
                                "needs " + std::to_string(p.slot_bytes[i]));
}

void nki_launch(const NkiProgramHandle& h, const std::vector<at::Tensor>& buffers) {
  const nki::Program& p = *h.program;
  if (buffers.size() + 1 != p.slot_bytes.size())
    throw std::invalid_argument("nki kernel '" + p.name + "': expected " +
                                std::to_string(p.slot_bytes.size() - 1) + " buffers, got " +
                                std::to_string(buffers.size()));
  std::vector<void*> slots;
  c10::optional<c10::Device> device;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const at::Tensor& t = buffers[i];
    if (!t.device().is_privateuseone() || !t.is_contiguous())
      throw std::invalid_argument("nki kernel '" + p.name + "': argument " + std::to_string(i) +
                                  " must be a contiguous neuron tensor, got " + t.device().str());
    if (device && *device != t.device())
      throw std::invalid_argument("nki kernel '" + p.name + "': arguments on " + device->str() +
                                  " and " + t.device().str());
    device = t.device();
    nki_check_slot(p, i, static_cast<int64_t>(t.nbytes()));
    slots.push_back(t.numel() == 0 ? nullptr : t.data_ptr());
  }
  slots.push_back(nullptr);  // the arena: the executor's, per thread
  if (!device) throw std::invalid_argument("nki kernel '" + p.name + "': no neuron tensor");
  uint64_t seed = 0;
  if (p.random) {  // drawn when queued, as a random ATen op takes its state at dispatch
    NeuronGenerator* gen = generator_or_default(std::nullopt, device->index());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    const PhiloxState st = gen->philox_state(4);
    seed = st.seed * 0x9E3779B97F4A7C15ull + st.offset;
  }
  enqueue_op(
      *device, h.work_name,
      [program = h.program, slots = std::move(slots), seed] {
        nki::program_run(*program, slots.data(), seed);
      },
      origin_capture(), !p.random);
}

void nki_run_host(const NkiProgramHandle& h, const std::vector<uintptr_t>& addresses,
                  const std::vector<int64_t>& sizes) {
  const nki::Program& p = *h.program;
  if (addresses.size() + 1 != p.slot_bytes.size() || sizes.size() != addresses.size())
    throw std::invalid_argument("nki kernel '" + p.name + "': wrong number of buffers");
  std::vector<void*> slots;
  for (size_t i = 0; i < addresses.size(); ++i) {
    nki_check_slot(p, i, sizes[i]);
    slots.push_back(reinterpret_cast<void*>(addresses[i]));
  }
  slots.push_back(nullptr);
  uint64_t seed = 0;
  if (p.random) {  // numpy arrays: the CPU generator, so torch.manual_seed reproduces a run
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    seed = gen.get<at::CPUGeneratorImpl>()->random64();
  }
  py::gil_scoped_release no_gil;
  nki::program_run(p, slots.data(), seed);
}

py::dict nki_tables() {
  py::dict ops, dtypes;
  for (int i = 0; i < static_cast<int>(nki::Op::kCount); ++i) {
    const auto op = static_cast<nki::Op>(i);
    ops[nki::op_name(op)] = py::make_tuple(i, nki::op_arity(op));
  }
  for (int i = 0; i < static_cast<int>(nki::DType::kCount); ++i) {
    const auto dt = static_cast<nki::DType>(i);
    dtypes[nki::dtype_name(dt)] = py::make_tuple(i, nki::dtype_size(dt));
  }
  py::dict out;
  out["ops"] = ops;
  out["dtypes"] = dtypes;
  out["max_dims"] = nki::kMaxDims;
  out["max_registers"] = nki::kMaxRegisters;
  return out;
}

void nki_host_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // CPU tensors over the caller's buffers (nothing owned, nothing copied): c (+)= a^T b.
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor at_a = at::from_blob(const_cast<float*>(a), {K, M}, {lda, 1}, f32);
  at::Tensor at_b = at::from_blob(const_cast<float*>(b), {K, N}, {ldb, 1}, f32);
  at::Tensor at_c = at::from_blob(c, {M, N}, {ldc, 1}, f32);
  if (accumulate)
    at_c.addmm_(at_a.t(), at_b);
  else
    at::mm_out(at_c, at_a.t(), at_b);
}

}  // namespace

void bind_nki(py::module_& m) {
  nki::set_gemm_backend(&nki_host_gemm);
  py::class_<NkiProgramHandle>(m, "_NkiProgram")
      .def(py::init([](py::buffer code, const std::string& name, std::vector<std::string> lines) {
             py::buffer_info info = code.request();
             if (info.itemsize != 8 || info.ndim != 1)
               throw std::invalid_argument("nki program: expected a 1-d int64 buffer");
             nki::Program* p =
                 nki::program_parse(static_cast<const int64_t*>(info.ptr),
                                    static_cast<size_t>(info.shape[0]), name, std::move(lines));
             return NkiProgramHandle{std::shared_ptr<const nki::Program>(p), nki_intern_name(name)};
           }),
           py::arg("code"), py::arg("name"), py::arg("lines"))
      .def_property_readonly("n_instrs",
                             [](const NkiProgramHandle& h) { return h.program->n_instrs; })
      .def_property_readonly("n_instances",
                             [](const NkiProgramHandle& h) { return h.program->instances.size(); })
      .def_property_readonly(
          "arena_bytes", [](const NkiProgramHandle& h) { return h.program->slot_bytes.back(); });
  m.def("_nki_launch", &nki_launch);
  m.def("_nki_run_host", &nki_run_host);
  m.def("_nki_tables", &nki_tables);
}

}  // namespace openneuron::aten
