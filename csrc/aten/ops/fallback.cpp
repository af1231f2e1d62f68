// The boxed PrivateUse1 fallback: every ATen op without a native neuron kernel lands here
// (DESIGN §3 paths 3 and 4). Async path: outputs sized by the meta kernel (cached), allocated
// on the device, and one work item runs the CPU kernel on zero-copy host views. Synchronous
// path (sync_fallback.cpp) for ops the async path cannot size. Native kernels: factories.cpp,
// views.cpp, copy.cpp.
#include "aten/ops/fallback.h"

#include <ATen/core/op_registration/adaption.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstring>
#include <string>

#include "aten/errors.h"
#include "aten/fusion/fusion.h"
#include "aten/generator.h"
#include "aten/omp_parallel.h"
#include "aten/ops/enqueue.h"
#include "aten/ops/meta_cache.h"
#include "aten/ops/native_kernels.h"
#include "aten/origin_capture.h"
#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/stream.h"

namespace openneuron::aten {
namespace {

bool is_neuron(const at::Tensor& t) { return t.defined() && t.device().is_privateuseone(); }

// Checks every tensor arg is on one neuron device (CPU 0-dim tensors excepted; CPU index
// tensors of index ops are moved to the device, as CUDA allows) and returns that device.
c10::Device check_devices(OpInfo& info, torch::jit::Stack& stack, size_t first) {
  std::optional<c10::Device> common;
  std::optional<c10::Device> device_arg;
  const auto& schema_args = info.schema->arguments();
  bool has_cpu_index = false;
  auto check = [&](const at::Tensor& t, size_t i) {
    if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return;
    if (info.index_op && t.device().is_cpu()) {
      has_cpu_index = true;
      return;
    }
    c10::impl::check_and_update_common_device(common, t, info.name, schema_args[i].name().c_str());
  };
  for (size_t i = 0; i < info.num_args; ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      check(v.toTensor(), i);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef())
        if (e.isTensor()) check(e.toTensor(), i);
    } else if (v.isDevice() && v.toDevice().is_privateuseone()) {
      device_arg = v.toDevice();
    }
  }
  if (!common || !common->is_privateuseone()) common = device_arg;
  c10::Device device = common ? *common : c10::Device(c10::DeviceType::PrivateUse1);
  if (!device.has_index())
    device = c10::Device(c10::DeviceType::PrivateUse1,
                         static_cast<c10::DeviceIndex>(runtime::device_current()));
  if (has_cpu_index) {
    auto move = [&](const at::Tensor& t) {
      return t.defined() && t.device().is_cpu() && t.dim() > 0 ? t.to(device) : t;
    };
    for (size_t i = 0; i < info.num_args; ++i) {
      c10::IValue& v = stack[first + i];
      if (v.isTensor()) {
        v = c10::IValue(move(v.toTensor()));
      } else if (v.isList()) {
        auto list = v.toList();
        for (size_t j = 0; j < list.size(); ++j) {
          c10::IValue e = list.get(j);
          if (e.isTensor()) list.set(j, c10::IValue(move(e.toTensor())));
        }
      }
    }
  }
  return device;
}

// Drops ATen's "An output with one or more elements was resized" deprecation warning and passes
// every other warning on. NOTE: out= args reach the CPU kernel already in the final geometry the
// meta kernel gave them (run_async restrides them at dispatch), so that warning can only come
// from a kernel that resizes its out to an intermediate shape first: structured mse_loss.out and
// smooth_l1_loss.out build a broadcast TensorIterator on out, then resize it to []. CPU and CUDA
// never show it (their functional kernels allocate their own result); neuron gets every
// functional structured op as .out (ATen's CompositeExplicitAutogradNonFunctional wrapper), so it
// printed on every training step. A wrong final shape still fails loudly (fix_output).
class ResizeWarningFilter : public c10::WarningHandler {
 public:
  explicit ResizeWarningFilter(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& w) override {
    if (w.msg().find("was resized since it had shape") != std::string::npos) return;
    next_->process(w);
  }

