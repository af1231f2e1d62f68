// The adaptive-eager recorder: one process-wide pending group (ops of one stream, one iteration
// shape, group.h), its boundaries, its ir::Kernel (cached by structure) and the work item that
// runs it; plus stats and the OPENNEURON_FUSION_LOG lines. What an ATen op means is decided in
// aten_ops.cpp, what it computes as IR values in lowering.cpp; the math the kernel calls is
// installed by math_hooks.cpp.
// NOTE: the group holds strong references to every storage it reads or writes, so no block it
// names can be freed and reused before it is enqueued; a result is written only if someone
// besides the group still references its storage at close (dead intermediates are never
// written). The runtime's flush hook (runtime/stream.h) closes the group before ANY other work
// is queued, copied or waited for, so eager order is never violated, from any thread.
#include "aten/fusion/recorder.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "aten/errors.h"
#include "aten/fusion/group.h"
#include "ir/execute.h"
#include "runtime/config.h"
#include "runtime/stream.h"

namespace openneuron::aten::fusion {

namespace detail {
std::atomic<bool> enabled{false};
std::atomic<bool> pending{false};
}  // namespace detail

namespace {

using detail::DType;
using detail::Op;
using detail::Recorder;
using detail::recorder;

std::atomic<bool> g_log{false};
std::atomic<int> g_max_ops{64};
thread_local bool tl_in_flush = false;

struct AtomicStats {
  std::atomic<uint64_t> groups{0}, ops_fused{0}, kernels{0}, cache_hits{0}, cache_misses{0},
      bytes_saved{0}, outputs_written{0}, outputs_dead{0};
};
AtomicStats g_stats;

// Bytes from t's data pointer to one past its last element (strides are non-negative).
uintptr_t extent_bytes(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(t.itemsize()));
}

bool same_geom(const at::Tensor& t, int64_t offset, c10::IntArrayRef sizes,
               c10::IntArrayRef strides) {  // NOLINT
  return t.storage_offset() == offset && t.sizes().equals(sizes) && t.strides().equals(strides);
}

int coalesce(c10::SmallVector<int64_t, 6>& sizes, std::vector<int64_t*>& strides) {
  int nd = 0;
  const int n = static_cast<int>(sizes.size());
  for (int d = 0; d < n; ++d) {
    if (sizes[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int64_t* s : strides) merge &= s[nd - 1] == s[d] * sizes[d];
      if (merge) {
        sizes[nd - 1] *= sizes[d];
        for (int64_t* s : strides) s[nd - 1] = s[d];
        continue;
      }
    }
    sizes[nd] = sizes[d];
    for (int64_t* s : strides) s[nd] = s[d];
    ++nd;
  }
  sizes.resize(nd);
  return nd;
}

}  // namespace

namespace detail {

Recorder& recorder() {
  static Recorder* r = new Recorder;  // NOTE: never destroyed (used from executor threads)
  return *r;
}

int32_t Recorder::value_of(const at::Tensor& t) {
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (const Output& o : outputs_) {
    if (o.storage.unsafeGetStorageImpl() == impl) return o.value;  // geometry checked before
  }
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Input& in = inputs_[i];
    if (in.storage.unsafeGetStorageImpl() == impl && in.dtype == t.scalar_type() &&
        same_geom(t, in.offset, in.sizes, in.tstrides)) {
      for (size_t v = 0; v < nodes_.size(); ++v)
        if (nodes_[v].op == Op::kLoad && nodes_[v].index == static_cast<int16_t>(i))
          return static_cast<int32_t>(v);
    }
  }
  Input in;
  in.storage = t.storage();
  in.data = t.data_ptr();
  in.nbytes = t.numel() * static_cast<int64_t>(t.itemsize());
  in.offset = t.storage_offset();
  in.sizes.assign(t.sizes().begin(), t.sizes().end());
  in.tstrides.assign(t.strides().begin(), t.strides().end());
  in.dtype = t.scalar_type();
  in.lo = reinterpret_cast<uintptr_t>(in.data);
  in.hi = in.lo + extent_bytes(t);
  // strides in the iteration space (right-aligned broadcasting)
  const int nd = static_cast<int>(sizes_.size());
  const int td = static_cast<int>(t.dim());
  in.strides.assign(nd, 0);
  for (int d = 0; d < td; ++d) {
    const int g = nd - td + d;
    in.strides[g] = t.size(d) == 1 ? 0 : t.stride(d);
  }
  inputs_.push_back(std::move(in));
  return push({Op::kLoad,
               dtype_of(t.scalar_type()),
               static_cast<int16_t>(inputs_.size() - 1),
               {-1, -1, -1},
               0});
}

