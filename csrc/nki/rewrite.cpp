// Parse-time rewrites of a traced NKI program's instructions (rewrite_instance, program.h), run
// once per instance before scheduling: copies between HBM and tiles forwarded (a load's readers
// read the HBM view, a store's producer writes it) where the tile is not otherwise read, a
// matmul absorbing the `acc += result` after it, and an elementwise result read only by the
// next instruction computed in that instruction's registers. Not the parser or the schedule
// (program.cpp). Each rewrite leaves every element the same values through the same operations.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nki/program.h"

namespace openneuron::nki {
namespace {

// NOTE: every rewrite looks at a bounded window of instructions (parse time stays linear); past
// it, the program is left as written.
constexpr size_t kLookAhead = 256;

bool overlaps(const Footprint& a, const Footprint& b) {
  return a.slot == b.slot && a.lo < b.hi && b.lo < a.hi;
}

// The bytes view o touches over in's box, modulo `pitch` bytes: [*c0, *c0 + *width) cyclically.
// False when they span a whole pitch (no such interval).
bool column_span(const Operand& o, const Instr& in, int64_t pitch, int64_t* c0, int64_t* width) {
  const int64_t size = static_cast<int64_t>(dtype_size(o.dtype));
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < in.ndim; ++d) {
    const int64_t s = o.stride[d] * size;
    if (s % pitch == 0) continue;  // moves whole partitions: the same columns
    const int64_t reach = s * (in.extent[d] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  *width = hi - lo + size;
  if (*width > pitch) return false;
  *c0 = ((o.offset * size + lo) % pitch + pitch) % pitch;
  return true;
}

// Whether views a (over ia's box) and b (over ib's box) may share a byte. NOTE: tiles are laid
// out partition-major, their bounding ranges interleave; with `pitch` the arena's partition
// pitch in bytes, views in disjoint columns of the partitions never meet.
bool touch(const Operand& a, const Instr& ia, const Operand& b, const Instr& ib, int64_t pitch) {
  if (a.type != Operand::kView || b.type != Operand::kView) return false;
  if (!overlaps(footprint(a, ia), footprint(b, ib))) return false;
  int64_t ca, wa, cb, wb;
  if (pitch <= 0 || !column_span(a, ia, pitch, &ca, &wa) || !column_span(b, ib, pitch, &cb, &wb))
    return true;
  return ((cb - ca) % pitch + pitch) % pitch < wa || ((ca - cb) % pitch + pitch) % pitch < wb;
}

// Same memory, element for element, over a two-axis box.
// Same memory, element for element, over the two-axis box (strides of one-element axes aside).
bool same_view2(const Operand& a, const Operand& b, const Instr& box) {
  return a.type == Operand::kView && b.type == Operand::kView && a.slot == b.slot &&
         a.dtype == b.dtype && a.offset == b.offset &&
         (box.extent[0] == 1 || a.stride[0] == b.stride[0]) &&
         (box.extent[1] == 1 || a.stride[1] == b.stride[1]);
}

// --- forwarded copies -----------------------------------------------------------------------

// A float32 copy of one two-axis view to another: no mask, no conversion, no accumulation.
bool plain_copy(const Instr& in) {
  return in.kind == Kind::kElementwise && !in.dropped && in.ndim == 2 && in.nreduce == 0 &&
         !in.accumulate && in.steps.empty() && in.src.size() == 1 && in.preds.empty() &&
         in.src[0].type == Operand::kView && in.src[0].dtype == DType::k_float32 &&
         in.dst.dtype == DType::k_float32 && in.extent[0] > 0 && in.extent[1] > 0;
}

// NOTE: a gather reads, and a dynamic or indirect copy reads or writes, where run-time values
// point, nonzero_with_count writes its count one past its box, and at a core barrier or
// sendrecv other instances read and write: their operands' strides do not describe their
// accesses, so no rewrite looks past one; nor past a branch, where the instructions run next are
// not the ones that follow, or a scalar instruction (the values a run-time offset reads).
bool opaque_reads(const Instr& in) {
  return in.kind == Kind::kGather || in.kind == Kind::kDynamicCopy || in.kind == Kind::kIndirect ||
         in.kind == Kind::kNonzero || in.kind == Kind::kSync || in.kind == Kind::kBranch ||
         in.kind == Kind::kScalar;
}

bool empty_box(const Instr& in) {
  for (int d = 0; d < in.ndim; ++d)
    if (in.extent[d] == 0) return true;
  return false;
}

// True when `in` writes every element of `view` over the two-axis box `box`, unmasked, without
// reading the old values.
bool covers(const Instr& in, const Operand& view, const Instr& box) {
  return !in.accumulate && in.preds.empty() && same_view2(in.dst, view, box) &&
         in.extent[0] == box.extent[0] && in.extent[1] == box.extent[1] &&
         (in.kind == Kind::kMatmul || (in.ndim == 2 && in.nreduce == 0));
}

// Operand o of `in` reads exactly what one of the `partial` writes (instructions that
// overwrote part of a tile being followed) wrote, all of it unmasked: nothing older.
bool reads_a_later_write(const Operand& o, const Instr& in, const std::vector<Instr>& instrs,
                         const std::vector<size_t>& partial) {
  for (size_t w : partial) {
    const Instr& wr = instrs[w];
    if (wr.kind == Kind::kElementwise && wr.nreduce == 0 && wr.preds.empty() && !wr.accumulate &&
        in.ndim == 2 && wr.ndim == 2 && in.extent[0] == wr.extent[0] &&
        in.extent[1] == wr.extent[1] && same_view2(o, wr.dst, in))
      return true;
  }
  return false;
}

// o (an operand of an instruction over `in`'s box) reads the tile that load `ld` wrote; on
// success *out is the same elements read from the load's source. Each axis of o must step
// along the tile's partitions (stride = pitch), its free axis (stride 1) or not at all, and
// stay inside the loaded box.
bool map_through_load(const Operand& o, const Instr& in, const Instr& ld, Operand* out) {
  const Operand& t = ld.dst;
  const Operand& h = ld.src[0];
  const int64_t pitch = t.stride[0];
  if (o.dtype != DType::k_float32 || t.stride[1] != 1 || pitch <= 1 || pitch < ld.extent[1])
    return false;
  const int64_t rel = o.offset - t.offset;
  if (rel < 0) return false;
  int64_t p = rel / pitch, f = rel % pitch;
  *out = o;
  out->offset = h.offset + p * h.stride[0] + f * h.stride[1];
  out->slot = h.slot;
  for (int d = 0; d < in.ndim; ++d) {
    const int64_t s = o.stride[d], reach = in.extent[d] - 1;
    if (s == 0) continue;
    if (s == pitch) {
      p += reach;
      out->stride[d] = h.stride[0];
    } else if (s == 1) {
      f += reach;
      out->stride[d] = h.stride[1];
    } else {
      return false;
    }
  }
  return p < ld.extent[0] && f < ld.extent[1];
}

// Load instrs[i] (HBM -> arena tile) is dropped when every later read of the tile, up to an
// instruction that overwrites all of it (or the end: the arena is scratch), maps to the HBM
// view, and nothing writes that HBM view meanwhile; those reads then read HBM.
void forward_load(std::vector<Instr>& instrs, size_t i, int32_t arena) {
  const Instr& ld = instrs[i];
  if (!plain_copy(ld) || ld.dst.slot != arena || ld.src[0].slot == arena) return;
  const Operand& tile = ld.dst;
  const Operand& hbm = ld.src[0];
  const int64_t pitch = tile.stride[0] * 4;
  struct Sub {
    size_t instr, src;
    Operand to;
  };
  std::vector<Sub> subs;
  std::vector<size_t> partial;  // instructions that overwrote part of the tile
  const size_t end = std::min(instrs.size(), i + 1 + kLookAhead);
  size_t j = i + 1;
  for (; j < end; ++j) {
    const Instr& in = instrs[j];
    if (in.dropped) continue;
    if (empty_box(in) || opaque_reads(in)) return;
    for (size_t k = 0; k < in.src.size(); ++k) {
      const Operand& o = in.src[k];
      if (!touch(o, in, tile, ld, pitch) || reads_a_later_write(o, in, instrs, partial)) continue;
      for (size_t w : partial)  // reads some of what a later write put there
        if (touch(o, in, instrs[w].dst, instrs[w], pitch)) return;
      Operand to;
      if (!map_through_load(o, in, ld, &to)) return;
      subs.push_back({j, k, to});
    }
    if (touch(in.dst, in, hbm, ld, 0)) return;
    if (touch(in.dst, in, tile, ld, pitch)) {
      if (covers(in, tile, ld)) break;
      if (in.accumulate) return;
      partial.push_back(j);
    }
  }
  if (j == end && end != instrs.size()) return;
  for (const Sub& s : subs) instrs[s.instr].src[s.src] = s.to;
  instrs[i].dropped = true;
}

// True when instructions [from, ...) overwrite all of `view` over `box` (at once; partial writes
// before that are passed over) before any reads a byte of it, or end without reading it, `view`
// being arena scratch.
bool unread_after(const std::vector<Instr>& instrs, size_t from, const Operand& view,
                  const Instr& box, int32_t arena) {
  const int64_t pitch = view.stride[0] * static_cast<int64_t>(dtype_size(view.dtype));
  const size_t end = std::min(instrs.size(), from + kLookAhead);
  std::vector<size_t> partial;
  for (size_t j = from; j < end; ++j) {
    const Instr& in = instrs[j];
    if (in.dropped) continue;
    if (empty_box(in) || opaque_reads(in)) return false;
    for (const Operand& o : in.src)
      if (touch(o, in, view, box, pitch) && !reads_a_later_write(o, in, instrs, partial))
        return false;
    if (!touch(in.dst, in, view, box, pitch)) continue;
    if (in.accumulate) return false;         // reads what it writes
    if (covers(in, view, box)) return true;  // after a partial write the rest may be read
    partial.push_back(j);
  }
  return end == instrs.size() && view.slot == arena;
}

// Store instrs[i] (arena tile -> elsewhere) is dropped when the instruction that wrote the tile
// (all of it, unmasked) can write the destination instead: nothing between reads the tile or
// touches the destination, the producer does not read the destination, and nothing reads the
// tile afterwards. Returns the producer's index (now perhaps a store itself), or i.
size_t forward_store(std::vector<Instr>& instrs, size_t i, int32_t arena) {
  const Instr& st = instrs[i];
  if (!plain_copy(st) || st.src[0].slot != arena || st.dst.slot == arena) return i;
  const Operand& tile = st.src[0];
  const Operand& out = st.dst;
  const int64_t pitch = tile.stride[0] * 4;
  if (!unread_after(instrs, i + 1, tile, st, arena)) return i;
  const size_t stop = i > kLookAhead ? i - kLookAhead : 0;
  for (size_t j = i; j-- > stop;) {
    Instr& in = instrs[j];
    if (in.dropped) continue;
    if (empty_box(in) || in.absorbed || opaque_reads(in)) return i;
    for (const Operand& o : in.src)
      if (touch(o, in, out, st, 0) || touch(o, in, tile, st, pitch)) return i;
    if (touch(in.dst, in, out, st, 0)) return i;
    if (!touch(in.dst, in, tile, st, pitch)) continue;
    if (in.kind != Kind::kElementwise || in.dst.dtype != DType::k_float32 || !covers(in, tile, st))
      return i;
    in.dst = out;
    instrs[i].dropped = true;
    return j;
  }
  return i;
}

// --- a matmul and the `acc += result` after it ----------------------------------------------

// Instruction e is `acc += m's result` over exactly m's [M, N] result, with an accumulator the
// matmul's store may write while other threads still read m's operands and result.
bool absorbable(const Instr& m, const Instr& e) {
  if (m.kind != Kind::kMatmul || m.accumulate || m.dst.dtype != DType::k_float32) return false;
  if (e.kind != Kind::kElementwise || e.ndim != 2 || e.extent[0] != m.extent[0] ||
      e.extent[1] != m.extent[1] || e.nreduce != 0 || !e.accumulate || e.acc_op != Op::k_add ||
      !e.steps.empty() || e.src.size() != 1 || !e.preds.empty())
    return false;
  if (!same_view2(e.src[0], m.dst, e) || e.dst.type != Operand::kView ||
      e.dst.dtype != DType::k_float32 || e.dst.stride[1] != 1 || e.extent[0] == 0 ||
      e.extent[1] == 0)
    return false;
  const int64_t pitch = e.dst.stride[0] * 4;
  if (touch(e.dst, e, m.dst, m, pitch)) return false;
  for (const Operand& o : m.src)
    if (touch(e.dst, e, o, m, pitch)) return false;
  return true;
}

void fuse_accumulates(std::vector<Instr>& instrs, int32_t arena) {
  for (size_t i = 0; i + 1 < instrs.size(); ++i) {
    Instr& m = instrs[i];
    if (m.kind != Kind::kMatmul || m.dropped || instrs[i + 1].dropped || m.extent[0] == 0 ||
        m.extent[1] == 0 || m.extent[2] == 0 || !absorbable(m, instrs[i + 1]))
      continue;
    m.absorbs_next = true;
    m.acc_dst = instrs[i + 1].dst;
    instrs[i + 1].absorbed = true;
    m.dst_dead = unread_after(instrs, i + 2, m.dst, m, arena);
  }
}

// --- a loop over K tiles: `acc += matmul(a_k, b_k)` ------------------------------------------

// b is a's view moved k rows further along the contraction axis (stride[2]), strides equal.
bool k_adjacent(const Operand& a, const Operand& b, int64_t k) {
  return a.type == Operand::kView && b.type == Operand::kView && a.slot == b.slot &&
         a.dtype == b.dtype && a.stride[0] == b.stride[0] && a.stride[1] == b.stride[1] &&
         a.stride[2] == b.stride[2] && b.offset == a.offset + k * a.stride[2];
}

bool same_accumulator(const Instr& m, const Instr& n) {
  const Operand& a = m.acc_dst;
  const Operand& b = n.acc_dst;
  return a.slot == b.slot && a.dtype == b.dtype && a.offset == b.offset &&
         a.stride[0] == b.stride[0] && a.stride[1] == b.stride[1];
}

// Matmul n continues matmul m's contraction: both add into one accumulator (their results
// unread), over the same [M, N], with operands that are the next K rows of m's.
bool continues_k(const Instr& m, const Instr& n) {
  return n.kind == Kind::kMatmul && !n.dropped && n.absorbs_next && n.dst_dead && n.preds.empty() &&
         n.extent[0] == m.extent[0] && n.extent[1] == m.extent[1] && same_accumulator(m, n) &&
         k_adjacent(m.src[0], n.src[0], m.extent[2]) && k_adjacent(m.src[1], n.src[1], m.extent[2]);
}

// NKI's K loop (`for k: acc += nl.matmul(load(a[k]), load(b[k]))`, its loads forwarded to the
// HBM slices) becomes one matmul over the whole K range when nothing runs between the tiles: one
// host GEMM of K = 1024 instead of eight of K = 128 (MKL runs the small ones at half its rate;
// 1024^3: 10.6 -> 8.1 ms, 7.9 with the GEMM adding into the accumulator). Still a float32 sum into
// the float32 accumulator; the order of the additions is the GEMM's (as for any one matmul), no
// longer tile by tile.
void merge_k_loops(std::vector<Instr>& instrs) {
  for (size_t i = 0; i < instrs.size(); ++i) {
    Instr& m = instrs[i];
    if (m.kind != Kind::kMatmul || m.dropped || !m.absorbs_next || !m.dst_dead || !m.preds.empty())
      continue;
    for (size_t j = i + 1; j < instrs.size(); ++j) {
      const Instr& n = instrs[j];
      if (n.dropped || n.absorbed) continue;  // not run: nothing happens between the tiles
      if (!continues_k(m, n)) break;
      m.extent[2] += n.extent[2];
      instrs[j].dropped = true;  // its absorbed add stays absorbed: neither runs
    }
  }
}

// --- chains of elementwise instructions ---------------------------------------------------

bool same_preds(const Instr& a, const Instr& b) {
  if (a.preds.size() != b.preds.size()) return false;
  for (size_t k = 0; k < a.preds.size(); ++k) {
    if (a.preds[k].c != b.preds[k].c) return false;
    for (int d = 0; d < 2; ++d)
      if (a.preds[k].coef[d] != b.preds[k].coef[d]) return false;
  }
  return true;
}

bool draws_random(const Instr& in) {
  for (const Step& st : in.steps)
    if (st.op == Op::k_random || st.op == Op::k_launch_random) return true;
  return false;
}

// A two-axis elementwise instruction that may be inlined into its reader (a), or read a
// producer inlined into it (b).
bool chain_link(const Instr& in) {
  return in.kind == Kind::kElementwise && !in.dropped && !in.absorbed && in.ndim == 2 &&
         !empty_box(in) && !draws_random(in);
}

// How operand o of b (over b's box) reads a's destination (over a's box), element for element:
// per axis, the same index (equal extents and strides) or a's only index broadcast (a's extent
// 1, o's stride 0). False for any other reading, or a's predicates not b's on the lanes b reads.
bool reads_whole_result(const Operand& o, const Instr& b, const Instr& a, bool broadcast[2]) {
  const Operand& t = a.dst;
  if (o.type != Operand::kView || o.slot != t.slot || o.dtype != t.dtype || o.offset != t.offset)
    return false;
  for (int d = 0; d < 2; ++d) {
    broadcast[d] = false;
    if (a.extent[d] == b.extent[d] && (a.extent[d] == 1 || o.stride[d] == t.stride[d])) continue;
    if (a.extent[d] != 1 || o.stride[d] != 0) return false;
    broadcast[d] = true;
  }
  if (a.preds.empty()) return true;  // a wrote every lane
  if (!same_preds(a, b)) return false;
  for (const Pred& pr : a.preds)
    for (int d = 0; d < 2; ++d)
      if (broadcast[d] && pr.coef[d] != 0) return false;
  return true;
}

// a (at i) is inlined into b, the next instruction run (at j), when b is the only reader of a's
// result: b reads it element for element, lane by lane under the same mask (or a [P, 1] / [1, F]
// result broadcast), and nothing reads it afterwards, a's result is a float32 tile of the arena
// (its value is the float the register held), and b writes nothing a reads (so b's rows may read
// a's operands after b's earlier rows wrote). The merged b computes a's steps in registers then
// its own: the same operations on the same floats in the same order (bitwise the same results),
// one pass over the rows instead of two and no tile written and read back in between.
bool inline_into(std::vector<Instr>& instrs, size_t i, size_t j, int32_t arena) {
  const Instr& a = instrs[i];
  Instr& b = instrs[j];
  if (!chain_link(a) || !chain_link(b) || a.nreduce != 0 || a.accumulate ||
      a.dst.type != Operand::kView || a.dst.slot != arena || a.dst.dtype != DType::k_float32)
    return false;
  const int64_t pitch = a.dst.stride[0] * 4;
  std::vector<int> reader;  // b's operands that read a's result
  bool broadcast[2] = {false, false};
  for (size_t k = 0; k < b.src.size(); ++k) {
    if (!touch(b.src[k], b, a.dst, a, pitch)) continue;
    bool bc[2];
    if (!reads_whole_result(b.src[k], b, a, bc)) return false;
    if (!reader.empty() && (bc[0] != broadcast[0] || bc[1] != broadcast[1])) return false;
    broadcast[0] = bc[0];
    broadcast[1] = bc[1];
    reader.push_back(static_cast<int>(k));
  }
  if (reader.empty() || touch(b.dst, b, a.dst, a, pitch)) return false;
  for (const Operand& o : a.src)
    if (o.type == Operand::kView && touch(b.dst, b, o, a, o.slot == arena ? pitch : 0))
      return false;
  const size_t n_src = b.src.size() - reader.size() + a.src.size();
  if (n_src + a.steps.size() + b.steps.size() > static_cast<size_t>(kMaxRegisters)) return false;
  if (!unread_after(instrs, j + 1, a.dst, a, arena)) return false;

  // Registers of the merged instruction: b's other operands, a's operands, a's steps, b's steps.
  std::vector<Operand> src;
  std::vector<int> b_reg(b.src.size() + b.steps.size());
  for (size_t k = 0; k < b.src.size(); ++k)
    if (std::find(reader.begin(), reader.end(), static_cast<int>(k)) == reader.end()) {
      b_reg[k] = static_cast<int>(src.size());
      src.push_back(b.src[k]);
    }
  std::vector<int> a_reg(a.src.size() + a.steps.size());
  for (size_t k = 0; k < a.src.size(); ++k) {
    a_reg[k] = static_cast<int>(src.size());
    Operand o = a.src[k];
    for (int d = 0; d < 2; ++d)
      if (broadcast[d]) o.stride[d] = 0;  // a's only index along that axis
    src.push_back(o);
  }
  std::vector<Step> steps;
  auto add = [&](const Step& st, const std::vector<int>& reg) {
    steps.push_back({st.op, static_cast<uint8_t>(reg[st.a]), static_cast<uint8_t>(reg[st.b]),
                     static_cast<uint8_t>(reg[st.c])});
  };
  for (size_t s = 0; s < a.steps.size(); ++s) {
    add(a.steps[s], a_reg);
    a_reg[a.src.size() + s] = static_cast<int>(n_src + s);
  }
  const int a_result = a_reg[a.steps.empty() ? 0 : a.src.size() + a.steps.size() - 1];
  for (int k : reader) b_reg[static_cast<size_t>(k)] = a_result;
  for (size_t s = 0; s < b.steps.size(); ++s) {
    add(b.steps[s], b_reg);
    b_reg[b.src.size() + s] = static_cast<int>(n_src + a.steps.size() + s);
  }
  // With no steps of b's own, b's result is its one operand: a's result, which must then be the
  // merged instruction's result register (its last step, or operand 0 without steps).
  if (b.steps.empty() &&
      a_result != (steps.empty() ? 0 : static_cast<int>(n_src + steps.size() - 1)))
    return false;
  b.src = std::move(src);
  b.steps = std::move(steps);
  instrs[i].dropped = true;
  return true;
}

void inline_chains(std::vector<Instr>& instrs, int32_t arena) {
  for (size_t i = 0; i < instrs.size(); ++i) {
    size_t j = i + 1;
    while (j < instrs.size() && (instrs[j].dropped || instrs[j].absorbed)) ++j;
    if (j < instrs.size()) inline_into(instrs, i, j, arena);
  }
}

}  // namespace

void rewrite_instance(std::vector<Instr>& instrs, int32_t arena) {
  for (size_t i = 0; i < instrs.size(); ++i) forward_load(instrs, i, arena);
  for (size_t i = 0; i < instrs.size(); ++i)
    for (size_t at = i, next; (next = forward_store(instrs, at, arena)) != at;) at = next;
  fuse_accumulates(instrs, arena);
  merge_k_loops(instrs);
  inline_chains(instrs, arena);
}

}  // namespace openneuron::nki
