// Meta-kernel output sizing with a signature cache. See meta_cache.h.
#include "aten/ops/meta_cache.h"

#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace openneuron::aten {
namespace {

constexpr size_t kMaxEntries = 4096;

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

int64_t bits_of(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

void encode_tensor(const at::Tensor& t, Key& k) {
  if (!t.defined()) {
    k.push_back(2);
    return;
  }
  k.push_back(1);
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back(static_cast<int64_t>(t.device().type()));
  k.push_back(t.dim());
  for (int64_t s : t.sizes()) k.push_back(s);
  for (int64_t s : t.strides()) k.push_back(s);
  k.push_back(t.storage_offset());
  k.push_back(t.is_conj() * 2 + t.is_neg());
}

// Appends v's encoding; false when v is something the key cannot capture.
bool encode(const c10::IValue& v, Key& k) {
  if (v.isTensor()) {
    encode_tensor(v.toTensor(), k);
  } else if (v.isNone()) {
    k.push_back(2);
  } else if (v.isInt()) {
    k.push_back(3);
    k.push_back(v.toInt());
  } else if (v.isDouble()) {
    k.push_back(4);
    k.push_back(bits_of(v.toDouble()));
  } else if (v.isBool()) {
    k.push_back(5);
    k.push_back(v.toBool());
  } else if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    k.push_back(6);
    k.push_back(bits_of(c.real()));
    k.push_back(bits_of(c.imag()));
  } else if (v.isString()) {
    k.push_back(7);
    k.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else if (v.isDevice()) {
    k.push_back(8);
    k.push_back(static_cast<int64_t>(v.toDevice().type()));
    k.push_back(v.toDevice().index());
  } else if (v.isGenerator()) {
    k.push_back(9);
  } else if (v.isList()) {
    auto list = v.toListRef();
    k.push_back(10);
    k.push_back(static_cast<int64_t>(list.size()));
    for (const auto& e : list)
      if (!encode(e, k)) return false;
  } else {
    return false;
  }
  return true;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<Key, std::shared_ptr<const MetaResult>, KeyHash> map;
};

Cache& cache() {
  static Cache* c = new Cache();  // NOTE: leaked on purpose; used until process exit
  return *c;
}

// The meta re-typing of one arg value (tensors and tensor lists; generators become None).
c10::IValue meta_arg(const c10::IValue& v, ArgKind kind, StorageMap& meta) {
  if (kind == ArgKind::Generator) return c10::IValue();
  if (kind == ArgKind::Device && v.isDevice() && v.toDevice().is_privateuseone())
    return c10::IValue(c10::Device(c10::DeviceType::Meta));
  auto convert = [&](const at::Tensor& t) {
    return t.defined() && t.device().is_privateuseone() ? meta.view_of(t) : t;
  };
  if (v.isTensor()) return c10::IValue(convert(v.toTensor()));
  if (v.isList()) {
    auto list = v.toList();
    bool has_tensor = false;
    for (const auto& e : v.toListRef()) has_tensor |= e.isTensor();
    if (!has_tensor) return v;
    auto copy = list.copy();
    for (size_t i = 0; i < copy.size(); ++i) {
      c10::IValue e = copy.get(i);
      if (e.isTensor()) copy.set(i, c10::IValue(convert(e.toTensor())));
    }
    return c10::IValue(copy);
  }
  return v;
}

c10::SmallVector<TensorGeom, 1> geoms_of(const c10::IValue& v) {
  c10::SmallVector<TensorGeom, 1> out;
  if (v.isTensor()) {
    out.push_back(geom_of(v.toTensor()));
  } else if (v.isList()) {
    for (const auto& e : v.toListRef())
      out.push_back(e.isTensor() ? geom_of(e.toTensor()) : TensorGeom{});
  } else {
    out.push_back(TensorGeom{});
  }
  return out;
}

// Where an op's meta kernel is a composite whose result dtypes differ from the CPU kernel's, the
// CPU kernel's dtypes win (it is what runs, and the device tensors must hold what it returns).
// Layer and batch norm: the meta kernels give bf16/fp16 inputs float32 statistics (mean/rstd,
// save_mean/save_invstd; CUDA's choice); CPU's kernels do so only for mixed calls (a weight,
// bias or running stat of another dtype), else use the input's dtype, and their backward
// kernels refuse statistics of another dtype.
bool has_low_precision_stats(std::string_view name) {
  return name == "aten::native_layer_norm" || name == "aten::native_batch_norm" ||
         name == "aten::_native_batch_norm_legit" || name == "aten::_batch_norm_with_update" ||
         name == "aten::_native_batch_norm_legit_no_training";
}

void match_cpu_dtypes(const OpInfo& info, c10::ArrayRef<c10::IValue> args, MetaResult& r) {
  if (!has_low_precision_stats(info.schema->name()) || args.empty() || r.returns.size() < 3 ||
      !args[0].isTensor()) {
    return;
  }
  const c10::ScalarType st = args[0].toTensor().scalar_type();
  if (!at::isReducedFloatingType(st)) return;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined() &&
        args[i].toTensor().scalar_type() != st) {
      return;  // mixed: float32 statistics on CPU too
    }
  }
  for (size_t k : {1, 2})
    for (auto& g : r.returns[k])
      if (g.defined) g.dtype = st;
}

std::shared_ptr<const MetaResult> compute(const c10::OperatorHandle& op, OpInfo& info,
                                          c10::ArrayRef<c10::IValue> args) {
  StorageMap meta(c10::DeviceType::Meta, /*keep_sources=*/false);
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i)
    stack.push_back(meta_arg(args[i], info.arg_kind[i], meta));
  std::vector<std::pair<int, c10::IValue>> written;
  for (size_t i = 0; i < args.size(); ++i)
    if (info.arg_is_write[i]) written.emplace_back(static_cast<int>(i), stack[i]);
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const c10::NotImplementedError&) {
    info.meta_ok = false;
    throw MetaUnavailable{};
  }
  auto result = std::make_shared<MetaResult>();
  for (const auto& v : stack) result->returns.push_back(geoms_of(v));
  for (const auto& [i, v] : written) result->writes.emplace_back(i, geoms_of(v));
  match_cpu_dtypes(info, args, *result);
  return result;
}

}  // namespace

std::shared_ptr<const MetaResult> meta_result(const c10::OperatorHandle& op, OpInfo& info,
                                              c10::ArrayRef<c10::IValue> args) {
  // NOTE: the key is built in a per-thread scratch vector that keeps its capacity (a cache hit,
  // the common case, then allocates nothing); a miss copies it out before running the meta
  // kernel, so nothing depends on the scratch afterwards.
  thread_local Key scratch;
  scratch.clear();
  scratch.push_back(reinterpret_cast<int64_t>(&info));
  bool cacheable = true;
  for (const auto& a : args) {
    if (!encode(a, scratch)) {
      cacheable = false;
      break;
    }
  }
  Cache& c = cache();
  if (cacheable) {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.map.find(scratch);
    if (it != c.map.end()) return it->second;
  }
  Key key = cacheable ? scratch : Key();
  auto result = compute(op, info, args);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.map.size() >= kMaxEntries) c.map.clear();
    c.map.emplace(std::move(key), result);
  }
  return result;
}

void meta_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.clear();
}

}  // namespace openneuron::aten