// Where op r goes: closes the pending group first when r cannot join it (device, stream, shape,
// size limit, aliasing), and finds the pending result an in-place r replaces (*inplace_out, or
// -1; *inplace_input_out: in-place on a group input with its exact geometry). False: r must run
// the ordinary way. Caller holds mu_.
bool Recorder::place(const OpRecord& r, int* inplace_out, bool* inplace_input_out,
                     std::vector<c10::Storage>* garbage) {
  const at::Tensor& out = *r.out;
  const c10::DeviceIndex device = out.device().index();
  const int64_t stream_id = runtime::stream_current(device).id();
  if (!empty()) {
    if (device != device_) {
      flush("device change", garbage);
    } else if (stream_id != stream_id_) {
      flush("stream change", garbage);
    } else if (!out.sizes().equals(sizes_)) {
      flush("shape change", garbage);
    } else if (ops_ >= g_max_ops.load(std::memory_order_relaxed)) {
      flush("size limit", garbage);
    }
  }
  // Aliasing: the op must not write memory the group reads or writes, and must not read a
  // pending result through a different view. In-place ops are recorded only on a pending
  // result with its exact geometry (the result's value is then replaced); others run the
  // ordinary way.
  const c10::StorageImpl* out_impl = out.storage().unsafeGetStorageImpl();
  int& inplace = *inplace_out;
  inplace = -1;
  bool writes_arg = false;
  for (int i = 0; i < r.nargs; ++i) {
    const at::Tensor* t = r.args[i].tensor;
    writes_arg |= t && t->storage().unsafeGetStorageImpl() == out_impl;
  }
  bool& inplace_input = *inplace_input_out;
  inplace_input = false;
  if (writes_arg) {
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const Output& o = outputs_[i];
      if (o.storage.unsafeGetStorageImpl() == out_impl && o.dtype == out.scalar_type() &&
          o.offset == out.storage_offset() && out.strides().equals(o.strides))
        inplace = static_cast<int>(i);
    }
    bool ok = true;
    if (inplace < 0) {
      // In-place on an input of the group (or on memory it has not seen yet): every load of
      // that storage must have exactly the written geometry (the kernel then reads each
      // element before writing it: exact aliasing), and no pending result may live in it.
      for (const Output& o : outputs_) ok &= o.storage.unsafeGetStorageImpl() != out_impl;
      for (const Input& in : inputs_) {
        if (in.storage.unsafeGetStorageImpl() == out_impl)
          ok &= in.dtype == out.scalar_type() && in.offset == out.storage_offset() &&
                out.sizes().equals(in.sizes) && out.strides().equals(in.tstrides);
      }
      inplace_input = ok;
    }
    for (int i = 0; i < r.nargs && ok; ++i) {
      const at::Tensor* t = r.args[i].tensor;
      if (t && t->storage().unsafeGetStorageImpl() == out_impl)
        ok = t->scalar_type() == out.scalar_type() && t->storage_offset() == out.storage_offset() &&
             t->sizes().equals(out.sizes()) && t->strides().equals(out.strides());
    }
    if (!ok) {
      flush("in-place op", garbage);
      return false;
    }
  }
  if (!empty() && inplace < 0 && !inplace_input) {
    bool conflict = false;
    for (const Output& o : outputs_) conflict |= o.storage.unsafeGetStorageImpl() == out_impl;
    for (const Input& in : inputs_) conflict |= in.storage.unsafeGetStorageImpl() == out_impl;
    if (conflict) flush("writes memory a pending op uses", garbage);
  }
  if (!empty()) {
    for (int i = 0; i < r.nargs; ++i) {
      const at::Tensor* t = r.args[i].tensor;
      if (!t) continue;
      const c10::StorageImpl* impl = t->storage().unsafeGetStorageImpl();
      for (const Output& o : outputs_) {
        if (o.storage.unsafeGetStorageImpl() != impl) continue;
        const bool exact = o.dtype == t->scalar_type() && t->storage_offset() == o.offset &&
                           t->sizes().equals(sizes_) && t->strides().equals(o.strides);
        if (!exact) {
          flush("reads a view of a pending result", garbage);
          break;
        }
      }
      if (empty()) break;
    }
  }
  if (!empty()) {
    // A block given back early (a dead input) may come back as this op's output.
    const uintptr_t lo = reinterpret_cast<uintptr_t>(out.data_ptr());
    const uintptr_t hi = lo + extent_bytes(out);
    for (const Input& in : inputs_) {
      if (!in.released || in.hi <= lo || hi <= in.lo) continue;
      const bool exact = in.data == out.data_ptr() && in.dtype == out.scalar_type() &&
                         out.strides().equals(in.strides);
      if (!exact) {
        flush("memory reuse", garbage);
        break;
      }
    }
  }
  if (empty()) {
    device_ = device;
    stream_id_ = stream_id;
    sizes_.assign(out.sizes().begin(), out.sizes().end());
    numel_ = out.numel();
  }
  return true;
}

