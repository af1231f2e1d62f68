// The vectorized interpreter for ir::Kernel (see execute.h). A kernel is split into two
// programs: the full-domain program (loads, pointwise ops, full-domain stores, reduction inputs)
// and the reduced-domain program (reduction results and what is computed from them). Each runs
// over tiles of up to kChunkElems elements: rows x cols, cols along the innermost simplified dim.
// The per-chunk loops (op kernels, loads, stores, accumulation) are compiled for AVX-512, AVX2
// and baseline x86-64 (OPENNEURON_ISA_DISPATCH, runtime/isa.h) and the active variant is called.
//
// Parts: program.h (shared internals), plan.cpp, chunk_ops.cpp, chunk_reduce.cpp; this file is
// the iteration space (tiling, operand strides, parallel split) and the runner that drives them.
//
// NOTE: errno is never read by the interpreter; without it GCC vectorizes sqrt/floor/etc.
#pragma GCC optimize("no-math-errno")

#include "ir/execute.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/program.h"
#include "runtime/parallel.h"

namespace openneuron::ir {
namespace detail {

// --- the iteration space --------------------------------------------------------------------

// NOTE: slot buffers are 8 KiB + 5 cache lines apart: at a multiple of 4 KiB every buffer
// would alias the others in the low address bits and loads would stall on unrelated stores
// (4K aliasing), costing ~2x on op chains.
constexpr int64_t kSlotBytes = kChunkElems * 8 + 320;

// A list of dims without heap allocation (at most 64 dims).
struct DimList {
  int d[64];
  int n = 0;
  void push_back(int x) { d[n++] = x; }
  void pop_back() { --n; }
  int back() const { return d[n - 1]; }
  bool empty() const { return n == 0; }
  size_t size() const { return static_cast<size_t>(n); }
  int operator[](size_t i) const { return d[i]; }
  const int* begin() const { return d; }
  const int* end() const { return d + n; }
};

struct Space {
  int nin = 0, nops = 0;
  std::vector<char*> base;     // per operand
  std::vector<DType> dtype;    // per operand
  std::vector<int64_t> esize;  // per operand
  int nd = 0;
  std::vector<int64_t> size;    // per dim, outer -> inner
  std::vector<uint8_t> red;     // per dim
  std::vector<int64_t> stride;  // [d * nops + o]
  int64_t st(int d, int o) const { return stride[static_cast<size_t>(d) * nops + o]; }
};

// A tile: rows x cols elements; cols along col_dim, rows along row_dim (-1: one row).
struct Tile {
  int64_t rows = 1, cols = 1;
  int row_dim = -1, col_dim = -1;
};

// A per-thread array whose elements share no cache line with other heap data. NOTE: the
// executor thread's and the pool workers' small scratch arrays come from one malloc arena and
// sat next to each other: every tile's offset/pointer updates then bounced cache lines between
// the cores (false sharing; ~15% of a fused GELU's time on 2 threads).
template <class T>
struct PaddedArray {
  static constexpr size_t kPad = 128 / sizeof(T);
  std::vector<T> v;
  T* get(size_t n) {
    if (v.size() < n + 2 * kPad) v.resize(n + 2 * kPad);
    return v.data() + kPad;
  }
};

struct Scratch {
  std::vector<char> mem;
  PaddedArray<void*> ptr;
  // NOTE: 128 bytes of slack on each side of the used range (see PaddedArray).
  char* aligned(size_t bytes) {
    if (mem.size() < bytes + 256) mem.assign(bytes + 256, 0);
    uintptr_t p = reinterpret_cast<uintptr_t>(mem.data()) + 64;
    return reinterpret_cast<char*>((p + 63) & ~uintptr_t{63});
  }
};

struct Runner {
  const Kernel& k;
  const Plan& plan;
  const Space& sp;
  int nred;
  char* slots_full;
  char* slots_red;
  char* acc;    // nred * kSlotBytes: mode B accumulators / reduced values
  char* lanes;  // nred * kLanes * 8
  void** ptr;   // per value: its chunk (a slot, input memory, or output memory)

