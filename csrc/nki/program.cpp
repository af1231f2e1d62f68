// Parsing and checking of a traced NKI program and its schedule (consecutive instructions
// grouped to run block of rows by block of rows, see Group in program.h). Running it is run.cpp;
// the per-instruction loops are in execute.cpp (elementwise, reductions) and matmul.cpp.
#include "nki/program.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

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

constexpr int64_t kColumnRows = 128;  // partitions of a tile

bool binary_op(Op op) { return op_arity(op) == 2; }

// See Instr (kScan): op0 over data0 and the carry, op1 over that and data1, either order each.
void check_scan(const Reader& r, const Instr& in) {
  if (in.ndim != 2 || in.nreduce != 0 || in.accumulate || in.src.size() != 3 ||
      in.steps.size() != 2)
    r.fail("malformed scan");
  const Step& s0 = in.steps[0];
  const Step& s1 = in.steps[1];
  const bool ok0 = binary_op(s0.op) && ((s0.a == 0 && s0.b == 2) || (s0.a == 2 && s0.b == 0));
  const bool ok1 = binary_op(s1.op) && ((s1.a == 3 && s1.b == 1) || (s1.a == 1 && s1.b == 3));
  if (!ok0 || !ok1) r.fail("scan steps");
  const Operand& init = in.src[2];
  if (init.type == Operand::kIota || (init.type == Operand::kView && init.stride[1] != 0))
    r.fail("scan initial value is not one value per row");
  // run_scan reads data0 / data1 as views (constants too); an iota would be read as memory
  if (in.src[0].type == Operand::kIota || in.src[1].type == Operand::kIota)
    r.fail("scan data is an iota");
}

// See Instr (kGather): every read it can make lies inside its slot (indices are checked when
// read); local_gather's: partitions a multiple of 16 with index columns enough for n_valid.
void check_gather(const Reader& r, const Program& p, const Instr& in) {
  const Operand& src = in.src.size() == 2 ? in.src[0] : in.dst;
  const Operand& index = in.src.size() == 2 ? in.src[1] : in.dst;
  if (in.ndim != 3 || in.nreduce != 0 || in.accumulate || in.src.size() != 2 || !in.steps.empty() ||
      !in.preds.empty() || src.type != Operand::kView || index.type != Operand::kView ||
      src.stride[1] != 0 || index.stride[2] != 0 || in.extent[2] > in.gather_src_free ||
      (in.gather_own_row ? in.extent[1] > in.gather_index_cols
                         : in.extent[0] % 16 != 0 || in.extent[1] > 16 * in.gather_index_cols))
    r.fail("malformed gather");
  Instr box = in;  // the source's partitions x all its elements; the index tile
  box.extent[1] = 1;
  box.extent[2] = in.gather_src_free;
  check_view(r, p, src, box, "gather source");
  box.extent[1] = in.gather_index_cols;
  box.extent[2] = 1;
  check_view(r, p, index, box, "gather index");
}

bool integer_dtype(DType dt) {
  return dt == DType::k_int32 || dt == DType::k_uint32 || dt == DType::k_int16 ||
         dt == DType::k_uint16 || dt == DType::k_int8 || dt == DType::k_uint8;
}

// A copy's operand that moves with a run-time value, checked at the far end of its range: `steps`
// units of `scale` elements past where it is encoded (the generic checks see it there).
void check_far_end(const Reader& r, const Program& p, const Instr& in, Operand moved, int64_t steps,
                   int64_t scale, const char* what) {
  int64_t shift;
  if (__builtin_mul_overflow(steps, scale, &shift) ||
      __builtin_add_overflow(moved.offset, shift, &moved.offset))
    r.fail(std::string(what) + " offset range overflows");
  check_view(r, p, moved, in, what);
}

// See Instr (kDynamicCopy): a plain copy plus one integer value; the moving operand is checked
// here at dyn_max (the generic checks see it at dyn_min), so every offset the run-time check
// admits stays inside the slot (a view's span moves linearly with its offset).
void check_dynamic_copy(const Reader& r, const Program& p, const Instr& in) {
  if (in.nreduce != 0 || in.accumulate || in.src.size() != 2 || !in.steps.empty() ||
      in.src[0].type != Operand::kView || in.dyn_min > in.dyn_max)
    r.fail("malformed dynamic copy");
  const Operand& value = in.src[1];
  bool scalar = value.type == Operand::kView && integer_dtype(value.dtype);
  for (int d = 0; d < in.ndim; ++d) scalar = scalar && value.stride[d] == 0;
  if (!scalar) r.fail("dynamic copy offset is not one element of an integer tile");
  check_far_end(r, p, in, in.dyn_target == 0 ? in.src[0] : in.dst, in.dyn_max - in.dyn_min,
                in.dyn_scale, in.dyn_target == 0 ? "dynamic source" : "dynamic destination");
}

