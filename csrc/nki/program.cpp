// Parsing and checking of a traced NKI program, and the run loop over its grid instances. The
// per-instruction loops are in execute.cpp (elementwise, reductions) and matmul.cpp.
#include "nki/program.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "runtime/parallel.h"

namespace openneuron::nki {

size_t dtype_size(DType dt) {
  switch (dt) {
#define OPENNEURON_NKI_DTYPE_SIZE(name, size) \
  case DType::k_##name:                       \
    return size;
    OPENNEURON_NKI_DTYPES(OPENNEURON_NKI_DTYPE_SIZE)
#undef OPENNEURON_NKI_DTYPE_SIZE
    default:
      return 0;
  }
}

const char* dtype_name(DType dt) {
  switch (dt) {
#define OPENNEURON_NKI_DTYPE_NAME(name, size) \
  case DType::k_##name:                       \
    return #name;
    OPENNEURON_NKI_DTYPES(OPENNEURON_NKI_DTYPE_NAME)
#undef OPENNEURON_NKI_DTYPE_NAME
    default:
      return "?";
  }
}

int op_arity(Op op) {
  switch (op) {
#define OPENNEURON_NKI_OP_ARITY(name, arity) \
  case Op::k_##name:                         \
    return arity;
    OPENNEURON_NKI_OPS(OPENNEURON_NKI_OP_ARITY)
#undef OPENNEURON_NKI_OP_ARITY
    default:
      return 0;
  }
}

const char* op_name(Op op) {
  switch (op) {
#define OPENNEURON_NKI_OP_NAME(name, arity) \
  case Op::k_##name:                        \
    return #name;
    OPENNEURON_NKI_OPS(OPENNEURON_NKI_OP_NAME)
#undef OPENNEURON_NKI_OP_NAME
    default:
      return "?";
  }
}

namespace {

constexpr int64_t kMagic = 0x4E4B4931;  // "NKI1"

class Reader {
 public:
  Reader(const int64_t* code, size_t n, const std::string& name) : p_(code), n_(n), name_(name) {}
  int64_t next() {
    if (i_ >= n_) fail("truncated program");
    return p_[i_++];
  }
  int64_t next_in(int64_t lo, int64_t hi, const char* what) {
    const int64_t v = next();
    if (v < lo || v > hi) fail(std::string("bad ") + what + " " + std::to_string(v));
    return v;
  }
  float next_float() {
    const int64_t bits = next();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return static_cast<float>(d);
  }
  bool done() const { return i_ == n_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("nki kernel '" + name_ + "': invalid program (" + why + ")");
  }