  // max_tile: the most elements any tile of this call has (constants are filled that far).
  Runner(const Kernel& kk, const Plan& pl, const Space& s, Scratch& scratch, int64_t max_tile)
      : k(kk), plan(pl), sp(s), nred(static_cast<int>(pl.reductions.size())) {
    size_t bytes = (plan.full.nslots + plan.reduced.nslots + nred) * kSlotBytes + nred * kLanes * 8;
    char* m = scratch.aligned(bytes);
    slots_full = m;
    slots_red = slots_full + plan.full.nslots * kSlotBytes;
    acc = slots_red + plan.reduced.nslots * kSlotBytes;
    lanes = acc + nred * kSlotBytes;
    ptr = scratch.ptr.get(k.num_values());
    std::fill(ptr, ptr + k.num_values(), nullptr);
    for (ValueId v : plan.full.consts)
      fill_constant(k.node(v), slots_full + plan.full.slot[v] * kSlotBytes, max_tile);
    for (ValueId v : plan.reduced.consts)
      fill_constant(k.node(v), slots_red + plan.reduced.slot[v] * kSlotBytes, max_tile);
  }

  Kind red_kind(int r) const { return kind_of(k.node(plan.reductions[r]).dtype); }
  Op red_op(int r) const { return k.node(plan.reductions[r]).op; }
  char* acc_buf(int r) const { return acc + r * kSlotBytes; }
  char* lane_buf(int r) const { return lanes + r * kLanes * 8; }

  // Computes a program's values over tile t whose element (0,0) is at offsets off[o].
  // NOTE: values are never computed straight into output memory: measured 35% slower on a 4M
  // f32 GELU chain than computing into the L1 chunk and copying (the copy's rep movsb writes
  // whole lines; the op loop's stores stall on the output lines' read-for-ownership).
  void compute(const Program& p, char* slots, const Tile& t, const int64_t* off) {
    int64_t n = t.rows * t.cols;
    for (ValueId v : p.consts) ptr[v] = slots + p.slot[v] * kSlotBytes;
    for (ValueId v : p.red_inputs) {
      for (int r = 0; r < nred; ++r)
        if (plan.reductions[r] == v) ptr[v] = acc_buf(r);
    }
    for (ValueId v : p.loads) {
      int o = k.node(v).index;
      DType dt = sp.dtype[o];
      int64_t cs = sp.st(t.col_dim, o);
      int64_t rs = t.row_dim >= 0 ? sp.st(t.row_dim, o) : 0;
      const char* src = sp.base[o] + off[o] * sp.esize[o];
      bool direct = dt != DType::kBFloat16 && dt != DType::kFloat16 && dt != DType::kBool &&
                    cs == 1 && (t.rows == 1 || rs == t.cols);
      if (direct) {
        ptr[v] = const_cast<char*>(src);
        continue;
      }
      char* dst = slots + p.slot[v] * kSlotBytes;
      ptr[v] = dst;
      int64_t kb = kind_bytes(kind_of(dt));
      for (int64_t r = 0; r < t.rows; ++r)
        load_row(dt, src + r * rs * sp.esize[o], cs, dst + r * t.cols * kb, t.cols);
    }
    for (const Instr& in : p.instrs) {
      ptr[in.out] = slots + p.slot[in.out] * kSlotBytes;
      run_instr(in, ptr, n);
    }
  }

  // Stores a computed program's outputs over tile t. NOTE: after compute, so an output that
  // aliases an input (in-place) is written only once every value of the tile is computed.
  void store(const Program& p, const Tile& t, const int64_t* off) {
    for (auto& [o, v] : p.stores) {
      int op = sp.nin + o;
      DType dt = sp.dtype[op];
      int64_t cs = sp.st(t.col_dim, op);
      int64_t rs = t.row_dim >= 0 ? sp.st(t.row_dim, op) : 0;
      char* dst = sp.base[op] + off[op] * sp.esize[op];
      int64_t kb = kind_bytes(kind_of(dt));
      const char* src = static_cast<const char*>(ptr[v]);
      for (int64_t r = 0; r < t.rows; ++r)
        store_row(dt, src + r * t.cols * kb, dst + r * rs * sp.esize[op], cs, t.cols);
    }
  }

  void accumulate_all(const Tile& t, bool lanes_mode) {
    for (int r = 0; r < nred; ++r) {
      ValueId src = k.node(plan.reductions[r]).args[0];
      accumulate(red_kind(r), red_op(r), lanes_mode, lanes_mode ? lane_buf(r) : acc_buf(r),
                 ptr[src], t.rows * t.cols);
    }
  }