// See Instr (kIndirect): a plain copy (or `dst += src`) plus one integer per row; the moving
// operand is checked here at ind_max (the generic checks see it at ind_min), so every row the
// run-time check admits stays inside the slot.
void check_indirect(const Reader& r, const Program& p, const Instr& in) {
  if (in.ndim < 2 || in.nreduce != 0 || in.src.size() != 2 || !in.steps.empty() ||
      in.src[0].type != Operand::kView || in.ind_min > in.ind_max ||
      (in.accumulate && in.acc_op != Op::k_add))
    r.fail("malformed indirect copy");
  const Operand& index = in.src[1];
  bool per_row = index.type == Operand::kView && integer_dtype(index.dtype);
  for (int d = 1; d < in.ndim; ++d) per_row = per_row && index.stride[d] == 0;
  if (!per_row) r.fail("indirect copy index is not one integer per row");
  check_far_end(r, p, in, in.ind_target == 0 ? in.src[0] : in.dst, in.ind_max - in.ind_min,
                in.ind_scale, in.ind_target == 0 ? "indirect source" : "indirect destination");
}

// See Instr (kNonzero): one source view, no steps or masks; the destination checked through its
// count position T (the generic checks see it over [P, T]).
void check_nonzero(const Reader& r, const Program& p, const Instr& in) {
  if (in.ndim != 2 || in.nreduce != 0 || in.accumulate || in.src.size() != 1 || !in.steps.empty() ||
      !in.preds.empty() || in.src[0].type != Operand::kView)
    r.fail("malformed nonzero_with_count");
  Instr box = in;
  box.extent[1] = in.extent[1] + 1;
  check_view(r, p, in.dst, box, "nonzero_with_count destination");
}

