// The NKI instructions whose lanes are not independent of each other's data: the scan along the
// free axis (nisa.tensor_tensor_scan: each element depends on the one before it), the gather by
// run-time indices (nisa.local_gather) and the copy at a run-time offset
// (nisa.tensor_copy_dynamic_src / _dst: the offset checked, then an elementwise copy), and the
// DMA's indirect copy (rows of an HBM tensor gathered or scattered by a tile of run-time row
// indices: each index checked, then that row copied), and nisa.nonzero_with_count (positions of
// the nonzero elements of a row). The scan, the gather, the indirect copy and nonzero_with_count
// run row by row on the calling thread; the lane-parallel instructions are execute.cpp and
// matmul.cpp. Semantics: Instr in program.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "nki/convert.h"
#include "nki/program.h"

namespace openneuron::nki {
namespace {

// The binary operations a scan may use, one lane at a time (the elementwise path's semantics).
float binary(Op op, float x, float y) {
  switch (op) {
    case Op::k_add:
      return x + y;
    case Op::k_subtract:
      return x - y;
    case Op::k_multiply:
      return x * y;
    case Op::k_divide:
      return x / y;
    case Op::k_maximum:
      return x > y ? x : y;
    case Op::k_minimum:
      return x < y ? x : y;
    case Op::k_power:
      return std::pow(x, y);
    case Op::k_mod:
      return x - std::floor(x / y) * y;
    case Op::k_equal:
      return x == y ? 1.0f : 0.0f;
    case Op::k_not_equal:
      return x != y ? 1.0f : 0.0f;
    case Op::k_less:
      return x < y ? 1.0f : 0.0f;
    case Op::k_less_equal:
      return x <= y ? 1.0f : 0.0f;
    case Op::k_greater:
      return x > y ? 1.0f : 0.0f;
    case Op::k_greater_equal:
      return x >= y ? 1.0f : 0.0f;
    case Op::k_logical_and:
      return (x != 0.0f && y != 0.0f) ? 1.0f : 0.0f;
    case Op::k_logical_or:
      return (x != 0.0f || y != 0.0f) ? 1.0f : 0.0f;
    case Op::k_logical_xor:
      return ((x != 0.0f) != (y != 0.0f)) ? 1.0f : 0.0f;
    case Op::k_abs_max:
      return std::fabs(x) >= std::fabs(y) ? x : y;
    case Op::k_abs_min:
      return std::fabs(x) <= std::fabs(y) ? x : y;
    case Op::k_bitwise_and:
    case Op::k_bitwise_or:
    case Op::k_bitwise_xor:
    case Op::k_left_shift:
    case Op::k_right_shift:
      return bits_op(op, x, y);
    default:
      return x;
  }
}

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// [lo, hi) of the free axis where every predicate holds in row p.
void row_lanes(const Instr& in, int64_t p, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = in.extent[1];
  for (const Pred& pr : in.preds) {
    const int64_t v = pr.c + pr.coef[0] * p;
    const int64_t k = pr.coef[1];
    if (k == 0) {
      if (v < 0) *hi = 0;
    } else if (k > 0) {
      *lo = std::max(*lo, -floor_div(v, k));
    } else {
      *hi = std::min(*hi, floor_div(v, -k) + 1);
    }
  }
  if (*hi < *lo) *hi = *lo;
}

float read_view(const Operand& o, char* const* slots, int64_t off) {
  return o.type == Operand::kConst ? o.value : load_one(o.dtype, slots[o.slot], off);
}

// "file:line" of the instruction, for run-time errors.
std::string where(const Instr& in, const Program& prog) {
  return in.line >= 0 && static_cast<size_t>(in.line) < prog.lines.size()
             ? prog.lines[static_cast<size_t>(in.line)]
             : "?";
}

// Whether some lane of row p may run. Exact for two axes (row_lanes); over more axes each
// predicate alone is asked whether it holds somewhere in the row, so a row whose predicates
// only fail together counts as active (it then reads its index, a tile element the tracer's
// bounds admit).
bool row_active(const Instr& in, int64_t p) {
  if (in.ndim == 2) {
    int64_t lo, hi;
    row_lanes(in, p, &lo, &hi);
    return lo < hi;
  }
  for (const Pred& pr : in.preds) {
    int64_t best = pr.c + pr.coef[0] * p;
    for (int d = 1; d < in.ndim; ++d) best += std::max<int64_t>(0, pr.coef[d] * (in.extent[d] - 1));
    if (best < 0) return false;
  }
  return true;
}

// Row p of a same-dtype copy, byte for byte (a DMA moves bytes: int32 past 2^24 stays exact,
// NaN payloads stay), lane intervals along the last axis from the predicates.
void copy_row_bytes(const Instr& in, const Operand& src, const Operand& dst, char* const* slots,
                    int64_t p) {
  const int last = in.ndim - 1;
  const int64_t size = static_cast<int64_t>(dtype_size(dst.dtype));
  int64_t at[kMaxDims] = {};
  at[0] = p;
  for (;;) {
    int64_t lo = 0, hi = in.extent[last];
    for (const Pred& pr : in.preds) {
      int64_t v = pr.c;
      for (int d = 0; d < last; ++d) v += pr.coef[d] * at[d];
      const int64_t k = pr.coef[last];
      if (k == 0) {
        if (v < 0) hi = 0;
      } else if (k > 0) {
        lo = std::max(lo, -floor_div(v, k));
      } else {
        hi = std::min(hi, floor_div(v, -k) + 1);
      }
    }
    if (lo < hi) {
      int64_t a = src.offset, b = dst.offset;
      for (int d = 0; d < last; ++d) {
        a += src.stride[d] * at[d];
        b += dst.stride[d] * at[d];
      }
      const int64_t sa = src.stride[last], sb = dst.stride[last];
      char* to = slots[dst.slot];
      const char* from = slots[src.slot];
      if (sa == 1 && sb == 1) {  // memmove: an HBM-to-HBM copy may overlap itself
        std::memmove(to + (b + lo) * size, from + (a + lo) * size,
                     static_cast<size_t>((hi - lo) * size));
      } else {
        for (int64_t f = lo; f < hi; ++f)
          std::memmove(to + (b + sb * f) * size, from + (a + sa * f) * size,
                       static_cast<size_t>(size));
      }
    }
    int d = last - 1;
    while (d >= 1 && ++at[d] == in.extent[d]) at[d--] = 0;
    if (d < 1) return;
  }
}

}  // namespace

void run_scan(const Instr& in, char* const* slots) {
  const Operand& d0 = in.src[0];
  const Operand& d1 = in.src[1];
  const Operand& init = in.src[2];
  const Operand& dst = in.dst;
  const Step& s0 = in.steps[0];
  const Step& s1 = in.steps[1];
  const bool carry_first = s0.a == 2;  // reverse0: op0(carry, data0)
  const bool data1_first = s1.a == 1;  // reverse1: op1(data1, op0 result)
  const bool exact = dst.dtype == DType::k_float32;
  for (int64_t p = 0; p < in.extent[0]; ++p) {
    int64_t lo, hi;
    row_lanes(in, p, &lo, &hi);
    if (lo >= hi) continue;
    float carry = read_view(init, slots, init.offset + init.stride[0] * p);
    const int64_t o0 = d0.offset + d0.stride[0] * p, o1 = d1.offset + d1.stride[0] * p;
    const int64_t od = dst.offset + dst.stride[0] * p;
    for (int64_t f = lo; f < hi; ++f) {
      const float x0 = read_view(d0, slots, o0 + d0.stride[1] * f);
      const float x1 = read_view(d1, slots, o1 + d1.stride[1] * f);
      const float t = carry_first ? binary(s0.op, carry, x0) : binary(s0.op, x0, carry);
      const float v = data1_first ? binary(s1.op, x1, t) : binary(s1.op, t, x1);
      store_one(dst.dtype, slots[dst.slot], od + dst.stride[1] * f, v);
      carry = exact ? v : round_to(dst.dtype, v);
    }
  }
}

void run_gather(const Instr& in, char* const* slots, const Program& prog) {
  const Operand& src = in.src[0];
  const Operand& index = in.src[1];
  const Operand& dst = in.dst;
  const int64_t n_valid = in.extent[1], n_elem = in.extent[2];
  const size_t size = dtype_size(src.dtype);
  const bool same_type = src.dtype == dst.dtype;
  const char* what = in.gather_own_row ? "nl.gather_flattened" : "nisa.local_gather";
  for (int64_t p = 0; p < in.extent[0]; ++p) {
    const int64_t core0 = p / 16 * 16;
    for (int64_t j = 0; j < n_valid; ++j) {
      const int64_t q = in.gather_own_row ? p : core0 + j % 16;
      const int64_t col = in.gather_own_row ? j : j / 16;
      const float raw = load_one(index.dtype, slots[index.slot],
                                 index.offset + index.stride[0] * q + index.stride[1] * col);
      if (!(raw >= 0.0f) ||
          raw + static_cast<float>(n_elem) > static_cast<float>(in.gather_src_free)) {
        throw std::runtime_error(where(in, prog) + ": in kernel '" + prog.name + "': " + what +
                                 " index " + std::to_string(raw) + " (partition " +
                                 std::to_string(q) + ", column " + std::to_string(col) +
                                 ") reads elements past the " + std::to_string(in.gather_src_free) +
                                 " of each source partition (" + std::to_string(n_elem) +
                                 " per index); indices must be in [0, " +
                                 std::to_string(in.gather_src_free - n_elem) + "]");
      }
      const int64_t i = static_cast<int64_t>(raw);
      const int64_t from = src.offset + src.stride[0] * p + src.stride[2] * i;
      const int64_t to = dst.offset + dst.stride[0] * p + dst.stride[1] * j;
      for (int64_t e = 0; e < n_elem; ++e) {
        const int64_t a = from + src.stride[2] * e, b = to + dst.stride[2] * e;
        if (same_type)  // bit for bit, as the hardware copies
          std::memcpy(slots[dst.slot] + b * size, slots[src.slot] + a * size, size);
        else
          store_one(dst.dtype, slots[dst.slot], b, load_one(src.dtype, slots[src.slot], a));
      }
    }
  }
}

void run_dynamic_copy(const Instr& in, char* const* slots, const Program& prog, bool parallel,
                      uint64_t seed) {
  const Operand& value = in.src[1];
  const int64_t v = load_integer(value.dtype, slots[value.slot], value.offset);
  if (v < in.dyn_min || v > in.dyn_max) {
    if (in.dyn_mode & kDynSkip) return;  // oob_mode.skip: nothing copied
    const char* name = in.dyn_mode & kDynScalarOffset ? "dma_copy access pattern's scalar_offset"
                       : in.dyn_target == 0           ? "tensor_copy_dynamic_src offset"
                                                      : "tensor_copy_dynamic_dst offset";
    throw std::runtime_error(
        where(in, prog) + ": in kernel '" + prog.name + "': nisa." + name + " " +
        std::to_string(v) + " (read from the " + dtype_name(value.dtype) + " offset " +
        (in.dyn_mode & kDynScalarOffset ? "register" : "tile") + " when the kernel ran) puts the " +
        (in.dyn_target == 0 ? "source" : "destination") +
        " outside its tensor; offsets must be in [" + std::to_string(in.dyn_min) + ", " +
        std::to_string(in.dyn_max) + "]");
  }
  // NOTE: a copy per run (a few vectors): the instruction costs ~600 engine cycles on the
  // hardware too, and the program stays immutable, so concurrent runs need no locking.
  Instr copy = in;
  copy.kind = Kind::kElementwise;
  copy.src.pop_back();
  Operand& moved = in.dyn_target == 0 ? copy.src[0] : copy.dst;
  moved.offset += (v - in.dyn_min) * in.dyn_scale;  // within the parser's checked ends
  run_elementwise(copy, slots, parallel, seed);
}

void run_indirect(const Instr& in, char* const* slots, const Program& prog, uint64_t seed) {
  for (int d = 0; d < in.ndim; ++d)
    if (in.extent[d] == 0) return;
  const Operand& index = in.src[1];
  // NOTE: a copy per run (a few vectors), as in run_dynamic_copy: the program stays immutable,
  // so concurrent runs need no locking. Rows in order on this thread: a scatter's repeated index
  // keeps the last such row (NKI leaves it undefined; a fixed order makes runs reproducible).
  Instr copy = in;
  copy.kind = Kind::kElementwise;
  copy.src.pop_back();
  Operand& moved = in.ind_target == 0 ? copy.src[0] : copy.dst;
  const int64_t base = moved.offset;
  const bool bytes = !in.accumulate && in.src[0].dtype == in.dst.dtype;
  for (int64_t p = 0; p < in.extent[0]; ++p) {
    if (!row_active(in, p)) continue;
    const int64_t v =
        load_integer(index.dtype, slots[index.slot], index.offset + index.stride[0] * p);
    if (v < in.ind_min || v > in.ind_max) {
      if (in.ind_skip) continue;  // oob_mode.skip: no transfer for this row
      throw std::runtime_error(
          where(in, prog) + ": in kernel '" + prog.name + "': indirect " +
          (in.ind_target == 0 ? "load (gather)" : "store (scatter)") + " row index " +
          std::to_string(v) + " (partition " + std::to_string(p) + " of the " +
          dtype_name(index.dtype) + " index tile, read when the kernel ran) is outside the HBM " +
          "tensor's rows; indices must be in [" + std::to_string(in.ind_min) + ", " +
          std::to_string(in.ind_max) +
          "] (nisa.dma_copy's oob_mode=nisa.oob_mode.skip skips such rows instead)");
    }
    moved.offset = base + (v - in.ind_min) * in.ind_scale;  // within the parser's checked ends
    if (bytes)
      copy_row_bytes(copy, copy.src[0], copy.dst, slots, p);
    else
      run_elementwise_rows(copy, slots, seed, p, p + 1);
  }
}

void run_nonzero(const Instr& in, char* const* slots) {
  const Operand& src = in.src[0];
  const Operand& dst = in.dst;
  const int64_t T = in.extent[1];
  char* out = slots[dst.slot];
  auto put = [&](int64_t p, int64_t f, int64_t v) {
    const int64_t at = dst.offset + dst.stride[0] * p + dst.stride[1] * f;
    if (dst.dtype == DType::k_int32)  // exact, whatever its size
      reinterpret_cast<int32_t*>(out)[at] = static_cast<int32_t>(v);
    else
      store_one(dst.dtype, out, at, static_cast<float>(v));
  };
  for (int64_t p = 0; p < in.extent[0]; p += 16) {
    int64_t n = 0;
    for (int64_t f = 0; f < T; ++f) {
      const float v =
          load_one(src.dtype, slots[src.slot], src.offset + src.stride[0] * p + src.stride[1] * f);
      if (v != 0.0f) put(p, n++, f + in.nz_offset);
    }
    for (int64_t f = n; f < T; ++f) put(p, f, in.nz_pad);
    put(p, T, n);
  }
}

}  // namespace openneuron::nki