 private:
  c10::WarningHandler* next_;
};

// Whether a bfloat16 / float16 matrix product runs in float32 here (a native kernel: off with
// the other native kernels, when the ATen path is bitwise CPU's): where ATen's CPU kernel
// for the dtype is its scalar loop, because this CPU has no oneDNN path for it (bfloat16 needs
// AVX512BW/VL/DQ; float16 AVX512-FP16 or AMX-FP16): ~1 GFLOP/s ([2048, 384] x [384, 1536] bf16:
// 3.9 s on an AVX2-only EPYC, 0.16 s in float32). Both sum in float32 and round once, so the
// results agree with ATen's to the last bit for all but ~0.01% of elements (one unit off).
// Tests force it either way on any CPU: torch.ops.openneuron._set_float32_gemm(mode), mode -1 =
// by the CPU (default), 0 = never, 1 = always; returns the previous mode.
std::atomic<int64_t> g_float32_gemm{-1};

bool gemm_in_float32(c10::ScalarType t) {
  if (!at::isReducedFloatingType(t)) return false;
  if (const int64_t forced = g_float32_gemm.load(std::memory_order_relaxed); forced >= 0)
    return forced == 1;
#if defined(__x86_64__)
  static const bool bf16 =
      !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"));
  static const bool f16 = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    bool avx512fp16 = false, amx_fp16 = false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) avx512fp16 = (d >> 23) & 1;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) amx_fp16 = (a >> 21) & 1;
    return !avx512fp16 && !amx_fp16;
  }();
  if (t == c10::ScalarType::BFloat16) return bf16;
  if (t == c10::ScalarType::Half) return f16;
#else
  (void)t;
#endif
  return false;
}

// Work state: the CPU stack and everything that must outlive dispatch.
struct Launch {
  // A device tensor whose CPU view is made on the executor thread, from the geometry captured
  // at dispatch (the user may change the tensor's metadata before the work runs).
  struct Deferred {
    size_t slot;  // index in stack, or in copy_targets if target
    DeviceBuffer buffer;
    TensorGeom geom;
    bool target = false;   // a new result's destination
    bool written = false;  // written by the kernel: checked afterwards (fix_output)
  };
  c10::OperatorHandle op;
  torch::jit::Stack stack;
  std::vector<c10::IValue> copy_targets;  // per return: where a new result goes (or None)
  std::vector<Deferred> deferred;
  StorageMap host{c10::DeviceType::CPU, /*keep_sources=*/false};
  const char* name = "";
  bool serial = false;  // small work: run on the executor thread alone (SerialScope)
  bool keep = false;    // queued on a capturing stream: run() keeps stack and copy_targets
  // A random op captured in a graph: where its share of each replay's generator state starts
  // (runtime/graph.h); its Generator arguments are made from that state when it runs.
  std::optional<uint64_t> rng_share;
  const OpInfo* info = nullptr;
  // A reduced-precision matrix product run in float32 (gemm_in_float32): its OpInfo's
  // arg_is_write (OpInfos live as long as the process); nullptr otherwise.
  const std::vector<bool>* float32_gemm_writes = nullptr;
  explicit Launch(c10::OperatorHandle o) : op(std::move(o)) {}

  void run() {
    if (keep) {  // captured in a graph: every run starts from the arguments as queued
      torch::jit::Stack args = stack;
      std::vector<c10::IValue> targets = copy_targets;
      run_on(args, targets);
      return;
    }
    run_on(stack, copy_targets);
    // The closure may outlive this run (hal.h): drop host results and views now.
    stack.clear();
    copy_targets.clear();
  }

