// The per-operator info table: schema analysis and .out-overload lookup done once per op, keyed
// by the identity of the op's schema (stable for the process). See op_table.h.
#include "aten/ops/op_table.h"

#include <ATen/core/function_schema.h>

#include <deque>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace openneuron::aten {
namespace {

// Ops whose output shape (or a returned value) depends on tensor data: the async path cannot
// size their outputs at dispatch, so they always run synchronously.
bool is_data_dependent(std::string_view name, std::string_view overload) {
  static const std::unordered_set<std::string_view> kNames = {"aten::nonzero",
                                                              "aten::masked_select",
                                                              "aten::unique",
                                                              "aten::_unique",
                                                              "aten::_unique2",
                                                              "aten::unique_dim",
                                                              "aten::unique_consecutive",
                                                              "aten::unique_dim_consecutive",
                                                              "aten::bincount",
                                                              "aten::_local_scalar_dense",
                                                              "aten::item",
                                                              "aten::nonzero_numpy",
                                                              "aten::_assert_async",
                                                              "aten::_assert_async.msg",
                                                              "aten::_ragged_idx"};
  // Not histc: its output is (bins,) whatever the data (with min == max the kernel finds the
  // range itself, on the device's memory), so it runs asynchronously, as CUDA graphs rely on.
  if (kNames.count(name)) return true;
  return name == "aten::repeat_interleave" && overload.rfind("Tensor", 0) == 0;
}

bool is_index_op(std::string_view name) {
  return name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
         name == "aten::_index_put_impl_" || name == "aten::_unsafe_index" ||
         name == "aten::_unsafe_index_put";
}

// Ops whose meta kernel sizes some output differently from the CPU kernel (the CPU kernel
// returns empty or differently shaped auxiliary outputs): they run synchronously.
// NOTE: multilabel_margin_loss_forward's meta kernel (a Python decomposition) makes a 1-D input
// 2-D and so predicts output [1] where the CPU kernel returns a 0-d tensor (reduction="none").
bool meta_disagrees(std::string_view name) {
  return name == "aten::_embedding_bag_forward_only" || name == "aten::_embedding_bag" ||
         name == "aten::multilabel_margin_loss_forward";
}

// Ops without the pointwise tag whose CPU kernels only move data (OpInfo::thread_invariant).
bool moves_data_only(std::string_view name) {
  static const std::unordered_set<std::string_view> kNames = {"aten::copy_",
                                                              "aten::_to_copy",
                                                              "aten::cat",
                                                              "aten::stack",
                                                              "aten::fill_",
                                                              "aten::zero_",
                                                              "aten::arange",
                                                              "aten::index_select",
                                                              "aten::embedding",
                                                              "aten::clone",
                                                              "aten::gather",
                                                              "aten::index_copy",
                                                              "aten::index_copy_",
                                                              "aten::slice_scatter",
                                                              "aten::select_scatter",
                                                              "aten::constant_pad_nd",
                                                              "aten::repeat",
                                                              "aten::flip",
                                                              "aten::roll",
                                                              "aten::tril",
                                                              "aten::triu",
                                                              "aten::masked_fill",
                                                              "aten::masked_fill_",
                                                              "aten::where"};
  return kNames.count(name) > 0;
}

// Batch norm in eval mode: the CPU kernel returns empty save_mean/save_invstd, the meta kernel
// sized ones.
int training_flag_arg(const c10::FunctionSchema& s) {
  if (s.name() != "aten::native_batch_norm" && s.name() != "aten::_native_batch_norm_legit")
    return -1;
  auto idx = s.argumentIndexWithName("training");
  return idx ? static_cast<int>(*idx) : -1;
}

bool is_tensor_like(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (t->kind() == c10::TypeKind::OptionalType || t->kind() == c10::TypeKind::ListType)
    return t->containedType(0)->kind() == c10::TypeKind::TensorType;
  return false;
}

void analyze(OpInfo& info, const c10::FunctionSchema& s, const c10::OperatorHandle* op) {
  info.schema = &s;
  const auto& args = s.arguments();
  const auto& rets = s.returns();
  info.num_args = args.size();
  info.num_returns = rets.size();
  for (const auto& a : args) {
    bool write = a.alias_info() && a.alias_info()->isWrite();
    info.arg_is_write.push_back(write);
    info.has_write_args |= write;
    ArgKind kind = ArgKind::Other;
    const auto& t = a.type();
    auto base = t->kind() == c10::TypeKind::OptionalType ? t->containedType(0) : t;
    if (base->kind() == c10::TypeKind::GeneratorType) kind = ArgKind::Generator;
    if (base->kind() == c10::TypeKind::DeviceObjType) kind = ArgKind::Device;
    info.has_generator |= kind == ArgKind::Generator;
    info.arg_kind.push_back(kind);
  }
  for (const auto& r : rets) {
    info.returns_tensors_only &= is_tensor_like(r.type());
    info.returns_single_tensors &= r.type()->kind() == c10::TypeKind::TensorType;
    int alias = -1;
    bool write = false;
    if (const auto* ai = r.alias_info()) {
      write = ai->isWrite();
      for (size_t i = 0; i < args.size() && alias < 0; ++i) {
        const auto* aa = args[i].alias_info();
        if (!aa) continue;
        for (const auto& set : ai->beforeSets())
          if (aa->beforeSets().count(set)) alias = static_cast<int>(i);
      }
    }
    info.return_alias_arg.push_back(alias);
    info.return_is_write.push_back(write && alias >= 0);
  }
  info.data_dependent = is_data_dependent(s.name(), s.overload_name());
  info.index_op = is_index_op(s.name());
  if (info.data_dependent) {
    info.no_async_reason = "its output shape depends on tensor values";
  } else if (!info.returns_tensors_only) {
    info.no_async_reason = "it returns non-tensor values";
  } else if (op && !op->hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    info.no_async_reason = "it has no meta kernel";
  } else if (meta_disagrees(s.name())) {
    info.no_async_reason = "its meta kernel sizes outputs differently from its CPU kernel";
  }
  info.sync_by_nature = info.data_dependent || !info.returns_tensors_only;
  info.training_arg = training_flag_arg(s);
  info.thread_invariant = (op && op->hasTag(at::Tag::pointwise)) || moves_data_only(s.name());
  static const std::unordered_set<std::string> kGemms = {"aten::mm", "aten::addmm", "aten::bmm",
                                                         "aten::baddbmm"};
  info.reduced_gemm = kGemms.count(s.name()) > 0;
}

struct Table {
  std::mutex mu;
  std::unordered_map<const void*, OpInfo*> by_key;   // by schema
  std::unordered_map<std::string, OpInfo*> by_name;  // native kernels' own: by "name.overload"
  std::deque<OpInfo> infos;                          // stable addresses
  std::deque<std::string> names;
};

Table& table() {
  static Table* t = new Table();  // NOTE: leaked on purpose; work items may run at exit
  return *t;
}

OpInfo& create_locked(Table& t, const std::string& name) {
  t.names.push_back(name);
  OpInfo& info = t.infos.emplace_back();
  info.name = t.names.back().c_str();
  return info;
}

}  // namespace