  void set_offsets(const DimList& dims, int64_t lin, const int64_t* base_off, int64_t* off) const {
    for (int o = 0; o < sp.nops; ++o) off[o] = base_off ? base_off[o] : 0;
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      int d = dims[i];
      int64_t idx = lin % sp.size[d];
      lin /= sp.size[d];
      for (int o = 0; o < sp.nops; ++o) off[o] += idx * sp.st(d, o);
    }
  }
};

thread_local Scratch t_scratch;
thread_local PaddedArray<int64_t> t_offsets;  // per-task operand offsets (4 sets)

int64_t product(const Space& sp, const DimList& dims) {
  int64_t p = 1;
  for (int d : dims) p *= sp.size[d];
  return p;
}

// The iteration space's element count: the work runtime::parallel_for weighs.
int64_t space_elements(const Space& sp) {
  int64_t p = 1;
  for (int d = 0; d < sp.nd; ++d) p *= sp.size[d];
  return p;
}

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pointwise kernels and reductions whose innermost dim is not reduced (mode B): a tile over
// non-reduced dims, iterated over every reduced index with elementwise accumulators.
void run_tiled(const Kernel& k, const Plan& plan, const Space& sp, int64_t r_total) {
  int nd = sp.nd;
  Tile t;
  t.col_dim = nd - 1;
  int64_t ncol = sp.size[t.col_dim];
  t.cols = std::min<int64_t>(ncol, kChunkElems);
  if (nd >= 2 && !sp.red[nd - 2] && ncol <= kChunkElems / 2) {
    t.row_dim = nd - 2;
    t.rows = std::min<int64_t>(sp.size[nd - 2], kChunkElems / ncol);
  }
  DimList outer, rdims;
  for (int d = 0; d < nd; ++d) {
    if (d == t.col_dim || d == t.row_dim) continue;
    (sp.red[d] ? rdims : outer).push_back(d);
  }
  int64_t ncoltiles = div_up(ncol, t.cols);
  int64_t nrowtiles = t.row_dim >= 0 ? div_up(sp.size[t.row_dim], t.rows) : 1;
  int64_t items = product(sp, outer) * nrowtiles * ncoltiles;
  int64_t tile_work = t.rows * t.cols * std::max<int64_t>(r_total, 1);
  int64_t grain = std::max<int64_t>(1, 32768 / tile_work);
  bool has_red = !plan.reductions.empty();
  // NOTE: blocks of `grain` tiles are claimed from a shared counter (dynamic scheduling): with a
  // static split a worker descheduled by other processes on a busy host held up the whole call
  // by its fixed share. Each tile is independent, so results do not depend on who ran it.
  int64_t nblocks = div_up(items, grain);
  std::atomic<int64_t> next_block{0};
  runtime::parallel_for(
      0, std::min<int64_t>(nblocks, 64), 1, space_elements(sp), [&](int64_t, int64_t) {
        Runner run(k, plan, sp, t_scratch, t.rows * t.cols);
        int64_t* off = t_offsets.get(4 * static_cast<size_t>(sp.nops));
        int64_t* roff = off + sp.nops;
        for (int64_t blk; (blk = next_block.fetch_add(1, std::memory_order_relaxed)) < nblocks;) {
          int64_t begin = blk * grain, end = std::min(items, begin + grain);
          for (int64_t it = begin; it < end; ++it) {
            int64_t ct = it % ncoltiles;
            int64_t rt = (it / ncoltiles) % nrowtiles;
            int64_t ol = it / ncoltiles / nrowtiles;
            run.set_offsets(outer, ol, nullptr, off);
            Tile tt = t;
            tt.cols = std::min(t.cols, ncol - ct * t.cols);
            for (int o = 0; o < sp.nops; ++o) off[o] += ct * t.cols * sp.st(t.col_dim, o);
            if (t.row_dim >= 0) {
              tt.rows = std::min(t.rows, sp.size[t.row_dim] - rt * t.rows);
              for (int o = 0; o < sp.nops; ++o) off[o] += rt * t.rows * sp.st(t.row_dim, o);
            }
            int64_t n = tt.rows * tt.cols;
            if (!has_red) {
              run.compute(plan.full, run.slots_full, tt, off);
              run.store(plan.full, tt, off);
              continue;
            }
            for (int r = 0; r < run.nred; ++r)
              fill_identity(run.red_kind(r), run.red_op(r), run.acc_buf(r), n);
            for (int64_t rl = 0; rl < r_total; ++rl) {
              run.set_offsets(rdims, rl, off, roff);
              run.compute(plan.full, run.slots_full, tt, roff);
              run.accumulate_all(tt, false);
              run.store(plan.full, tt, roff);
            }
            for (int r = 0; r < run.nred; ++r)
              round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), n);
            run.compute(plan.reduced, run.slots_red, tt, off);
            run.store(plan.reduced, tt, off);
          }
        }
      });
}