  void run_on(torch::jit::Stack& args, std::vector<c10::IValue>& targets) {
    if (rng_share) {
      const runtime::ReplayRng* r = runtime::graph_replay_rng();
      TORCH_CHECK(r != nullptr, name,
                  ": a random op captured in a neuron graph ran outside a replay");
      const PhiloxState st{r->seed, r->offset + *rng_share};
      for (size_t i = 0; i < args.size() && i < info->arg_kind.size(); ++i) {
        if (info->arg_kind[i] == ArgKind::Generator)
          args[i] = c10::IValue(at::detail::createCPUGenerator(philox_seed(st)));
      }
    }
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    SerialScope serial_scope(serial);
    c10::SmallVector<std::pair<at::Tensor, const Deferred*>, 4> written;
    for (const auto& d : deferred) {
      at::Tensor view = host.view_of(d.buffer, d.geom);
      if (d.written) written.emplace_back(view, &d);
      (d.target ? targets[d.slot] : args[d.slot]) = c10::IValue(std::move(view));
    }
    if (written.empty()) {
      redispatch(args);
    } else {
      ResizeWarningFilter filter(c10::WarningUtils::get_warning_handler());
      c10::WarningUtils::WarningHandlerGuard guard(&filter);
      redispatch(args);
    }
    for (const auto& [view, d] : written) fix_output(view, *d);
    for (size_t r = 0; r < targets.size() && r < args.size(); ++r) copy_result(targets[r], args[r]);
  }

  // The CPU kernel on the stack; a float32 matrix product: the op on float32 copies of its
  // reduced-precision tensors, the written ones copied back (rounded once), new results
  // rounded by copy_result.
  void redispatch(torch::jit::Stack& args) {
    if (float32_gemm_writes == nullptr) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &args);
      return;
    }
    c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 1> back;
    for (size_t i = 0; i < args.size() && i < float32_gemm_writes->size(); ++i) {
      if (!args[i].isTensor()) continue;
      const at::Tensor t = args[i].toTensor();
      if (!t.defined() || !at::isReducedFloatingType(t.scalar_type())) continue;
      at::Tensor f = t.to(at::kFloat);
      if ((*float32_gemm_writes)[i]) back.emplace_back(t, f);
      args[i] = c10::IValue(std::move(f));
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &args);
    for (auto& [t, f] : back) t.copy_(f);
  }

  // A kernel that resized an output moved it to host memory: copy it home.
  void fix_output(const at::Tensor& view, const Deferred& w) const {
    if (view.storage().data() == w.buffer.data && view.sizes().equals(w.geom.sizes)) return;
    TORCH_CHECK(view.sizes().equals(w.geom.sizes), name,
                ": the CPU kernel produced an output of shape ", view.sizes(),
                " but the meta kernel predicted ", c10::IntArrayRef(w.geom.sizes),
                "; please report this op (OPENNEURON_FALLBACK cannot help here).");
    host_view_fresh(w.buffer, w.geom).copy_(view);
  }

  // t.copy_(r) for the common small case (same non-quantized dtype, both contiguous, no conj/neg
  // bit, no overlap, fewer elements than ATen's grain size, where copy_ runs serially anyway): one
  // memcpy instead of a dispatch and a TensorIterator, the same bytes. False: not handled.
  static bool copy_small_dense(const at::Tensor& t, const at::Tensor& r) {
    if (t.scalar_type() != r.scalar_type() || at::isQIntType(t.scalar_type()) ||
        t.layout() != c10::kStrided || r.layout() != c10::kStrided || !t.device().is_cpu() ||
        !r.device().is_cpu() || t.numel() >= at::internal::GRAIN_SIZE || !t.is_contiguous() ||
        !r.is_contiguous() || t.is_conj() || r.is_conj() || t.is_neg() || r.is_neg()) {
      return false;
    }
    const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (nbytes == 0) return true;
    const auto* src = static_cast<const char*>(r.const_data_ptr());
    auto* dst = static_cast<char*>(t.data_ptr());
    if (dst < src + nbytes && src < dst + nbytes) return false;  // overlap: copy_ decides
    std::memcpy(dst, src, nbytes);
    return true;
  }

  static void copy_result(const c10::IValue& target, const c10::IValue& result) {
    if (target.isTensor() && target.toTensor().defined()) {
      const at::Tensor& t = target.toTensor();
      const at::Tensor& r = result.toTensor();
      TORCH_CHECK(t.sizes().equals(r.sizes()), "the CPU kernel produced an output of shape ",
                  r.sizes(), " but the meta kernel predicted ", t.sizes());
      if (!copy_small_dense(t, r)) t.copy_(r);
    } else if (target.isList() && result.isList()) {
      auto t = target.toListRef();
      auto s = result.toListRef();
      for (size_t j = 0; j < t.size() && j < s.size(); ++j) copy_result(t[j], s[j]);
    }
  }
};