 private:
  const int64_t* p_;
  size_t n_;
  size_t i_ = 0;
  const std::string& name_;
};

Operand read_operand(Reader& r, int ndim, int n_slots) {
  Operand o;
  o.type = static_cast<Operand::Type>(r.next_in(0, 2, "operand type"));
  o.dtype = static_cast<DType>(r.next_in(0, static_cast<int64_t>(DType::kCount) - 1, "dtype"));
  o.slot = static_cast<int32_t>(r.next_in(0, n_slots - 1, "slot"));
  o.offset = r.next();
  for (int d = 0; d < ndim; ++d) o.stride[d] = r.next();
  o.value = r.next_float();
  return o;
}

// The lowest and highest element a view reaches over the iteration box.
void view_span(const Operand& o, const Instr& in, int64_t* lo, int64_t* hi) {
  *lo = o.offset;
  *hi = o.offset;
  for (int d = 0; d < in.ndim; ++d) {
    if (in.extent[d] == 0) {
      *hi = *lo - 1;
      return;
    }
    const int64_t reach = o.stride[d] * (in.extent[d] - 1);
    (reach < 0 ? *lo : *hi) += reach;
  }
}

void check_view(const Reader& r, const Program& p, const Operand& o, const Instr& in,
                const char* role) {
  if (o.type != Operand::kView) return;
  int64_t lo, hi;
  view_span(o, in, &lo, &hi);
  if (hi < lo) return;  // empty
  const int64_t size = static_cast<int64_t>(dtype_size(o.dtype));
  const int64_t bytes = p.slot_bytes[static_cast<size_t>(o.slot)];
  if (lo < 0 || (hi + 1) * size > bytes) {
    const std::string where =
        in.line >= 0 && static_cast<size_t>(in.line) < p.lines.size() ? p.lines[in.line] : "?";
    r.fail(std::string(role) + " out of bounds at " + where + ": elements [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "] of slot " + std::to_string(o.slot) + " (" +
           std::to_string(bytes) + " bytes)");
  }
}

Instr read_instr(Reader& r, const Program& p) {
  Instr in;
  const int n_slots = static_cast<int>(p.slot_bytes.size());
  in.kind = static_cast<Kind>(r.next_in(0, 1, "instruction kind"));
  in.ndim = static_cast<int>(r.next_in(1, kMaxDims, "rank"));
  for (int d = 0; d < in.ndim; ++d) in.extent[d] = r.next_in(0, int64_t{1} << 40, "extent");
  in.nreduce = static_cast<int>(r.next_in(0, in.ndim, "reduced axes"));
  const int64_t n_ops = static_cast<int64_t>(Op::kCount) - 1;
  in.reduce_op = static_cast<Op>(r.next_in(0, n_ops, "reduce op"));
  in.accumulate = r.next_in(0, 1, "accumulate flag") != 0;
  in.acc_op = static_cast<Op>(r.next_in(0, n_ops, "accumulate op"));
  in.post_scale = r.next_float();
  in.line = static_cast<int32_t>(r.next_in(-1, static_cast<int64_t>(p.lines.size()) - 1, "line"));
  in.dst = read_operand(r, in.ndim, n_slots);
  if (in.dst.type != Operand::kView) r.fail("destination is not a view");
  const int64_t n_src = r.next_in(0, kMaxRegisters, "operand count");
  for (int64_t i = 0; i < n_src; ++i) in.src.push_back(read_operand(r, in.ndim, n_slots));
  const int64_t n_steps = r.next_in(0, kMaxRegisters - n_src, "step count");
  for (int64_t s = 0; s < n_steps; ++s) {
    Step st;
    st.op = static_cast<Op>(r.next_in(0, n_ops, "op"));
    const int64_t limit = n_src + s - 1;  // a step reads operands and earlier steps only
    st.a = static_cast<uint8_t>(r.next_in(0, limit, "register"));
    st.b = static_cast<uint8_t>(r.next_in(0, limit, "register"));
    st.c = static_cast<uint8_t>(r.next_in(0, limit, "register"));
    in.steps.push_back(st);
  }
  const int64_t n_preds = r.next_in(0, 64, "predicate count");
  for (int64_t i = 0; i < n_preds; ++i) {
    Pred pr;
    pr.c = r.next();
    for (int d = 0; d < in.ndim; ++d) pr.coef[d] = r.next();
    in.preds.push_back(pr);
  }
  if (in.kind == Kind::kMatmul) {
    if (in.ndim != 3 || in.src.size() != 2 || in.nreduce != 0 || !in.preds.empty() ||
        in.extent[0] > 128 || in.extent[2] > 128 || in.extent[1] > 512)
      r.fail("malformed matmul");
    if (in.dst.stride[2] != 0 || in.src[0].stride[1] != 0 || in.src[1].stride[0] != 0)
      r.fail("matmul operand strides");
  } else if (in.steps.empty() && in.src.size() != 1) {
    r.fail("elementwise instruction without a result");
  }
  // A reduction writes each output once: its destination must not move along reduced axes.
  for (int d = in.ndim - in.nreduce; d < in.ndim; ++d)
    if (in.dst.stride[d] != 0) r.fail("reduction destination moves along a reduced axis");
  for (const Operand& o : in.src)
    if (o.type == Operand::kView) check_view(r, p, o, in, "operand");
  check_view(r, p, in.dst, in, "destination");
  return in;
}

// One arena per thread, reused across runs (a fresh 24 MiB allocation per launch would fault in
// every page again).
char* thread_arena(int64_t bytes) {
  struct Arena {
    char* p = nullptr;
    int64_t size = 0;
    ~Arena() { std::free(p); }
  };
  thread_local Arena arena;
  if (arena.size < bytes) {
    std::free(arena.p);
    const size_t rounded = (static_cast<size_t>(bytes) + 4095) & ~size_t{4095};
    arena.p = static_cast<char*>(std::aligned_alloc(64, rounded));
    if (arena.p == nullptr) throw std::bad_alloc();
    arena.size = static_cast<int64_t>(rounded);
  }
  return arena.p;
}

void run_instance(const Program& p, const std::vector<Instr>& instrs, void* const* slots,
                  bool parallel, uint64_t seed) {
  const size_t n_slots = p.slot_bytes.size();
  char* local[64];
  for (size_t i = 0; i < n_slots; ++i) local[i] = static_cast<char*>(slots[i]);
  if (local[n_slots - 1] == nullptr) local[n_slots - 1] = thread_arena(p.slot_bytes.back());
  for (const Instr& in : instrs) {
    if (in.kind == Kind::kMatmul)
      run_matmul(in, local);
    else
      run_elementwise(in, local, parallel, seed);
  }
}

}  // namespace

Program* program_parse(const int64_t* code, size_t n_words, std::string name,
                       std::vector<std::string> lines) {
  auto p = std::make_unique<Program>();
  p->name = std::move(name);
  p->lines = std::move(lines);
  Reader r(code, n_words, p->name);
  if (r.next() != kMagic) r.fail("bad magic");
  const int64_t n_slots = r.next_in(1, 64, "slot count");
  for (int64_t i = 0; i < n_slots; ++i)
    p->slot_bytes.push_back(r.next_in(0, int64_t{1} << 46, "slot size"));
  const int64_t n_instances = r.next_in(1, int64_t{1} << 20, "instance count");
  for (int64_t g = 0; g < n_instances; ++g) {
    const int64_t n = r.next_in(0, int64_t{1} << 26, "instruction count");
    std::vector<Instr> instrs;
    instrs.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) instrs.push_back(read_instr(r, *p));
    p->n_instrs += n;
    p->instances.push_back(std::move(instrs));
  }
  if (!r.done()) r.fail("trailing words");
  return p.release();
}