// Reductions whose innermost dim is reduced (mode A): batches of up to kChunkElems positions
// along the innermost non-reduced dim q; each position reduces into kLanes lanes (or, when the
// only reduced dim is short, a tile holds several positions, one row each).
// A reduction to a single position (e.g. a full sum) over many tiles: fixed blocks of
// kTilesPerBlock tiles reduce into their own lanes in parallel, then the blocks' lanes combine in
// block order. NOTE: the blocking depends only on the shape, so results do not depend on the
// thread count (or on whether a parallel backend is installed).
constexpr int64_t kTilesPerBlock = 32;

void run_split_reduction(const Kernel& k, const Plan& plan, const Space& sp, const DimList& router,
                         const Tile& rt, int rrow, int64_t nrowtiles, int64_t ncoltiles,
                         int64_t ntiles) {
  int nred = static_cast<int>(plan.reductions.size());
  int64_t nblocks = div_up(ntiles, kTilesPerBlock);
  const int64_t lane_bytes = kLanes * 8;
  std::vector<char> partials(static_cast<size_t>(nblocks * nred * lane_bytes));
  int cdim = sp.nd - 1;
  runtime::parallel_for(0, nblocks, 1, space_elements(sp), [&](int64_t begin, int64_t end) {
    Runner run(k, plan, sp, t_scratch, kChunkElems);
    int64_t* roff = t_offsets.get(4 * static_cast<size_t>(sp.nops));
    int64_t* toff = roff + sp.nops;
    for (int64_t blk = begin; blk < end; ++blk) {
      for (int r = 0; r < nred; ++r)
        fill_identity(run.red_kind(r), run.red_op(r), run.lane_buf(r), kLanes);
      int64_t t_end = std::min(ntiles, (blk + 1) * kTilesPerBlock);
      for (int64_t ti = blk * kTilesPerBlock; ti < t_end; ++ti) {
        int64_t ct = ti % ncoltiles;
        int64_t rtile = (ti / ncoltiles) % nrowtiles;
        int64_t rl = ti / ncoltiles / nrowtiles;
        run.set_offsets(router, rl, nullptr, roff);
        Tile t = rt;
        t.cols = std::min(rt.cols, sp.size[cdim] - ct * rt.cols);
        for (int o = 0; o < sp.nops; ++o) toff[o] = roff[o] + ct * rt.cols * sp.st(cdim, o);
        if (rrow >= 0) {
          t.rows = std::min(rt.rows, sp.size[rrow] - rtile * rt.rows);
          for (int o = 0; o < sp.nops; ++o) toff[o] += rtile * rt.rows * sp.st(rrow, o);
        }
        run.compute(plan.full, run.slots_full, t, toff);
        run.accumulate_all(t, true);
        run.store(plan.full, t, toff);
      }
      for (int r = 0; r < nred; ++r)
        std::memcpy(partials.data() + (blk * nred + r) * lane_bytes, run.lane_buf(r), lane_bytes);
    }
  });
  Runner run(k, plan, sp, t_scratch, 1);
  for (int r = 0; r < nred; ++r) {
    Kind kd = run.red_kind(r);
    fill_identity(kd, run.red_op(r), run.lane_buf(r), kLanes);
    for (int64_t blk = 0; blk < nblocks; ++blk)
      accumulate(kd, run.red_op(r), false, run.lane_buf(r),
                 partials.data() + (blk * nred + r) * lane_bytes, kLanes);
    finish_lanes(kd, run.red_op(r), run.lane_buf(r), run.acc_buf(r), 0);
    round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), 1);
  }
  Tile et;
  et.col_dim = 0;  // the (virtual or size-1) position dim
  et.cols = 1;
  std::vector<int64_t> zero(sp.nops, 0);
  run.compute(plan.reduced, run.slots_red, et, zero.data());
  run.store(plan.reduced, et, zero.data());
}

