// The interpreter's plan (see program.h): a kernel compiled once into the full-domain and the
// reduced-domain instruction programs, with value slots assigned and rounding decided per node.
#include <algorithm>
#include <memory>
#include <vector>

#include "ir/program.h"

namespace openneuron::ir::detail {

bool exact_on_values(Op op) { return op_traits(op).has(kExactOnValues); }

// Builds one program from the needed values (ascending ids = topological order).
void build_program(const Kernel& k, const std::vector<uint8_t>& needed, bool reduced_domain,
                   const std::vector<std::pair<int, ValueId>>& stores,
                   const std::vector<ValueId>& keep_alive, Program* p) {
  int nv = k.num_values();
  p->slot.assign(nv, -1);
  p->stores = stores;
  std::vector<int> last_use(nv, -1);
  const int kForever = std::numeric_limits<int>::max();
  std::vector<ValueId> order;
  for (ValueId v = 0; v < nv; ++v) {
    if (!needed[v]) continue;
    const Node& n = k.node(v);
    bool source =
        n.op == Op::kLoad || n.op == Op::kConstant || (reduced_domain && op_is_reduction(n.op));
    if (n.op == Op::kLoad) p->loads.push_back(v);
    if (n.op == Op::kConstant) p->consts.push_back(v);
    if (reduced_domain && op_is_reduction(n.op)) p->red_inputs.push_back(v);
    if (source) continue;
    order.push_back(v);
    int at = static_cast<int>(order.size()) - 1;
    for (ValueId a : n.args)
      if (a >= 0) last_use[a] = std::max(last_use[a], at);
  }
  for (auto& st : stores) last_use[st.second] = kForever;
  for (ValueId v : keep_alive) last_use[v] = kForever;
  // Slots: constants pinned; loads live until their last use; computed values likewise.
  std::vector<int> free_slots;
  auto alloc = [&]() {
    if (!free_slots.empty()) {
      int s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return p->nslots++;
  };
  for (ValueId v : p->consts) p->slot[v] = alloc();
  for (ValueId v : p->loads) p->slot[v] = alloc();
  // Loads whose only uses are... are kept simple: freed after their last instruction.
  for (size_t i = 0; i < order.size(); ++i) {
    ValueId v = order[i];
    const Node& n = k.node(v);
    p->slot[v] = alloc();
    Instr in{};
    in.op = n.op;
    in.out = v;
    in.a = n.args[0];
    in.b = n.args[1];
    in.c = n.args[2];
    DType arg_dt = k.node(n.op == Op::kWhere ? n.args[1] : n.args[0]).dtype;
    in.kind = kind_of(arg_dt);
    in.out_kind = kind_of(n.dtype);
    in.round = exact_on_values(n.op) ? 0 : round_code(n.dtype);
    if (n.op == Op::kCast && kind_of(arg_dt) == Kind::kF32 && n.dtype != DType::kFloat32 &&
        n.dtype != DType::kBFloat16 && n.dtype != DType::kFloat16) {
      in.round = 0;
    }
    p->instrs.push_back(in);
    for (int j = 0; j < 3; ++j) {
      ValueId a = n.args[j];
      if (a < 0 || last_use[a] != static_cast<int>(i) || p->slot[a] < 0) continue;
      bool dup = false;
      for (int m = 0; m < j; ++m) dup |= n.args[m] == a;
      const Node& an = k.node(a);
      bool pinned = an.op == Op::kConstant || (reduced_domain && op_is_reduction(an.op));
      if (!dup && !pinned) free_slots.push_back(p->slot[a]);
    }
  }
}

std::shared_ptr<const Plan> make_plan(const Kernel& k) {
  auto plan = std::make_shared<Plan>();
  int nv = k.num_values();
  std::vector<std::pair<int, ValueId>> full_stores, red_stores;
  plan->output_reduced.assign(k.num_outputs(), 0);
  for (int o = 0; o < k.num_outputs(); ++o) {
    ValueId v = k.output_value(o);
    if (k.is_reduced(v)) {
      red_stores.push_back({o, v});
      plan->output_reduced[o] = 1;
    } else {
      full_stores.push_back({o, v});
    }
  }
  for (ValueId v = 0; v < nv; ++v)
    if (op_is_reduction(k.node(v).op)) plan->reductions.push_back(v);
  // Reduced program: walk back from reduced stores, stopping at reductions.
  std::vector<uint8_t> need_red(nv, 0), need_full(nv, 0);
  for (auto& st : red_stores) need_red[st.second] = 1;
  for (ValueId v = nv - 1; v >= 0; --v) {
    if (!need_red[v] || op_is_reduction(k.node(v).op)) continue;
    for (ValueId a : k.node(v).args)
      if (a >= 0) need_red[a] = 1;
  }
  for (auto& st : full_stores) need_full[st.second] = 1;
  std::vector<ValueId> red_operands;
  for (ValueId r : plan->reductions) {
    need_full[k.node(r).args[0]] = 1;
    red_operands.push_back(k.node(r).args[0]);
  }
  for (ValueId v = nv - 1; v >= 0; --v) {
    if (!need_full[v]) continue;
    for (ValueId a : k.node(v).args)
      if (a >= 0) need_full[a] = 1;
  }
  build_program(k, need_full, false, full_stores, red_operands, &plan->full);
  build_program(k, need_red, true, red_stores, {}, &plan->reduced);
  plan->input_in_reduced.assign(k.num_inputs(), 0);
  for (ValueId v : plan->reduced.loads) plan->input_in_reduced[k.node(v).index] = 1;
  return plan;
}

}  // namespace openneuron::ir::detail