int64_t numel_of(const TensorGeom& g) {
  int64_t n = 1;
  for (int64_t s : g.sizes) n *= s;
  return n;
}

c10::IValue make_returns(const OpInfo& info, size_t r, const c10::SmallVector<TensorGeom, 1>& g,
                         c10::ArrayRef<c10::IValue> args, c10::Device device, bool is_list,
                         bool* any_new) {
  int alias = info.return_alias_arg[r];
  if (alias >= 0 && info.return_is_write[r]) return args[alias];
  auto one = [&](const TensorGeom& geom) -> at::Tensor {
    if (!geom.defined) return at::Tensor();
    if (alias >= 0) return device_view(args[alias].toTensor().storage(), geom);
    *any_new = true;
    return device_empty(geom, device);
  };
  if (!is_list) return c10::IValue(one(g[0]));
  c10::List<at::Tensor> list;
  for (const auto& geom : g) list.push_back(one(geom));
  return c10::IValue(list);
}

}  // namespace

c10::IValue host_arg(const c10::IValue& v, ArgKind kind, StorageMap& host,
                     const PhiloxState* philox) {
  if (kind == ArgKind::Generator) {
    if (!philox) return c10::IValue();
    return c10::IValue(at::detail::createCPUGenerator(philox_seed(*philox)));
  }
  if (kind == ArgKind::Device && v.isDevice() && v.toDevice().is_privateuseone())
    return c10::IValue(c10::Device(c10::DeviceType::CPU));
  auto convert = [&](const at::Tensor& t) -> at::Tensor {
    if (is_neuron(t)) return host.view_of(t);
    if (t.defined() && t.device().is_cpu() && t.dim() == 0) return t.clone();
    return t;
  };
  if (v.isTensor()) return c10::IValue(convert(v.toTensor()));
  if (v.isList()) {
    bool has_tensor = false;
    for (const auto& e : v.toListRef()) has_tensor |= e.isTensor();
    if (!has_tensor) return v;
    auto copy = v.toList().copy();
    for (size_t i = 0; i < copy.size(); ++i) {
      c10::IValue e = copy.get(i);
      if (e.isTensor()) copy.set(i, c10::IValue(convert(e.toTensor())));
    }
    return c10::IValue(copy);
  }
  return v;
}

uint64_t philox_seed(const PhiloxState& s) {
  // splitmix64 of (seed, offset): distinct offsets give unrelated CPU generator seeds.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(s.seed ^ mix(s.offset));
}

std::optional<PhiloxState> take_philox(const OpInfo& info, c10::ArrayRef<c10::IValue> args,
                                       c10::Device device, int64_t numel) {
  if (!info.has_generator) return std::nullopt;
  for (size_t i = 0; i < args.size(); ++i) {
    if (info.arg_kind[i] != ArgKind::Generator) continue;
    std::optional<at::Generator> gen;
    if (args[i].isGenerator()) gen = args[i].toGenerator();
    NeuronGenerator* g = generator_or_default(gen, device.index());
    std::lock_guard<std::mutex> lock(g->mutex_);
    return g->philox_state(static_cast<uint64_t>(std::max<int64_t>(numel, 1)));
  }
  return std::nullopt;
}

// Whether a random op draws from its device's default generator (its Generator arguments None).
bool on_default_generator(const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  if (!info.has_generator) return false;
  for (size_t i = 0; i < args.size(); ++i)
    if (info.arg_kind[i] == ArgKind::Generator && args[i].isGenerator()) return false;
  return true;
}