void run_inner_reduction(const Kernel& k, const Plan& plan, const Space& sp) {
  int nd = sp.nd;
  int cdim = nd - 1;
  int q = -1;
  for (int d = 0; d < nd; ++d)
    if (!sp.red[d]) q = d;
  DimList outer, router;
  for (int d = 0; d < nd; ++d) {
    if (d == q || d == cdim) continue;
    (sp.red[d] ? router : outer).push_back(d);
  }
  int64_t ncol = sp.size[cdim];
  bool rows_mode = router.empty() && q == nd - 2 && ncol <= kChunkElems / 2;
  int64_t nq = sp.size[q];
  int64_t batch = std::min<int64_t>(nq, kChunkElems);
  int64_t nbatches = div_up(nq, batch);
  int64_t items = product(sp, outer) * nbatches;
  int64_t r_total = product(sp, router) * ncol;
  int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, batch * r_total));
  // Tile over the reduced space of one position (not rows_mode).
  Tile rt;
  rt.col_dim = cdim;
  rt.cols = std::min<int64_t>(ncol, kChunkElems);
  int rrow = -1;
  if (!router.empty() && router.back() == nd - 2 && ncol <= kChunkElems / 2) {
    rrow = nd - 2;
    router.pop_back();
    rt.row_dim = rrow;
    rt.rows = std::min<int64_t>(sp.size[rrow], kChunkElems / ncol);
  }
  int64_t ncoltiles = div_up(ncol, rt.cols);
  int64_t nrowtiles = rrow >= 0 ? div_up(sp.size[rrow], rt.rows) : 1;
  int64_t nrouter = product(sp, router);
  int64_t ntiles = nrouter * nrowtiles * ncoltiles;
  if (items == 1 && nq == 1 && !rows_mode && ntiles > kTilesPerBlock) {
    run_split_reduction(k, plan, sp, router, rt, rrow, nrowtiles, ncoltiles, ntiles);
    return;
  }
  runtime::parallel_for(0, items, grain, space_elements(sp), [&](int64_t begin, int64_t end) {
    Runner run(k, plan, sp, t_scratch, kChunkElems);
    int64_t* off = t_offsets.get(4 * static_cast<size_t>(sp.nops));
    int64_t* poff = off + sp.nops;
    int64_t* roff = poff + sp.nops;
    int64_t* toff = roff + sp.nops;
    for (int64_t it = begin; it < end; ++it) {
      int64_t bt = it % nbatches;
      run.set_offsets(outer, it / nbatches, nullptr, off);
      int64_t p0 = bt * batch;
      int64_t np = std::min(batch, nq - p0);
      for (int o = 0; o < sp.nops; ++o) off[o] += p0 * sp.st(q, o);
      if (rows_mode) {
        Tile t;
        t.col_dim = cdim;
        t.cols = ncol;
        t.row_dim = q;
        int64_t per = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(ncol, 1));
        for (int64_t p = 0; p < np; p += per) {
          t.rows = std::min(per, np - p);
          for (int o = 0; o < sp.nops; ++o) poff[o] = off[o] + p * sp.st(q, o);
          run.compute(plan.full, run.slots_full, t, poff);
          for (int r = 0; r < run.nred; ++r) {
            Kind kd = run.red_kind(r);
            int64_t kb = kind_bytes(kd);
            ValueId src = k.node(plan.reductions[r]).args[0];
            for (int64_t row = 0; row < t.rows; ++row) {
              fill_identity(kd, run.red_op(r), run.lane_buf(r), kLanes);
              accumulate(kd, run.red_op(r), true, run.lane_buf(r),
                         static_cast<const char*>(run.ptr[src]) + row * ncol * kb, ncol);
              finish_lanes(kd, run.red_op(r), run.lane_buf(r), run.acc_buf(r), p + row);
            }
          }
          run.store(plan.full, t, poff);
        }
      } else {
        for (int64_t p = 0; p < np; ++p) {
          for (int o = 0; o < sp.nops; ++o) poff[o] = off[o] + p * sp.st(q, o);
          for (int r = 0; r < run.nred; ++r)
            fill_identity(run.red_kind(r), run.red_op(r), run.lane_buf(r), kLanes);
          for (int64_t rl = 0; rl < nrouter; ++rl) {
            run.set_offsets(router, rl, poff, roff);
            for (int64_t rtile = 0; rtile < nrowtiles; ++rtile) {
              for (int64_t ct = 0; ct < ncoltiles; ++ct) {
                Tile t = rt;
                t.cols = std::min(rt.cols, ncol - ct * rt.cols);
                for (int o = 0; o < sp.nops; ++o) toff[o] = roff[o] + ct * rt.cols * sp.st(cdim, o);
                if (rrow >= 0) {
                  t.rows = std::min(rt.rows, sp.size[rrow] - rtile * rt.rows);
                  for (int o = 0; o < sp.nops; ++o) toff[o] += rtile * rt.rows * sp.st(rrow, o);
                }
                run.compute(plan.full, run.slots_full, t, toff);
                run.accumulate_all(t, true);
                run.store(plan.full, t, toff);
              }
            }
          }
          for (int r = 0; r < run.nred; ++r)
            finish_lanes(run.red_kind(r), run.red_op(r), run.lane_buf(r), run.acc_buf(r), p);
        }
      }
      for (int r = 0; r < run.nred; ++r)
        round_buffer(k.node(plan.reductions[r]).dtype, run.acc_buf(r), np);
      Tile et;
      et.col_dim = q;
      et.cols = np;
      run.compute(plan.reduced, run.slots_red, et, off);
      run.store(plan.reduced, et, off);
    }
  });
}

}  // namespace detail

