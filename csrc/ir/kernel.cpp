// KernelBuilder (typing, hash-consing, canonical numbering), Kernel text form and serialization.
// The interpreter lives in execute.cpp.
#include "ir/kernel.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "ir/dtype.h"

namespace openneuron::ir {
namespace {

constexpr int kSerialVersion = 1;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double double_from_bits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("ir: " + msg); }

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string axes_text(uint64_t mask) {
  std::string s = "{";
  bool first = true;
  for (int d = 0; d < 64; ++d) {
    if (!(mask >> d & 1)) continue;
    if (!first) s += ",";
    s += std::to_string(d);
    first = false;
  }
  return s + "}";
}

}  // namespace

// --- dtypes and ops -------------------------------------------------------------------------

const OpTraits& op_traits(Op op) {
  static const OpTraits kTraits[kNumOps] = {
#define OPENNEURON_IR_OP(name, text, arity, operands, flags) \
  {text, arity, OpOperands::k##operands, static_cast<uint8_t>(flags)},
#include "ir/ops.def"
#undef OPENNEURON_IR_OP
  };
  const int i = static_cast<int>(op);
  if (i >= kNumOps) fail("unknown op " + std::to_string(i));
  return kTraits[i];
}

const char* op_name(Op op) { return static_cast<int>(op) < kNumOps ? op_traits(op).name : "?"; }

int op_arity(Op op) { return op_traits(op).arity; }

bool op_is_reduction(Op op) { return op >= Op::kSum && op <= Op::kAmin; }

// --- Node -----------------------------------------------------------------------------------

bool Node::operator==(const Node& o) const {
  return op == o.op && dtype == o.dtype && args[0] == o.args[0] && args[1] == o.args[1] &&
         args[2] == o.args[2] && index == o.index && payload == o.payload;
}

uint64_t Node::hash() const {
  uint64_t h = mix(static_cast<uint64_t>(op), static_cast<uint64_t>(dtype));
  for (ValueId a : args) h = mix(h, static_cast<uint64_t>(static_cast<int64_t>(a)));
  h = mix(h, static_cast<uint64_t>(static_cast<int64_t>(index)));
  return mix(h, payload);
}

double Node::constant_double() const {
  return dtype_is_floating(dtype) ? double_from_bits(payload)
                                  : static_cast<double>(static_cast<int64_t>(payload));
}
int64_t Node::constant_int() const {
  return dtype_is_floating(dtype) ? static_cast<int64_t>(double_from_bits(payload))
                                  : static_cast<int64_t>(payload);
}

// --- KernelBuilder --------------------------------------------------------------------------

KernelBuilder::KernelBuilder() = default;

int KernelBuilder::add_input(DType dt) {
  if (static_cast<int>(dt) >= kNumDTypes) fail("add_input: unknown dtype");
  inputs_.push_back(dt);
  return static_cast<int>(inputs_.size()) - 1;
}

int KernelBuilder::add_output(DType dt) {
  if (static_cast<int>(dt) >= kNumDTypes) fail("add_output: unknown dtype");
  outputs_.push_back(dt);
  stored_.push_back(-1);
  return static_cast<int>(outputs_.size()) - 1;
}

DType KernelBuilder::dtype(ValueId v) const {
  check_value(v, "dtype");
  return nodes_[v].dtype;
}

void KernelBuilder::check_value(ValueId v, const char* what) const {
  if (v < 0 || v >= static_cast<ValueId>(nodes_.size()))
    fail(std::string(what) + ": value %" + std::to_string(v) + " does not exist (builder has " +
         std::to_string(nodes_.size()) + " values)");
}

ValueId KernelBuilder::intern(const Node& n) {
  auto it = index_.find(n);
  if (it != index_.end()) return it->second;
  ValueId id = static_cast<ValueId>(nodes_.size());
  nodes_.push_back(n);
  bool red = op_is_reduction(n.op);
  for (ValueId a : n.args)
    if (a >= 0 && reduced_[a]) red = true;
  reduced_.push_back(red ? 1 : 0);
  index_.emplace(n, id);
  return id;
}

ValueId KernelBuilder::load(int input) {
  if (input < 0 || input >= static_cast<int>(inputs_.size()))
    fail("load: input " + std::to_string(input) + " does not exist (kernel has " +
         std::to_string(inputs_.size()) + " inputs)");
  Node n;
  n.op = Op::kLoad;
  n.dtype = inputs_[input];
  n.index = input;
  return intern(n);
}

ValueId KernelBuilder::constant(double v, DType dt) {
  Node n;
  n.op = Op::kConstant;
  n.dtype = dt;
  switch (dt) {
    case DType::kFloat32:
      n.payload = double_bits(static_cast<double>(static_cast<float>(v)));
      break;
    case DType::kBFloat16:
      n.payload = double_bits(numeric::round_bf16(static_cast<float>(v)));
      break;
    case DType::kFloat16:
      n.payload = double_bits(numeric::round_f16(static_cast<float>(v)));
      break;
    case DType::kFloat64:
      n.payload = double_bits(v);
      break;
    case DType::kBool:
      n.payload = v != 0 ? 1 : 0;
      break;
    case DType::kInt32:
    case DType::kInt64: {
      double lo = dt == DType::kInt32 ? -2147483648.0 : -9223372036854775808.0;
      if (!(v >= lo && v < -lo) || std::trunc(v) != v)
        fail("constant: " + format_double(v) + " is not representable as " + dtype_name(dt));
      n.payload = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    }
    default:
      fail("constant: unknown dtype");
  }
  return intern(n);
}

ValueId KernelBuilder::constant(int64_t v, DType dt) {
  Node n;
  n.op = Op::kConstant;
  n.dtype = dt;
  switch (dt) {
    case DType::kFloat32:
      n.payload = double_bits(static_cast<double>(static_cast<float>(v)));
      break;
    case DType::kBFloat16:
      n.payload = double_bits(numeric::round_bf16(static_cast<float>(v)));
      break;
    case DType::kFloat16:
      n.payload = double_bits(numeric::round_f16(static_cast<float>(v)));
      break;
    case DType::kFloat64:
      n.payload = double_bits(static_cast<double>(v));
      break;
    case DType::kBool:
      n.payload = v != 0 ? 1 : 0;
      break;
    case DType::kInt32:
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail("constant: " + std::to_string(v) + " is out of range for i32");
      n.payload = static_cast<uint64_t>(v);
      break;
    case DType::kInt64:
      n.payload = static_cast<uint64_t>(v);
      break;
    default:
      fail("constant: unknown dtype");
  }
  return intern(n);
}

ValueId KernelBuilder::unary(Op op, ValueId a) {
  check_value(a, op_name(op));
  if (op_arity(op) != 1 || op == Op::kCast || op_is_reduction(op))
    fail(std::string("unary: ") + op_name(op) + " is not a unary op" +
         (op == Op::kCast       ? " (use cast())"
          : op_is_reduction(op) ? " (use reduce())"
                                : ""));
  DType dt = nodes_[a].dtype;
  DType out = dt;
  auto bad = [&](const char* need) {
    fail(std::string(op_name(op)) + ": operand %" + std::to_string(a) + " has dtype " +
         dtype_name(dt) + ", needs " + need + " (insert a cast)");
  };
  const OpTraits& t = op_traits(op);
  if (t.operands == OpOperands::kFloating) {
    if (!dtype_is_floating(dt)) bad("a floating dtype");
    if (op == Op::kIsNan) out = DType::kBool;
  } else if (op == Op::kLogicalNot) {
    out = DType::kBool;
  } else if (op == Op::kBitNot) {
    if (dtype_is_floating(dt)) bad("an integer or bool dtype");
  } else {  // neg abs sign floor ceil trunc round
    if (dt == DType::kBool) bad("a numeric (non-bool) dtype");
    if (!dtype_is_floating(dt) && t.has(kIntIdentity)) return a;
  }
  Node n;
  n.op = op;
  n.dtype = out;
  n.args[0] = a;
  return intern(n);
}

ValueId KernelBuilder::binary(Op op, ValueId a, ValueId b) {
  check_value(a, op_name(op));
  check_value(b, op_name(op));
  if (op_arity(op) != 2) fail(std::string("binary: ") + op_name(op) + " is not a binary op");
  DType da = nodes_[a].dtype, db = nodes_[b].dtype;
  if (da != db)
    fail(std::string(op_name(op)) + ": operand dtypes differ (%" + std::to_string(a) + ": " +
         dtype_name(da) + ", %" + std::to_string(b) + ": " + dtype_name(db) +
         "); cast to a common dtype first");
  DType out = da;
  if (op >= Op::kEq && op <= Op::kLogicalXor) {
    out = DType::kBool;
  } else if (op >= Op::kBitAnd && op <= Op::kBitXor) {
    if (dtype_is_floating(da))
      fail(std::string(op_name(op)) + ": needs integer or bool operands, got " + dtype_name(da));
  } else if (da == DType::kBool && op != Op::kMax && op != Op::kMin) {
    fail(std::string(op_name(op)) +
         ": bool operands are not supported; cast to an integer dtype "
         "or use logical/bit ops");
  }
  Node n;
  n.op = op;
  n.dtype = out;
  n.args[0] = a;
  n.args[1] = b;
  return intern(n);
}

ValueId KernelBuilder::fma(ValueId a, ValueId b, ValueId c) {
  check_value(a, "fma");
  check_value(b, "fma");
  check_value(c, "fma");
  DType dt = nodes_[a].dtype;
  if (nodes_[b].dtype != dt || nodes_[c].dtype != dt)
    fail(std::string("fma: operand dtypes differ (") + dtype_name(dt) + ", " +
         dtype_name(nodes_[b].dtype) + ", " + dtype_name(nodes_[c].dtype) + ")");
  if (dt == DType::kBool) fail("fma: bool operands are not supported");
  Node n;
  n.op = Op::kFma;
  n.dtype = dt;
  n.args[0] = a;
  n.args[1] = b;
  n.args[2] = c;
  return intern(n);
}

ValueId KernelBuilder::where(ValueId cond, ValueId a, ValueId b) {
  check_value(cond, "where");
  check_value(a, "where");
  check_value(b, "where");
  if (nodes_[cond].dtype != DType::kBool)
    fail(std::string("where: condition must be bool, got ") + dtype_name(nodes_[cond].dtype));
  if (nodes_[a].dtype != nodes_[b].dtype)
    fail(std::string("where: branch dtypes differ (") + dtype_name(nodes_[a].dtype) + ", " +
         dtype_name(nodes_[b].dtype) + "); cast to a common dtype first");
  if (a == b) return a;
  Node n;
  n.op = Op::kWhere;
  n.dtype = nodes_[a].dtype;
  n.args[0] = cond;
  n.args[1] = a;
  n.args[2] = b;
  return intern(n);
}

ValueId KernelBuilder::cast(ValueId a, DType dt) {
  check_value(a, "cast");
  if (static_cast<int>(dt) >= kNumDTypes) fail("cast: unknown dtype");
  if (nodes_[a].dtype == dt) return a;
  Node n;
  n.op = Op::kCast;
  n.dtype = dt;
  n.args[0] = a;
  return intern(n);
}

ValueId KernelBuilder::reduce(Op op, ValueId a, uint64_t axes_mask) {
  check_value(a, "reduce");
  if (op == Op::kAdd) op = Op::kSum;
  if (op == Op::kMul) op = Op::kProd;
  if (op == Op::kMax) op = Op::kAmax;
  if (op == Op::kMin) op = Op::kAmin;
  if (!op_is_reduction(op))
    fail(std::string("reduce: ") + op_name(op) + " is not a reduction (sum, prod, amax, amin)");
  DType dt = nodes_[a].dtype;
  if (dt == DType::kBool && (op == Op::kSum || op == Op::kProd))
    fail(std::string(op_name(op)) + ": bool operand; cast to an integer dtype first");
  if (axes_mask == 0) fail(std::string(op_name(op)) + ": empty axes mask");
  if (reduced_[a])
    fail(std::string(op_name(op)) + ": operand %" + std::to_string(a) +
         " already depends on a reduction; reduce in two kernels");
  if (reduce_mask_ != 0 && reduce_mask_ != axes_mask)
    fail(std::string(op_name(op)) + ": axes " + axes_text(axes_mask) +
         " differ from the kernel's other reductions over " + axes_text(reduce_mask_) +
         "; all reductions of a kernel reduce the same axes");
  reduce_mask_ = axes_mask;
  Node n;
  n.op = op;
  n.dtype = dt;
  n.args[0] = a;
  n.payload = axes_mask;
  return intern(n);
}

void KernelBuilder::store(int output, ValueId v) {
  if (output < 0 || output >= static_cast<int>(outputs_.size()))
    fail("store: output " + std::to_string(output) + " does not exist (kernel has " +
         std::to_string(outputs_.size()) + " outputs)");
  check_value(v, "store");
  if (stored_[output] >= 0) fail("store: output " + std::to_string(output) + " stored twice");
  if (nodes_[v].dtype != outputs_[output])
    fail("store: value %" + std::to_string(v) + " has dtype " + dtype_name(nodes_[v].dtype) +
         " but output " + std::to_string(output) + " is " + dtype_name(outputs_[output]) +
         "; cast first");
  stored_[output] = v;
}

std::shared_ptr<const Kernel> KernelBuilder::build() {
  if (outputs_.empty()) fail("build: kernel has no outputs");
  for (size_t i = 0; i < stored_.size(); ++i)
    if (stored_[i] < 0) fail("build: output " + std::to_string(i) + " was never stored");
  // Canonical numbering: iterative post-order DFS from the outputs, operands in order.
  std::vector<ValueId> remap(nodes_.size(), -1);
  std::vector<Node> order;
  order.reserve(nodes_.size());
  std::vector<std::pair<ValueId, int>> stack;
  for (ValueId root : stored_) {
    if (remap[root] >= 0) continue;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      const Node& n = nodes_[v];
      if (next < 3 && n.args[next] >= 0) {
        ValueId child = n.args[next++];
        if (remap[child] < 0) stack.push_back({child, 0});
        continue;
      }
      if (next < 3) {
        ++next;
        continue;
      }
      if (remap[v] < 0) {
        Node m = n;
        for (ValueId& x : m.args)
          if (x >= 0) x = remap[x];
        remap[v] = static_cast<ValueId>(order.size());
        order.push_back(m);
      }
      stack.pop_back();
    }
  }
  auto k = std::make_shared<Kernel>();
  k->inputs_ = inputs_;
  k->outputs_ = outputs_;
  k->nodes_ = std::move(order);
  for (ValueId v : stored_) k->output_values_.push_back(remap[v]);
  k->reduced_.resize(k->nodes_.size());
  k->reduce_mask_ = 0;
  for (size_t i = 0; i < k->nodes_.size(); ++i) {
    const Node& n = k->nodes_[i];
    bool red = op_is_reduction(n.op);
    if (red) k->reduce_mask_ = n.payload;
    for (ValueId a : n.args)
      if (a >= 0 && k->reduced_[a]) red = true;
    k->reduced_[i] = red ? 1 : 0;
  }
  uint64_t h = mix(0x4F4E4952ull, k->inputs_.size());
  for (DType d : k->inputs_) h = mix(h, static_cast<uint64_t>(d));
  h = mix(h, k->outputs_.size());
  for (DType d : k->outputs_) h = mix(h, static_cast<uint64_t>(d));
  for (const Node& n : k->nodes_) h = mix(h, n.hash());
  for (ValueId v : k->output_values_) h = mix(h, static_cast<uint64_t>(v));
  k->hash_ = h;
  nodes_.clear();
  index_.clear();
  reduced_.clear();
  return k;
}