// Whether an op's work is too small to be worth an OpenMP region (omp_parallel.h) and may run
// serially: the elements of its largest tensor (`out_numel`: of its results), for ops whose
// results do not depend on the thread count.
bool small_work(const OpInfo& info, c10::ArrayRef<c10::IValue> args, int64_t out_numel) {
  if (!info.thread_invariant) return false;
  int64_t most = out_numel;
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      most = std::max(most, v.toTensor().numel());
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) most = std::max(most, e.toTensor().numel());
    }
  }
  return most < kSerialElements;
}

void run_async(const c10::OperatorHandle& op, OpInfo& info, torch::jit::Stack* stack,
               c10::Device device, const MetaResult& meta) {
  const size_t n = info.num_args;
  c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
  // As c10::DeviceGuard(device), without its virtual calls when device is already current.
  c10::OptionalDeviceGuard guard;
  if (device.index() != runtime::device_current()) guard.reset_device(device);
  int64_t numel = 0;
  for (const auto& [i, geoms] : meta.writes) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (is_neuron(v.toTensor())) device_restride(v.toTensor(), geoms[0]);
      numel = std::max(numel, v.toTensor().numel());
    } else if (v.isList()) {
      auto list = v.toListRef();
      for (size_t j = 0; j < list.size() && j < geoms.size(); ++j)
        if (list[j].isTensor() && is_neuron(list[j].toTensor()))
          device_restride(list[j].toTensor(), geoms[j]);
    }
  }
  std::vector<c10::IValue> returns;
  returns.reserve(info.num_returns);
  bool any_new = false;
  const auto& rets = info.schema->returns();
  for (size_t r = 0; r < info.num_returns; ++r) {
    bool is_list = rets[r].type()->kind() == c10::TypeKind::ListType;
    returns.push_back(make_returns(info, r, meta.returns[r], args, device, is_list, &any_new));
    for (const auto& g : meta.returns[r])
      if (g.defined) numel = std::max(numel, numel_of(g));
  }
  bool float32_gemm = false;
  if (info.reduced_gemm && native_kernels_enabled()) {
    for (size_t i = 0; i < n && !float32_gemm; ++i)
      float32_gemm = args[i].isTensor() && args[i].toTensor().defined() &&
                     gemm_in_float32(args[i].toTensor().scalar_type());
  }
  // A float32 matrix product is a native kernel for ops_report (CPU's kernel does not run).
  (float32_gemm ? info.native_calls : info.async_calls).fetch_add(1, std::memory_order_relaxed);
  if (!info.has_write_args && !any_new) {  // metadata only (views): no device work
    torch::jit::drop(*stack, n);
    for (auto& r : returns) stack->push_back(std::move(r));
    return;
  }
  const runtime::Stream stream = runtime::stream_current(device.index());
  runtime::Graph* capture = runtime::stream_capture_graph(stream);
  // A random op on the device's default generator captured in a graph reserves its share of
  // each replay's state instead (one with an explicit generator is refused by the capture).
  std::optional<uint64_t> rng_share;
  std::optional<PhiloxState> philox;
  if (capture != nullptr && on_default_generator(info, args)) {
    rng_share = capture->rng_reserve(
        NeuronGenerator::philox_increment(static_cast<uint64_t>(std::max<int64_t>(numel, 1))));
    philox = PhiloxState{};  // replaced when it runs
  } else {
    philox = take_philox(info, args, device, numel);
  }
  // NOTE: functional ops run their functional CPU kernel and results are copied into the
  // outputs. Structured ops arrive here as .out already (ATen's own wrappers); the functional
  // ops that reach us are unstructured, and their .out kernels are not always equivalent with
  // meta-sized outputs (binary_cross_entropy_out reduces in place after resizing its out).
  auto launch = std::make_shared<Launch>(op);
  launch->name = info.name;
  launch->serial = small_work(info, args, numel);
  if (float32_gemm) launch->float32_gemm_writes = &info.arg_is_write;
  launch->stack.reserve(n + info.num_returns);
  launch->deferred.reserve(n + info.num_returns);
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor() && is_neuron(args[i].toTensor())) {
      const at::Tensor& t = args[i].toTensor();
      launch->deferred.push_back({i, buffer_of(t), geom_of(t), false, info.arg_is_write[i]});
      launch->stack.emplace_back();
    } else {
      launch->stack.push_back(
          host_arg(args[i], info.arg_kind[i], launch->host, philox ? &*philox : nullptr));
    }
  }
  for (size_t r = 0; r < returns.size(); ++r) {
    launch->copy_targets.emplace_back();
    if (info.return_alias_arg[r] >= 0) continue;
    if (returns[r].isTensor()) {
      const at::Tensor& t = returns[r].toTensor();
      if (t.defined()) launch->deferred.push_back({r, buffer_of(t), geom_of(t), true, false});
    } else {
      launch->copy_targets[r] = host_arg(returns[r], ArgKind::Other, launch->host, nullptr);
    }
  }
  launch->keep = capture != nullptr;
  launch->rng_share = rng_share;
  launch->info = &info;
  // A random op's generator state taken here, once, cannot be replayed (its numbers would
  // repeat); a reserved share can.
  enqueue_op(
      stream, info.name, [launch] { launch->run(); }, origin_capture(),
      !philox || rng_share.has_value());
  torch::jit::drop(*stack, n);
  for (auto& r : returns) stack->push_back(std::move(r));
}