Instr read_instr(Reader& r, Program& p) {
  Instr in;
  const int n_slots = static_cast<int>(p.slot_bytes.size());
  in.kind = static_cast<Kind>(r.next_in(0, 9, "instruction kind"));
  in.ndim = static_cast<int>(r.next_in(1, kMaxDims, "rank"));
  for (int d = 0; d < in.ndim; ++d) in.extent[d] = r.next_in(0, int64_t{1} << 40, "extent");
  in.nreduce = static_cast<int>(r.next_in(0, in.ndim, "reduced axes"));
  const int64_t n_ops = static_cast<int64_t>(Op::kCount) - 1;
  in.reduce_op = static_cast<Op>(r.next_in(0, n_ops, "reduce op"));
  if (in.nreduce > 0 && in.reduce_op != Op::k_add && in.reduce_op != Op::k_multiply &&
      in.reduce_op != Op::k_maximum && in.reduce_op != Op::k_minimum &&
      in.reduce_op != Op::k_abs_max && in.reduce_op != Op::k_abs_min)
    r.fail("reduce op is not a reduction");
  in.accumulate = r.next_in(0, 1, "accumulate flag") != 0;
  in.acc_op = static_cast<Op>(r.next_in(0, n_ops, "accumulate op"));
  in.post_scale = r.next_float();
  in.line = static_cast<int32_t>(r.next_in(-1, static_cast<int64_t>(p.lines.size()) - 1, "line"));
  in.dst = read_operand(r, in.ndim, n_slots);
  if (in.dst.type != Operand::kView && in.kind != Kind::kBranch)
    r.fail("destination is not a view");
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
    p.random = p.random || st.op == Op::k_launch_random;
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
  } else if (in.kind == Kind::kScan) {
    check_scan(r, in);
  } else if (in.kind == Kind::kGather) {
    in.gather_src_free = r.next_in(1, int64_t{1} << 40, "gather source size");
    in.gather_index_cols = r.next_in(1, int64_t{1} << 40, "gather index columns");
    in.gather_own_row = r.next_in(0, 1, "gather index rows") == 1;
    check_gather(r, p, in);
  } else if (in.kind == Kind::kDynamicCopy) {
    constexpr int64_t kReach = int64_t{1} << 40;
    in.dyn_target = static_cast<int32_t>(r.next_in(0, 1, "dynamic copy target"));
    in.dyn_scale = r.next_in(-kReach, kReach, "dynamic copy scale");
    in.dyn_min = r.next_in(-kReach, kReach, "dynamic copy lowest offset");
    in.dyn_max = r.next_in(-kReach, kReach, "dynamic copy highest offset");
    in.dyn_mode = static_cast<int32_t>(
        r.next_in(0, kDynSkip | kDynScalarOffset, "dynamic copy out-of-range mode"));
    check_dynamic_copy(r, p, in);
  } else if (in.kind == Kind::kIndirect) {
    constexpr int64_t kReach = int64_t{1} << 40;
    in.ind_target = static_cast<int32_t>(r.next_in(0, 1, "indirect copy target"));
    in.ind_skip = r.next_in(0, 1, "indirect copy out-of-bounds mode") != 0;
    in.ind_scale = r.next_in(-kReach, kReach, "indirect copy row stride");
    in.ind_min = r.next_in(-kReach, kReach, "indirect copy lowest row");
    in.ind_max = r.next_in(-kReach, kReach, "indirect copy highest row");
    check_indirect(r, p, in);
  } else if (in.kind == Kind::kSync) {
    in.sync_send = static_cast<int32_t>(r.next_in(-1, int64_t{1} << 20, "sendrecv peer"));
    in.sync_recv = static_cast<int32_t>(r.next_in(-1, int64_t{1} << 20, "sendrecv peer"));
    const bool barrier = in.sync_send < 0 && in.sync_recv < 0;
    if (in.ndim != 2 || in.nreduce != 0 || in.accumulate || !in.steps.empty() ||
        !in.preds.empty() || (in.sync_send < 0) != (in.sync_recv < 0) ||
        in.src.size() != (barrier ? 0u : 1u) || (!barrier && in.src[0].type != Operand::kView))
      r.fail("malformed core barrier / sendrecv");
  } else if (in.kind == Kind::kBranch) {
    in.br_cond = static_cast<int32_t>(r.next_in(kBrAlways, kBrStep, "branch condition"));
    in.br_target = static_cast<int32_t>(r.next_in(0, int64_t{1} << 26, "branch target"));
    in.br_step = r.next_in(0, int64_t{1} << 24, "loop step");
    static constexpr size_t kOperands[] = {0, 2, 1, 0};
    const bool writes = in.dst.type == Operand::kView;
    if (in.ndim != 1 || in.extent[0] != 1 || in.nreduce != 0 || in.accumulate ||
        !in.steps.empty() || !in.preds.empty() ||
        in.src.size() != kOperands[static_cast<size_t>(in.br_cond)] ||
        (writes && in.dst.dtype != DType::k_int32) || (in.br_cond == kBrAlways && writes) ||
        (in.br_cond == kBrStep && (!writes || in.br_step < 1)))
      r.fail("malformed branch");
    for (const Operand& o : in.src)
      if (o.type != Operand::kView) r.fail("malformed branch: an operand that is not a view");
  } else if (in.kind == Kind::kScalar) {
    in.sc_op = static_cast<Op>(r.next_in(0, n_ops, "scalar op"));
    constexpr int64_t kWord = int64_t{1} << 32;
    for (int64_t& c : in.sc_const) c = r.next_in(-kWord, kWord, "scalar constant");
    static constexpr Op kOps[] = {
        Op::k_copy,       Op::k_neg,     Op::k_add,           Op::k_subtract, Op::k_multiply,
        Op::k_divide,     Op::k_mod,     Op::k_maximum,       Op::k_minimum,  Op::k_less,
        Op::k_less_equal, Op::k_greater, Op::k_greater_equal, Op::k_equal,    Op::k_not_equal};
    if (in.ndim != 1 || in.extent[0] != 1 || in.nreduce != 0 || in.accumulate ||
        !in.steps.empty() || !in.preds.empty() || in.src.size() != 2 ||
        in.dst.dtype != DType::k_int32 ||
        std::find(std::begin(kOps), std::end(kOps), in.sc_op) == std::end(kOps))
      r.fail("malformed scalar instruction");
  } else if (in.kind == Kind::kNonzero) {
    constexpr int64_t kReach = int64_t{1} << 40;
    in.nz_offset = r.next_in(-kReach, kReach, "nonzero index offset");
    in.nz_pad = r.next_in(-kReach, kReach, "nonzero padding value");
    check_nonzero(r, p, in);
  } else if (in.steps.empty() && in.src.size() != 1) {
    r.fail("elementwise instruction without a result");
  }
  // A reduction writes each output once: its destination must not move along reduced axes.
  for (int d = in.ndim - in.nreduce; d < in.ndim; ++d)
    if (in.dst.stride[d] != 0) r.fail("reduction destination moves along a reduced axis");
  if (in.kind != Kind::kGather)  // a gather's reads: check_gather
    for (const Operand& o : in.src)
      if (o.type == Operand::kView) check_view(r, p, o, in, "operand");
  if (in.dst.type == Operand::kView) check_view(r, p, in.dst, in, "destination");
  // NOTE: a one-axis elementwise instruction over at most a partition's worth of elements (a
  // [P, 1] tile's column: an rstd store, a per-row scale) becomes P rows of one lane (strides
  // and predicate coefficients of the new axis are 0) so that it joins its neighbours'
  // row-block group; the same lanes see the same operations, so results are bitwise the same.
  if (in.kind == Kind::kElementwise && in.ndim == 1 && in.nreduce == 0 &&
      in.extent[0] <= kColumnRows) {
    in.ndim = 2;
    in.extent[1] = 1;
  }
  return in;
}