using namespace detail;  // NOLINT(build/namespaces): the interpreter's own internals

struct KernelExecAccess {
  static const Plan& plan(const Kernel& k) {
    std::call_once(k.exec_once_, [&] { k.exec_plan_ = make_plan(k); });
    return *static_cast<const Plan*>(k.exec_plan_.get());
  }
};

void execute(const Kernel& k, const int64_t* sizes, int ndim, const Operand* inputs,
             const Operand* outputs) {
  if (ndim < 0 || ndim > 64) fail("ndim " + std::to_string(ndim) + " out of range [0, 64]");
  if (ndim > 0 && sizes == nullptr) fail("sizes is null");
  uint64_t mask = k.reduce_mask();
  if (ndim < 64 && (mask >> ndim) != 0)
    fail("kernel reduces axes beyond the iteration space's " + std::to_string(ndim) + " dims");
  const Plan& plan = KernelExecAccess::plan(k);
  // NOTE: per-call vectors are reused across calls on a thread (small kernels are dominated by
  // malloc otherwise); a nested call (a math hook that executes a kernel) gets fresh ones.
  thread_local Space t_space;
  thread_local bool t_space_busy = false;
  Space local_space;
  Space& sp = t_space_busy ? local_space : t_space;
  struct Release {
    bool* flag;
    ~Release() {
      if (flag) *flag = false;
    }
  } release{t_space_busy ? nullptr : &t_space_busy};
  t_space_busy = true;
  sp.base.clear();
  sp.dtype.clear();
  sp.esize.clear();
  sp.nin = k.num_inputs();
  sp.nops = k.num_inputs() + k.num_outputs();
  int64_t numel = 1, r_total = 1;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] < 0)
      fail("negative size " + std::to_string(sizes[d]) + " at dim " + std::to_string(d));
    numel *= sizes[d];
    if (mask >> d & 1) r_total *= sizes[d];
  }
  for (int o = 0; o < sp.nops; ++o) {
    const Operand& op = o < sp.nin ? inputs[o] : outputs[o - sp.nin];
    DType dt = o < sp.nin ? k.input_dtype(o) : k.output_dtype(o - sp.nin);
    if (ndim > 0 && op.strides == nullptr)
      fail(std::string(o < sp.nin ? "input " : "output ") +
           std::to_string(o < sp.nin ? o : o - sp.nin) + " has null strides");
    sp.base.push_back(static_cast<char*>(op.data));
    sp.dtype.push_back(dt);
    sp.esize.push_back(static_cast<int64_t>(dtype_size(dt)));
  }
  // Values after a reduction need broadcast inputs and keepdim outputs along reduced axes.
  for (int d = 0; d < ndim; ++d) {
    if (!(mask >> d & 1) || sizes[d] <= 1) continue;
    for (int i = 0; i < sp.nin; ++i)
      if (plan.input_in_reduced[i] && inputs[i].strides[d] != 0)
        fail("input " + std::to_string(i) +
             " is combined with a reduction's result, so it must "
             "be broadcast (stride 0) along reduced axis " +
             std::to_string(d) + ", got stride " + std::to_string(inputs[i].strides[d]) +
             "; split the kernel after the reduction");
    for (int o = 0; o < k.num_outputs(); ++o)
      if (plan.output_reduced[o] && outputs[o].strides[d] != 0)
        fail("output " + std::to_string(o) +
             " stores a reduced value, so it must have stride 0 "
             "along reduced axis " +
             std::to_string(d) + " (keepdim), got " + std::to_string(outputs[o].strides[d]));
  }
  bool has_red = !plan.reductions.empty();
  if (numel == 0 && !(has_red && r_total == 0)) return;  // empty: nothing to compute
  if (has_red && r_total == 0) {
    for (int d = 0; d < ndim; ++d)
      if (!(mask >> d & 1) && sizes[d] == 0) return;
  }
  // Simplify: drop size-1 dims (and every reduced dim of an empty reduction), order by stride
  // (outputs first, then inputs; stride-0 entries do not vote), merge contiguous neighbours.
  int dims_buf[64];
  int ndims = 0;
  for (int d = 0; d < ndim; ++d) {
    bool red = mask >> d & 1;
    if (sizes[d] == 1 || (red && r_total == 0)) continue;
    dims_buf[ndims++] = d;
  }
  int* dims = dims_buf;
  auto stride_of = [&](int d, int o) {
    return o < sp.nin ? inputs[o].strides[d] : outputs[o - sp.nin].strides[d];
  };
  // Insertion sort, outermost first: move d_inner inward while it has larger strides.
  auto outer_than = [&](int a, int b) {  // should a come before (outside) b?
    for (int i = 0; i < sp.nops; ++i) {
      int o = (i + sp.nin) % sp.nops;  // outputs first
      int64_t sa = std::abs(stride_of(a, o)), sb = std::abs(stride_of(b, o));
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa > sb;
    }
    return a < b;
  };
  for (int i = 1; i < ndims; ++i)
    for (int j = i; j > 0 && !outer_than(dims[j - 1], dims[j]); --j)
      std::swap(dims[j - 1], dims[j]);
  sp.size.clear();
  sp.red.clear();
  sp.stride.clear();
  for (int di = 0; di < ndims; ++di) {
    int d = dims[di];
    bool rd = mask >> d & 1;
    if (!sp.size.empty() && sp.red.back() == rd) {
      int64_t* prev = sp.stride.data() + sp.stride.size() - sp.nops;
      bool ok = true;
      for (int o = 0; o < sp.nops && ok; ++o) ok = prev[o] == stride_of(d, o) * sizes[d];
      if (ok) {
        sp.size.back() *= sizes[d];
        for (int o = 0; o < sp.nops; ++o) prev[o] = stride_of(d, o);
        continue;
      }
    }
    sp.size.push_back(sizes[d]);
    sp.red.push_back(rd);
    for (int o = 0; o < sp.nops; ++o) sp.stride.push_back(stride_of(d, o));
  }
  // Reductions with an inner reduced dim need a non-reduced dim for positions; every space
  // needs at least one dim.
  bool mode_a = has_red && !sp.size.empty() && sp.red.back();
  bool any_nr = std::find(sp.red.begin(), sp.red.end(), 0) != sp.red.end();
  if (sp.size.empty() || (mode_a && !any_nr)) {
    sp.size.insert(sp.size.begin(), 1);
    sp.red.insert(sp.red.begin(), 0);
    sp.stride.insert(sp.stride.begin(), sp.nops, 0);
  }
  sp.nd = static_cast<int>(sp.size.size());
  if (mode_a)
    run_inner_reduction(k, plan, sp);
  else
    run_tiled(k, plan, sp, r_total);
}

}  // namespace openneuron::ir