void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                     torch::jit::Stack* stack) {
  OpInfo& info = op_info(op);
  // Adaptive eager: a fusible op is recorded; any other op closes the pending group first.
  if (fusion::enabled() && fusion::try_record_boxed(op, info, stack)) return;
  const size_t n = info.num_args;
  const size_t first = stack->size() - n;
  c10::Device device = check_devices(info, *stack, first);
  if (!info.no_async_reason.empty()) {
    sync_fallback(op, info, stack, device, info.no_async_reason.c_str(), false);
    return;
  }
  if (!info.meta_ok.load(std::memory_order_relaxed)) {
    sync_fallback(op, info, stack, device, "its meta kernel is not implemented", false);
    return;
  }
  std::shared_ptr<const MetaResult> meta;
  try {
    meta = meta_result(op, info, c10::ArrayRef<c10::IValue>(stack->data() + first, n));
  } catch (const MetaUnavailable&) {
    sync_fallback(op, info, stack, device, "its meta kernel is not implemented", false);
    return;
  } catch (const std::exception&) {
    // The meta kernel refused these inputs (data-dependent, or stricter than the CPU kernel):
    // the CPU kernel decides, and raises the error users expect if the inputs are bad.
    sync_fallback(op, info, stack, device, "its meta kernel cannot size these inputs", true);
    return;
  }
  if (info.training_arg >= 0 && !(*stack)[first + info.training_arg].toBool()) {
    MetaResult eval = *meta;  // batch norm in eval mode: empty save_mean / save_invstd, as CPU
    for (size_t r = 1; r < eval.returns.size(); ++r) {
      for (auto& g : eval.returns[r]) {
        g.sizes = {0};
        g.strides = {1};
        g.offset = 0;
      }
    }
    run_async(op, info, stack, device, eval);
    return;
  }
  run_async(op, info, stack, device, *meta);
}

}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&openneuron::aten::neuron_fallback>());
}

TORCH_LIBRARY_FRAGMENT(openneuron, m) {
  m.def("_set_float32_gemm(int mode) -> int", [](int64_t mode) -> int64_t {
    TORCH_CHECK(mode >= -1 && mode <= 1,
                "openneuron._set_float32_gemm: mode must be -1 (by the CPU), 0 or 1, got ", mode);
    return openneuron::aten::g_float32_gemm.exchange(mode);
  });
}