bool Recorder::record(const OpRecord& r, std::vector<c10::Storage>* garbage) {
  const at::Tensor& out = *r.out;
  std::lock_guard<std::mutex> lock(mu_);
  int inplace = -1;
  bool inplace_input = false;
  if (!place(r, &inplace, &inplace_input, garbage)) return false;
  const int32_t res = lower(r);
  if (inplace >= 0) {
    outputs_[inplace].value = res;
    eager_bytes_ += outputs_[inplace].nbytes;
    release_dead(garbage);
  } else {
    Output o;
    o.storage = out.storage();
    o.data = out.data_ptr();
    o.nbytes = out.numel() * static_cast<int64_t>(out.itemsize());
    o.strides.assign(out.strides().begin(), out.strides().end());
    o.offset = out.storage_offset();
    o.dtype = out.scalar_type();
    o.value = res;
    eager_bytes_ += o.nbytes;
    release_dead(garbage);
    outputs_.push_back(std::move(o));
  }
  names_.push_back(fn_name(r.fn));
  ++ops_;
  g_stats.ops_fused.fetch_add(1, std::memory_order_relaxed);
  detail::pending.store(true, std::memory_order_release);
  return true;
}

std::shared_ptr<const ir::Kernel> Recorder::kernel_for(const std::vector<int>& live, bool* hit) {
  std::string key;
  key.reserve(nodes_.size() * sizeof(GNode) + inputs_.size() + live.size() * 5 + 4);
  key.append(reinterpret_cast<const char*>(nodes_.data()), nodes_.size() * sizeof(GNode));
  key.push_back('|');
  for (int i : live) {
    int32_t val = outputs_[i].value;
    key.append(reinterpret_cast<const char*>(&val), 4);
    key.push_back(static_cast<char>(dtype_of(outputs_[i].dtype)));
  }
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    *hit = true;
    return it->second;
  }
  *hit = false;
  ir::KernelBuilder b;
  for (const Input& in : inputs_) b.add_input(dtype_of(in.dtype));
  std::vector<ir::ValueId> map(nodes_.size(), -1);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const GNode& n = nodes_[i];
    switch (n.op) {
      case Op::kLoad:
        map[i] = b.load(n.index);
        break;
      case Op::kConstant:
        if (ir::dtype_is_floating(n.dtype)) {
          double d;
          std::memcpy(&d, &n.payload, 8);
          map[i] = b.constant(d, n.dtype);
        } else {
          int64_t d;
          std::memcpy(&d, &n.payload, 8);
          map[i] = b.constant(d, n.dtype);
        }
        break;
      case Op::kCast:
        map[i] = b.cast(map[n.args[0]], n.dtype);
        break;
      case Op::kWhere:
        map[i] = b.where(map[n.args[0]], map[n.args[1]], map[n.args[2]]);
        break;
      case Op::kFma:
        map[i] = b.fma(map[n.args[0]], map[n.args[1]], map[n.args[2]]);
        break;
      default:
        if (n.args[1] < 0) {
          map[i] = b.unary(n.op, map[n.args[0]]);
        } else {
          map[i] = b.binary(n.op, map[n.args[0]], map[n.args[1]]);
        }
    }
  }
  for (int i : live) {
    int o = b.add_output(dtype_of(outputs_[i].dtype));
    b.store(o, map[outputs_[i].value]);
  }
  auto k = b.build();
  if (cache_.size() > 4096) cache_.clear();
  cache_.emplace(std::move(key), k);
  return k;
}