// --- Kernel ---------------------------------------------------------------------------------

bool Kernel::operator==(const Kernel& o) const {
  return hash_ == o.hash_ && inputs_ == o.inputs_ && outputs_ == o.outputs_ && nodes_ == o.nodes_ &&
         output_values_ == o.output_values_;
}

std::string Kernel::to_text() const {
  std::ostringstream os;
  os << "kernel(";
  for (size_t i = 0; i < inputs_.size(); ++i)
    os << (i ? ", " : "") << "in" << i << ": " << dtype_name(inputs_[i]);
  os << ") -> (";
  for (size_t i = 0; i < outputs_.size(); ++i)
    os << (i ? ", " : "") << "out" << i << ": " << dtype_name(outputs_[i]);
  os << ")\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    os << "  %" << i << " = " << op_name(n.op);
    if (n.op == Op::kLoad) {
      os << " in" << n.index;
    } else if (n.op == Op::kConstant) {
      if (dtype_is_floating(n.dtype))
        os << " " << format_double(n.constant_double());
      else if (n.dtype == DType::kBool)
        os << (n.payload ? " true" : " false");
      else
        os << " " << n.constant_int();
    } else {
      for (int j = 0; j < 3 && n.args[j] >= 0; ++j) os << (j ? ", %" : " %") << n.args[j];
      if (op_is_reduction(n.op)) os << " axes=" << axes_text(n.payload);
    }
    os << " : " << dtype_name(n.dtype) << "\n";
  }
  for (size_t i = 0; i < output_values_.size(); ++i)
    os << "  out" << i << " = %" << output_values_[i] << "\n";
  return os.str();
}