void program_run(const Program& p, void* const* slots) {
  const uint64_t seed = p.launches.fetch_add(1, std::memory_order_relaxed);
  const int64_t n = static_cast<int64_t>(p.instances.size());
  if (n == 1) {
    run_instance(p, p.instances[0], slots, /*parallel=*/true, seed);
    return;
  }
  // Each instance gets its own arena (its thread's) unless the caller passed one; instances
  // share only HBM, as on a device. Errors are collected: parallel bodies must not throw.
  const bool own_arena = slots[p.slot_bytes.size() - 1] == nullptr;
  std::vector<void*> shared(slots, slots + p.slot_bytes.size());
  std::atomic<bool> failed{false};
  std::string error;
  std::atomic_flag error_taken = ATOMIC_FLAG_INIT;
  if (!own_arena) {  // one caller arena cannot serve instances at once
    for (int64_t g = 0; g < n; ++g) run_instance(p, p.instances[g], slots, true, seed);
    return;
  }
  runtime::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e && !failed.load(std::memory_order_relaxed); ++g) {
      try {
        run_instance(p, p.instances[static_cast<size_t>(g)], shared.data(), false, seed);
      } catch (const std::exception& ex) {
        if (!error_taken.test_and_set()) error = ex.what();
        failed.store(true);
      }
    }
  });
  if (failed.load()) throw std::runtime_error(error);
}

}  // namespace openneuron::nki