void Recorder::reset(std::vector<c10::Storage>* garbage) {
  for (Input& in : inputs_) garbage->push_back(std::move(in.storage));
  for (Output& o : outputs_) garbage->push_back(std::move(o.storage));
  inputs_.clear();
  outputs_.clear();
  nodes_.clear();
  names_.clear();
  ops_ = 0;
  eager_bytes_ = 0;
  sizes_.clear();
}

// Coalesces dims that every operand walks contiguously (row-major), dropping size-1 dims.
void Recorder::flush(const char* reason, std::vector<c10::Storage>* garbage) {
  if (empty()) {
    detail::pending.store(false, std::memory_order_release);
    return;
  }
  const uint64_t seq = ++group_seq_;
  // NOTE: the group's own reference is the only one a dead result has left.
  std::vector<int> live;
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (!outputs_[i].released && outputs_[i].storage.use_count() > 1)
      live.push_back(static_cast<int>(i));
  int64_t fused_bytes = 0;
  for (int i : live) fused_bytes += outputs_[i].nbytes;
  bool hit = false;
  std::shared_ptr<const ir::Kernel> k;
  std::exception_ptr error;
  if (!live.empty()) {
    try {
      k = kernel_for(live, &hit);
      // inputs the kernel still loads (dead branches are pruned by the builder)
      for (int i = 0; i < k->num_inputs(); ++i) {
        bool used = false;
        for (const ir::Node& n : k->nodes()) used |= n.op == Op::kLoad && n.index == i;
        if (used) fused_bytes += inputs_[i].nbytes;
      }
      auto l = std::make_shared<Launch>();
      l->kernel = k;
      c10::SmallVector<int64_t, 6> sizes = sizes_;
      const size_t nops = inputs_.size() + live.size();
      const size_t nd0 = sizes.size();
      std::vector<int64_t> st(nops * std::max<size_t>(nd0, 1));
      std::vector<int64_t*> rows;
      for (size_t j = 0; j < nops; ++j) {
        const auto& s =
            j < inputs_.size() ? inputs_[j].strides : outputs_[live[j - inputs_.size()]].strides;
        std::copy(s.begin(), s.end(), st.begin() + j * nd0);
        rows.push_back(st.data() + j * nd0);
      }
      const int nd = coalesce(sizes, rows);
      TORCH_INTERNAL_ASSERT(nd <= kMaxDims, "adaptive eager: too many dims");
      l->ndim = nd;
      for (int d = 0; d < nd; ++d) l->sizes[d] = sizes[d];
      l->strides.resize(nops * std::max(nd, 1));
      for (size_t j = 0; j < nops; ++j) {
        std::copy(rows[j], rows[j] + nd, l->strides.begin() + j * nd);
        l->ptrs.push_back(j < inputs_.size() ? inputs_[j].data
                                             : outputs_[live[j - inputs_.size()]].data);
      }
      runtime::Work work;
      work.name = "adaptive_eager::fused";
      work.replayable = true;  // pointers and strides only: a graph may replay it
      work.fn = [l = std::move(l)] {
        const int nin = l->kernel->num_inputs();
        const int nout = l->kernel->num_outputs();
        const int nd = l->ndim;
        c10::SmallVector<ir::Operand, 8> ops;
        for (int j = 0; j < nin + nout; ++j)
          ops.push_back(ir::Operand{l->ptrs[j], l->strides.data() + j * nd});
        ir::execute(*l->kernel, l->sizes, nd, ops.data(), ops.data() + nin);
      };
      tl_in_flush = true;
      runtime::stream_from_id(device_, stream_id_).enqueue(std::move(work));
      tl_in_flush = false;
    } catch (...) {
      tl_in_flush = false;
      error = std::current_exception();
    }
  }
  const int64_t saved = std::max<int64_t>(0, eager_bytes_ - fused_bytes);
  g_stats.groups.fetch_add(1, std::memory_order_relaxed);
  if (k) {
    g_stats.kernels.fetch_add(1, std::memory_order_relaxed);
    (hit ? g_stats.cache_hits : g_stats.cache_misses).fetch_add(1, std::memory_order_relaxed);
  }
  g_stats.bytes_saved.fetch_add(saved, std::memory_order_relaxed);
  g_stats.outputs_written.fetch_add(live.size(), std::memory_order_relaxed);
  g_stats.outputs_dead.fetch_add(outputs_.size() - live.size(), std::memory_order_relaxed);
  if (g_log.load(std::memory_order_relaxed)) {
    std::string ops;
    for (size_t i = 0; i < names_.size(); ++i) {
      if (i) ops += ',';
      ops += names_[i];
    }
    std::string shape;
    for (size_t d = 0; d < sizes_.size(); ++d) shape += (d ? "x" : "") + std::to_string(sizes_[d]);
    std::fprintf(stderr,
                 "[openneuron fusion] group %" PRIu64
                 ": %d ops [%s] shape [%s] on neuron:%d "
                 "stream %" PRId64
                 " | closed by: %s | outputs written %zu, dead %zu | %s | "
                 "bytes eager %" PRId64 " fused %" PRId64 " saved %" PRId64 "\n",
                 seq, ops_, ops.c_str(), shape.c_str(), static_cast<int>(device_), stream_id_,
                 reason, live.size(), outputs_.size() - live.size(),
                 k ? (hit ? "kernel cache hit" : "kernel cache miss") : "nothing launched",
                 eager_bytes_, fused_bytes, saved);
  }
  reset(garbage);
  detail::pending.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

namespace {
using detail::recorder;
}  // namespace

bool record(const OpRecord& r) {
  std::vector<c10::Storage> garbage;
  bool ok = recorder().record(r, &garbage);
  return ok;  // garbage released here, outside the lock
}

void release_dead_slow() {
  std::vector<c10::Storage> garbage;
  {
    std::lock_guard<std::mutex> lock(recorder().mu());
    recorder().release_dead_now(&garbage);
  }
}

void flush_slow(const char* reason) {
  if (tl_in_flush) return;
  std::vector<c10::Storage> garbage;
  {
    std::lock_guard<std::mutex> lock(recorder().mu());
    recorder().flush(reason, &garbage);
  }
}

void set_enabled(bool on) {
  if (!on) flush("adaptive eager switched off");
  detail::enabled.store(on, std::memory_order_relaxed);
}

Stats stats() {
  Stats s;
  s.groups = g_stats.groups.load();
  s.ops_fused = g_stats.ops_fused.load();
  s.kernels = g_stats.kernels.load();
  s.cache_hits = g_stats.cache_hits.load();
  s.cache_misses = g_stats.cache_misses.load();
  s.bytes_saved = g_stats.bytes_saved.load();
  s.outputs_written = g_stats.outputs_written.load();
  s.outputs_dead = g_stats.outputs_dead.load();
  return s;
}

void stats_reset() {
  g_stats.groups = 0;
  g_stats.ops_fused = 0;
  g_stats.kernels = 0;
  g_stats.cache_hits = 0;
  g_stats.cache_misses = 0;
  g_stats.bytes_saved = 0;
  g_stats.outputs_written = 0;
  g_stats.outputs_dead = 0;
}

void set_log(bool on) { g_log.store(on, std::memory_order_relaxed); }
void set_max_ops(int n) { g_max_ops.store(n < 1 ? 1 : n, std::memory_order_relaxed); }

namespace {

const char* flush_point_name(runtime::FlushPoint p) {
  switch (p) {
    case runtime::FlushPoint::kEnqueue:
      return "other work enqueued";
    case runtime::FlushPoint::kMemcpy:
      return "copy";
    case runtime::FlushPoint::kStreamSync:
      return "synchronize";
    case runtime::FlushPoint::kStreamQuery:
      return "stream query";
    case runtime::FlushPoint::kEventRecord:
      return "event record";
    case runtime::FlushPoint::kEventWait:
      return "event wait";
    case runtime::FlushPoint::kEventQuery:
      return "event query";
    case runtime::FlushPoint::kEventSync:
      return "event synchronize";
    case runtime::FlushPoint::kGraphCapture:
      return "graph capture";
  }
  return "runtime call";
}

void runtime_hook(runtime::FlushPoint p) { flush(flush_point_name(p)); }

const bool kInit = [] {
  const runtime::Config& c = runtime::config_or_defaults();
  detail::enabled.store(c.fusion, std::memory_order_relaxed);
  g_log.store(c.fusion_log, std::memory_order_relaxed);
  if (c.fusion_max_ops > 0) g_max_ops.store(c.fusion_max_ops);
  runtime::set_flush_hook(&runtime_hook);
  return true;
}();

}  // namespace

}  // namespace openneuron::aten::fusion