// --- the schedule: instructions grouped for row-block execution ------------------------------

}  // namespace

Footprint footprint(const Operand& o, const Instr& in) {
  const int64_t size = static_cast<int64_t>(dtype_size(o.dtype));
  int64_t rel_lo = 0, rel_hi = 0;
  for (int d = 1; d < in.ndim; ++d) {
    const int64_t reach = o.stride[d] * (in.extent[d] - 1);
    (reach < 0 ? rel_lo : rel_hi) += reach;
  }
  Footprint f;
  f.slot = o.slot;
  f.rows = in.extent[0];
  f.row_lo = (o.offset + rel_lo) * size;
  f.row_hi = (o.offset + rel_hi + 1) * size;
  f.row_stride = o.stride[0] * size;
  const int64_t reach0 = f.row_stride * (in.extent[0] - 1);
  f.lo = f.row_lo + std::min<int64_t>(0, reach0);
  f.hi = f.row_hi + std::max<int64_t>(0, reach0);
  return f;
}

namespace {

// True when no element that a touches in row p is touched by b in a row q != p: the two do not
// overlap at all, or both touch row 0 only, or they step through memory row by row alike (a
// footprint with one row or a zero row stride counts as stepping like the other) and both fit
// in one row's period, so that row p of a and row q of b are p - q periods apart. A footprint
// that touches the same bytes in every one of several rows (row stride 0) must moreover miss
// the other's row 0.
bool rows_independent(const Footprint& a, const Footprint& b) {
  if (a.slot != b.slot || a.hi <= b.lo || b.hi <= a.lo) return true;
  if (a.rows == 1 && b.rows == 1) return true;
  const bool a_fixed = a.rows == 1 || a.row_stride == 0;
  const bool b_fixed = b.rows == 1 || b.row_stride == 0;
  if (a_fixed && b_fixed) return false;
  if (!a_fixed && !b_fixed && a.row_stride != b.row_stride) return false;
  const int64_t period = a_fixed ? b.row_stride : a.row_stride;
  if (period <= 0 || std::max(a.row_hi, b.row_hi) - std::min(a.row_lo, b.row_lo) > period)
    return false;
  const bool a_repeats = a.rows > 1 && a.row_stride == 0;
  const bool b_repeats = b.rows > 1 && b.row_stride == 0;
  if (a_repeats || b_repeats) return a.row_hi <= b.row_lo || b.row_hi <= a.row_lo;
  return true;
}

// See Instr::transposed.
void transpose_column(Instr& in) {
  if (in.kind != Kind::kElementwise || in.ndim != 2 || in.nreduce != 0 || in.extent[1] != 1 ||
      in.extent[0] < 2)
    return;
  const Footprint w = footprint(in.dst, in);
  for (const Operand& o : in.src)
    if (o.type == Operand::kView && !rows_independent(w, footprint(o, in))) return;
  Instr t = in;
  std::swap(t.extent[0], t.extent[1]);
  std::swap(t.dst.stride[0], t.dst.stride[1]);
  for (Operand& o : t.src) std::swap(o.stride[0], o.stride[1]);
  for (Pred& pr : t.preds) std::swap(pr.coef[0], pr.coef[1]);
  in.transposed.push_back(std::move(t));
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

bool row_blockable(const Instr& in) {
  if (in.kind != Kind::kElementwise || in.ndim < 2 || in.nreduce >= in.ndim) return false;
  for (int d = 0; d < in.ndim; ++d)
    if (in.extent[d] == 0) return false;
  return true;
}

// NOTE: kMaxGroup bounds the parse-time checks (each instruction against its group's
// footprints, a few hundred); each group is one parallel region, which costs a time slice when
// another process holds a core, so groups span many tile iterations; kBlockBytes is one
// instruction's float32 lanes per block: the tiles a block touches stay in L2, and each call
// of an instruction covers enough rows that its set-up is small next to them (8 KiB blocks,
// L1's size: RMSNorm 8192 x 256 took 1.10 ms on 2 cores of an AVX2 EPYC, 32 KiB: 0.94).
constexpr int32_t kMaxGroup = 256;
constexpr int64_t kBlockBytes = 32768;

std::vector<Group> schedule(const std::vector<Instr>& instrs) {
  std::vector<Group> groups;
  std::vector<Footprint> reads, writes;
  Group g;
  int64_t row_lanes = 1;
  auto close = [&] {
    if (g.end > g.begin) {
      g.block_rows = std::max<int64_t>(1, kBlockBytes / 4 / row_lanes);
      groups.push_back(g);
    }
    g = Group{};
    row_lanes = 1;
    reads.clear();
    writes.clear();
  };
  std::vector<Footprint> in_reads;
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instr& in = instrs[i];
    const int32_t at = static_cast<int32_t>(i);
    if (in.absorbed || in.dropped) continue;  // absorbed: run by the matmul before it
    in_reads.clear();
    Footprint w;
    bool ok = row_blockable(in);
    if (ok) {
      w = footprint(in.dst, in);
      for (const Operand& o : in.src)
        if (o.type == Operand::kView) in_reads.push_back(footprint(o, in));
      for (const Footprint& r : in_reads) ok = ok && rows_independent(w, r);
    }
    if (!ok) {  // run whole, alone
      close();
      groups.push_back(Group{at, at + 1, false, 0, 1, 0});
      continue;
    }
    bool joins = g.end > g.begin && g.end - g.begin < kMaxGroup;
    for (size_t k = 0; joins && k < writes.size(); ++k) joins = rows_independent(w, writes[k]);
    for (size_t k = 0; joins && k < reads.size(); ++k) joins = rows_independent(w, reads[k]);
    for (size_t k = 0; joins && k < writes.size(); ++k)
      for (const Footprint& r : in_reads) joins = joins && rows_independent(r, writes[k]);
    if (!joins) {
      close();
      g.begin = at;
      g.blocked = true;
    }
    g.end = at + 1;
    int64_t lanes = 1;
    for (int d = 1; d < in.ndim; ++d) lanes = saturating_mul(lanes, in.extent[d]);
    row_lanes = std::max(row_lanes, lanes);
    g.rows = std::max(g.rows, in.extent[0]);
    const int64_t total = saturating_mul(lanes, in.extent[0]);
    g.lanes = g.lanes > INT64_MAX - total ? INT64_MAX : g.lanes + total;
    writes.push_back(w);
    reads.insert(reads.end(), in_reads.begin(), in_reads.end());
  }
  close();
  return groups;
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
    std::vector<Instr> rewritten = instrs;
    rewrite_instance(rewritten, static_cast<int32_t>(n_slots - 1));
    for (Instr& in : rewritten) transpose_column(in);
    p->n_instrs += n;
    p->schedules.push_back(schedule(rewritten));
    p->instances.push_back(std::move(instrs));
    p->rewritten.push_back(std::move(rewritten));
  }
  if (!r.done()) r.fail("trailing words");
  find_sync_points(*p);
  find_branches(*p);
  return p.release();
}

}  // namespace openneuron::nki