OpInfo& op_info_slow(const c10::OperatorHandle& op);

OpInfo& op_info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& s = op.schema();
  // NOTE: infos live for the process, so a per-thread cache needs no invalidation.
  thread_local std::unordered_map<const void*, OpInfo*> local;
  auto hit = local.find(&s);
  if (hit != local.end()) return *hit->second;
  OpInfo& info = op_info_slow(op);
  local.emplace(&s, &info);
  return info;
}

OpInfo& op_info_slow(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& s = op.schema();
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_key.find(&s);
  if (it != t.by_key.end()) return *it->second;
  std::string name = s.name();
  if (!s.overload_name().empty()) name += "." + s.overload_name();
  OpInfo& info = create_locked(t, name);
  t.by_key.emplace(&s, &info);
  analyze(info, s, &op);
  return info;
}

OpInfo& op_info(const char* name, const char* overload) {
  // NOTE: keyed by the full name: keyed by the name's pointer, two overloads of one op (histc
  // and histc.out) shared the first one's row.
  std::string full = name;
  if (overload && *overload) full += std::string(".") + overload;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_name.find(full);
  if (it != t.by_name.end()) return *it->second;
  OpInfo& info = create_locked(t, full);
  t.by_name.emplace(full, &info);
  return info;
}

std::vector<OpInfo*> op_info_all() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<OpInfo*> out;
  for (auto& i : t.infos) out.push_back(&i);
  return out;
}

}  // namespace openneuron::aten