std::string Kernel::serialize() const {
  std::ostringstream os;
  os << "onir " << kSerialVersion << "\nin";
  for (DType d : inputs_) os << " " << static_cast<int>(d);
  os << "\nout";
  for (DType d : outputs_) os << " " << static_cast<int>(d);
  os << "\nnodes " << nodes_.size() << "\n";
  char buf[128];
  for (const Node& n : nodes_) {
    std::snprintf(buf, sizeof(buf), "%d %d %d %d %d %d %llx\n", static_cast<int>(n.op),
                  static_cast<int>(n.dtype), n.args[0], n.args[1], n.args[2], n.index,
                  static_cast<unsigned long long>(n.payload));
    os << buf;
  }
  os << "st";
  for (ValueId v : output_values_) os << " " << v;
  os << "\n";
  std::string body = os.str();
  std::snprintf(buf, sizeof(buf), "sum %016llx\n",
                static_cast<unsigned long long>(fnv1a(body.data(), body.size())));
  return body + buf;
}

std::shared_ptr<const Kernel> Kernel::deserialize(const std::string& data) {
  auto bad = [](const std::string& why) -> void { fail("deserialize: " + why); };
  size_t sum_pos = data.rfind("sum ");
  if (sum_pos == std::string::npos || data.compare(0, 5, "onir ") != 0) {
    bad("not a serialized kernel");
  }
  unsigned long long want = 0;
  if (std::sscanf(data.c_str() + sum_pos, "sum %llx", &want) != 1 ||
      fnv1a(data.data(), sum_pos) != want)
    bad("checksum mismatch (corrupt data)");
  std::istringstream is(data.substr(0, sum_pos));
  std::string word, line;
  int version = 0;
  is >> word >> version;
  if (version != kSerialVersion)
    bad("version " + std::to_string(version) + ", this build reads " +
        std::to_string(kSerialVersion));
  KernelBuilder b;
  auto read_dtypes = [&](const char* tag, bool in) {
    is >> word;
    if (word != tag) bad(std::string("expected '") + tag + "'");
    std::getline(is, line);
    std::istringstream ls(line);
    int d;
    while (ls >> d) {
      if (d < 0 || d >= kNumDTypes) bad("bad dtype " + std::to_string(d));
      if (in)
        b.add_input(static_cast<DType>(d));
      else
        b.add_output(static_cast<DType>(d));
    }
  };
  read_dtypes("in", true);
  read_dtypes("out", false);
  size_t count = 0;
  is >> word >> count;
  if (word != "nodes" || !is || count > (size_t{1} << 24)) bad("bad node count");
  std::vector<Node> parsed;
  for (size_t i = 0; i < count; ++i) {
    int op, dt, a0, a1, a2, index;
    unsigned long long payload;
    is >> op >> dt >> a0 >> a1 >> a2 >> index >> std::hex >> payload >> std::dec;
    if (!is || op < 0 || op >= kNumOps || dt < 0 || dt >= kNumDTypes)
      bad("bad node " + std::to_string(i));
    Node n;
    n.op = static_cast<Op>(op);
    n.dtype = static_cast<DType>(dt);
    n.args[0] = a0;
    n.args[1] = a1;
    n.args[2] = a2;
    n.index = index;
    n.payload = payload;
    int ar = op_arity(n.op);
    for (int j = 0; j < 3; ++j) {
      bool want_arg = j < ar;
      if (want_arg != (n.args[j] >= 0) || n.args[j] >= static_cast<ValueId>(i))
        bad("bad operand in node " + std::to_string(i));
    }
    ValueId got = -1;
    switch (n.op) {
      case Op::kLoad:
        got = b.load(index);
        break;
      case Op::kConstant:
        if (dtype_is_floating(n.dtype)) {
          got = b.constant(double_from_bits(payload), n.dtype);
        } else {
          got = b.constant(static_cast<int64_t>(payload), n.dtype);
        }
        break;
      case Op::kFma:
        got = b.fma(a0, a1, a2);
        break;
      case Op::kWhere:
        got = b.where(a0, a1, a2);
        break;
      case Op::kCast:
        got = b.cast(a0, n.dtype);
        break;
      default:
        if (op_is_reduction(n.op))
          got = b.reduce(n.op, a0, payload);
        else if (ar == 1)
          got = b.unary(n.op, a0);
        else
          got = b.binary(n.op, a0, a1);
    }
    if (got != static_cast<ValueId>(i) || !(b.nodes_[got] == n))
      bad("node " + std::to_string(i) + " is not canonical");
    parsed.push_back(n);
  }
  is >> word;
  if (word != "st") bad("expected 'st'");
  for (int i = 0; i < static_cast<int>(b.outputs_.size()); ++i) {
    int v = -1;
    is >> v;
    if (!is) bad("missing output value");
    b.store(i, v);
  }
  auto k = b.build();
  if (k->nodes_ != parsed) bad("nodes are not in canonical order");
  return k;
}

}  // namespace openneuron::ir
