// A traced NKI kernel in executable form (DESIGN §8): the flat instruction program that
// openneuron/nki/_trace.py records by running a kernel body once per (shapes, dtypes, constants,
// grid), and the executor that runs it over raw buffers. Not a tracer and not torch glue
// (csrc/aten/nki_launch.cpp queues a run on a neuron stream); no torch includes.
//
// A program has slots (kernel inputs and outputs in HBM, then one arena holding every SBUF/PSUM
// tile and HBM scratch buffer at offsets the tracer assigned; tiles partition-major, partition q
// of every tile a fixed pitch after partition q - 1, so rows of different tiles never alias)
// and one instruction list per SPMD grid instance. Every operand is an affine access pattern:
// offset + one stride per iteration axis. Masks are affine predicates, so each row's active
// lanes are one interval.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace openneuron::nki {

constexpr int kMaxDims = 6;        // iteration axes of one instruction
constexpr int kMaxRegisters = 24;  // operands + steps of one elementwise instruction

// Storage types of tiles and HBM tensors (conversions in convert.h). Compute is always float32
// (PSUM is float32); float8_e4m3 is torch's float8_e4m3fn (no infinities).
#define OPENNEURON_NKI_DTYPES(X) \
  X(float32, 4)                  \
  X(bfloat16, 2)                 \
  X(float16, 2)                  \
  X(int32, 4)                    \
  X(uint8, 1)                    \
  X(int8, 1)                     \
  X(uint16, 2)                   \
  X(int16, 2)                    \
  X(uint32, 4)                   \
  X(float8_e4m3, 1)              \
  X(float8_e5m2, 1)

enum class DType : uint8_t {
#define OPENNEURON_NKI_DTYPE_ENUM(name, size) k_##name,
  OPENNEURON_NKI_DTYPES(OPENNEURON_NKI_DTYPE_ENUM)
#undef OPENNEURON_NKI_DTYPE_ENUM
      kCount
};
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);

// The scalar operations of elementwise instructions, with their arity: the one table the
// executor, the parser's checks and the Python tracer (through _C._nki_tables()) read.
// clang-format off
#define OPENNEURON_NKI_OPS(X)                                                                   \
  X(copy, 1) X(neg, 1) X(abs, 1) X(exp, 1) X(log, 1) X(sqrt, 1) X(rsqrt, 1) X(reciprocal, 1)   \
  X(tanh, 1) X(sigmoid, 1) X(relu, 1) X(gelu, 1) X(gelu_apprx_tanh, 1) X(silu, 1)             \
  X(softplus, 1) X(mish, 1) X(sin, 1) X(cos, 1) X(square, 1) X(sign, 1) X(erf, 1)             \
  X(floor, 1) X(ceil, 1) X(trunc, 1) X(logical_not, 1) X(tan, 1) X(arctan, 1)                \
  X(gelu_apprx_sigmoid, 1) X(gelu_dx, 1) X(gelu_apprx_sigmoid_dx, 1) X(silu_dx, 1)            \
  X(erf_dx, 1) X(invert, 1) X(launch_random, 1)                                              \
  X(add, 2) X(subtract, 2) X(multiply, 2) X(divide, 2) X(maximum, 2) X(minimum, 2)            \
  X(power, 2) X(mod, 2) X(equal, 2) X(not_equal, 2) X(less, 2) X(less_equal, 2)               \
  X(greater, 2) X(greater_equal, 2) X(logical_and, 2) X(logical_or, 2) X(logical_xor, 2)      \
  X(bitwise_and, 2) X(bitwise_or, 2) X(bitwise_xor, 2) X(left_shift, 2) X(right_shift, 2)     \
  X(abs_max, 2) X(abs_min, 2) X(select, 3) X(random, 3)
// clang-format on

enum class Op : uint8_t {
#define OPENNEURON_NKI_OP_ENUM(name, arity) k_##name,
  OPENNEURON_NKI_OPS(OPENNEURON_NKI_OP_ENUM)
#undef OPENNEURON_NKI_OP_ENUM
      kCount
};
int op_arity(Op op);
const char* op_name(Op op);

enum class Kind : uint8_t {
  kElementwise = 0,
  kMatmul = 1,
  kScan = 2,
  kGather = 3,
  kDynamicCopy = 4,
  kIndirect = 5,
  kNonzero = 6,
  kSync = 7,
  kBranch = 8,
  kScalar = 9
};

// An operand: a strided view of a slot, a constant, or an iota (offset + sum stride*index, as a
// float). Strides are in elements, one per iteration axis (0 = broadcast).
struct Operand {
  enum Type : uint8_t { kView = 0, kConst = 1, kIota = 2 };
  Type type = kConst;
  DType dtype = DType::k_float32;
  int32_t slot = 0;
  int64_t offset = 0;
  int64_t stride[kMaxDims] = {};
  float value = 0;
};

// A lane runs iff c + sum(coef[d] * index[d]) >= 0 (every predicate of an instruction).
struct Pred {
  int64_t c = 0;
  int64_t coef[kMaxDims] = {};
};

// Register r < n_src holds src[r]; step s writes register n_src + s.
struct Step {
  Op op;
  uint8_t a, b, c;
};

// Instr::br_cond (kBranch).
constexpr int32_t kBrAlways = 0;    // jump
constexpr int32_t kBrExitGe = 1;    // jump when src[0] >= src[1]; else dst = src[0]
constexpr int32_t kBrExitZero = 2;  // jump when src[0] == 0; else dst = src[0]
constexpr int32_t kBrStep = 3;      // dst += br_step; jump

constexpr int32_t kDynSkip = 1;          // Instr::dyn_mode
constexpr int32_t kDynScalarOffset = 2;  // Instr::dyn_mode

// kElementwise: dst = result register over extent[0..ndim), the last `nreduce` axes reduced
// with reduce_op (then times post_scale); acc_op (when set) combines the old dst value:
// dst = acc_op(dst, value). Lanes failing a predicate are neither read nor written.
// kMatmul: extent = {M, N, K}; dst[m, n] (+)= sum_k src[0][m, k] * src[1][n, k] (stationary,
// moving) in float32; strides are per (m, n, k).
// kScan (nisa.tensor_tensor_scan): extent = {P, F}; src = {data0, data1, initial} (initial one
// value per row: a constant or a view with free stride 0); steps = {op0 over registers 0 and 2,
// op1 over registers 3 and 1}, register 2 the carry: in each row's active lanes, in order,
// dst[p, f] = op1(op0(data0, carry), data1), and the carry becomes that value as stored in dst's
// dtype. kGather (nisa.local_gather): extent = {P, n_valid, n_elem}; src = {source, index}: for
// partition p of core c = p / 16 and j < n_valid, i = index[16 c + j % 16, j / 16] (the core's
// index block read column by column), dst[p, j, e] = source[p, i + e]. source strides: {partition,
// 0, element}; index strides: {partition, column, 0}. gather_src_free (elements of a source
// partition) and gather_index_cols (index columns) bound both reads. gather_own_row
// (nl.gather_flattened): each partition reads its own index row, i = index[p, j].
// kDynamicCopy (nisa.tensor_copy_dynamic_src / _dst): an elementwise copy (no steps: src[0] into
// dst, converted to dst's dtype) whose source (dyn_target 0) or destination (dyn_target 1) sits
// at an offset read when the instruction runs: v = src[1], one element of an integer tile (all
// strides 0). The operand as encoded is its position at v = dyn_min; it moves dyn_scale
// elements per unit of v - dyn_min. v outside [dyn_min, dyn_max] (the values that keep every
// access inside the tensor, worked out by the tracer) is an error naming the kernel line; the
// parser checks the operand at both ends, so no value in the range leaves its slot. dyn_mode:
// bit 0, a value out of range copies nothing instead (a DMA's oob_mode.skip); bit 1, the
// offset is an access pattern's scalar_offset (nisa.dma_copy), for the error's words.
// kIndirect (the DMA's indirect gather / scatter: nl.load / nl.store / nisa.dma_copy /
// nl.atomic_rmw / nisa.dma_transpose with a tile of row indices): an elementwise copy (no steps;
// with `accumulate`, dst = dst + src) whose source (ind_target 0, a gather) or destination
// (ind_target 1, a scatter) takes row p from the HBM row v = src[1] at row p: one integer per
// row of an index tile (index strides {partition, 0, ...}). The moving operand as encoded is
// row p at v = ind_min; it moves ind_scale elements per unit of v - ind_min. v outside
// [ind_min, ind_max] (the rows of the HBM tensor's indexed axis) is an error naming the kernel
// line or, with ind_skip (NKI's oob_mode.skip), row p is left alone. Rows run in order on one
// thread: a scatter's repeated index leaves the last such row's values (all of them added, in
// row order, with `accumulate`). A row no lane of which is active does not read its index.
// kNonzero (nisa.nonzero_with_count): extent = {P, T}; src = {data}. In each partition p that is
// a multiple of 16 (a GpSimd core's first), the free positions f of the nonzero elements of
// data[p, :] (a NaN is nonzero), in order, plus nz_offset, then nz_pad up to position T - 1,
// then their count at position T: dst has T + 1 elements along its free axis (the parser checks
// all of them). Other partitions of dst are left alone.
// kSync (nisa.core_barrier, nisa.sendrecv): a point every instance of the launch reaches before
// any goes past it (instances run phase by phase between these points, program_run). A
// sendrecv (sync_send >= 0) also copies, at that point, the src[0] view of instance
// sync_recv into this instance's dst, over extent = {P, F} (instance sync_recv names this one
// as its sync_send; the parser checks the pairing). A barrier (both -1) has no src; its dst is
// the data named, unused.
// kBranch (nl.dynamic_range, nl.fori_loop, nl.while_loop): extent = {1}; goes on at
// instruction br_target of the instance (its count: the end) when its condition (br_cond)
// holds, else at the next. Operands are one-element views read as integers (a float one
// truncated); dst, where it is a view (a constant otherwise), is an int32 register the branch
// writes exactly: a loop's counter (kBrStep) or the value the body reads (the exits, when they
// do not jump). The parser checks that no jump crosses a sync point and that each target starts
// a group of the schedule; a run stops with an error naming the line after kMaxBackJumps
// backward jumps (a loop whose condition never ends it: the hardware would hang).
// kScalar (nisa.scalar_load / scalar_store / scalar_alu, NkiScalar arithmetic): extent = {1};
// dst (an int32 view) = sc_op(a, b) in int32 arithmetic that wraps (two's complement), a and b
// being src[0] and src[1], each a one-element view read as an integer or a constant whose exact
// value is sc_const[i]. copy and neg read a only; divide truncates toward zero and mod is the
// remainder with a's sign (both an error naming the line when b is 0); the comparisons give 1
// or 0.
struct Instr {
  Kind kind = Kind::kElementwise;
  int ndim = 0;
  int64_t extent[kMaxDims] = {};
  int nreduce = 0;
  Op reduce_op = Op::k_add;
  bool accumulate = false;
  Op acc_op = Op::k_add;
  float post_scale = 1.0f;
  Operand dst;
  std::vector<Operand> src;
  std::vector<Step> steps;
  std::vector<Pred> preds;
  int32_t line = -1;              // index into Program::lines
  int64_t gather_src_free = 0;    // kGather only
  int64_t gather_index_cols = 0;  // kGather only
  bool gather_own_row = false;    // kGather only
  int32_t dyn_target = 0;         // kDynamicCopy only: 0 src[0] moves, 1 dst moves
  int64_t dyn_scale = 0;          // kDynamicCopy only
  int64_t dyn_min = 0, dyn_max = 0;
  int32_t dyn_mode = 0;    // kDynamicCopy only: kDynSkip | kDynScalarOffset
  int32_t ind_target = 0;  // kIndirect only: 0 src[0] moves (gather), 1 dst moves (scatter)
  bool ind_skip = false;   // kIndirect only: out-of-range rows skipped, not an error
  int64_t ind_scale = 0;   // kIndirect only
  int64_t ind_min = 0, ind_max = 0;
  int64_t nz_offset = 0;     // kNonzero only
  int64_t nz_pad = 0;        // kNonzero only
  int32_t sync_send = -1;    // kSync only: the instance this one's src goes to (-1: a barrier)
  int32_t sync_recv = -1;    // kSync only: the instance whose src this one's dst receives
  int32_t br_cond = 0;       // kBranch only: kBrAlways, kBrExitGe, kBrExitZero or kBrStep
  int32_t br_target = 0;     // kBranch only: the instruction it jumps to
  int64_t br_step = 0;       // kBranch only (kBrStep): the counter's step
  int32_t br_group = 0;      // kBranch in Program::rewritten: the schedule's group of br_target
  Op sc_op = Op::k_copy;     // kScalar only
  int64_t sc_const[2] = {};  // kScalar only: the value of a constant operand
  // Set by rewrite_instance. kMatmul: the instruction after it, an elementwise `acc += dst`
  // (NKI's `acc += nl.matmul(...)`), runs in its store (`absorbs_next`), and its own
  // destination is not written when no instruction reads it before it is overwritten
  // (`dst_dead`). absorbed: run in the matmul before it. dropped: a load or store whose
  // readers or producer now use its other end; not run.
  bool absorbs_next = false;
  bool dst_dead = false;
  bool absorbed = false;
  bool dropped = false;
  Operand acc_dst;  // kMatmul with absorbs_next: the accumulator (float32, unit free stride)
  // Set by program_parse for a [P, 1] elementwise instruction whose rows touch no memory
  // another of its rows touches: the same instruction as one row of P lanes (axes swapped), so
  // that a column costs one row's set-up, not P. Same lanes, same operations.
  std::vector<Instr> transposed;
};

// A run of consecutive elementwise instructions [begin, end) of one instance that the executor
// runs block of rows by block of rows (rows = axis 0 of each instruction): every instruction
// over rows [p, p + block_rows), then the next block; each thread one run of rows. program_parse
// forms a group only where no row of one instruction reads or writes memory that another row of
// any instruction in the group writes, so each element sees the same operations in the same
// order as instruction by instruction (results are bitwise the same); intermediate tiles then
// stay in cache (one pass over memory for a chain). blocked = false: one instruction, run whole.
struct Group {
  int32_t begin = 0;
  int32_t end = 0;
  bool blocked = false;
  int64_t rows = 0;        // the largest axis-0 extent of the group
  int64_t block_rows = 1;  // rows per block
  int64_t lanes = 0;       // lanes of all its instructions (saturated), for the parallel split
};

struct Program {
  std::string name;                           // the kernel's name, for errors
  std::vector<std::string> lines;             // "file:line" of each recorded call, for errors
  std::vector<int64_t> slot_bytes;            // size of every slot; the last one is the arena
  std::vector<std::vector<Instr>> instances;  // one instruction list per grid instance
  std::vector<std::vector<Instr>> rewritten;  // the same after rewrite_instance
  std::vector<std::vector<Group>> schedules;  // per instance: `rewritten` in groups
  bool has_sync = false;                      // some instance has a kSync: runs go phase by phase
  int64_t n_instrs = 0;
  // Whether some step draws from the launch's seed (launch_random): a launch then
  // takes its seed from the caller's generator (program_run with a seed).
  bool random = false;
  mutable std::atomic<uint64_t> launches{0};  // the seed of a run given none: one per run
};

// Parses the tracer's encoding (int64 words; floats as their float64 bit patterns) and checks
// every operand against its slot's size, so that no program can address memory outside its
// buffers. Throws std::invalid_argument naming the kernel and line.
Program* program_parse(const int64_t* code, size_t n_words, std::string name,
                       std::vector<std::string> lines);

// Runs every instance (in parallel when there are several) over slots[0..n_slots-1]; the arena
// slot may be null: the executor then uses a per-thread arena. Thread-safe for concurrent runs
// of the same program. Throws std::runtime_error naming the kernel line on failure.
void program_run(const Program& p, void* const* slots);
// The same with the seed that launch_random draws from (a generator's state).
void program_run(const Program& p, void* const* slots, uint64_t seed);

// (optional) The host's float32 GEMM for tile matmuls: row-major c[M x N] (row stride ldc) =
// a^T b (accumulate: c += a^T b) with a [K x M] (row stride lda) and b [K x N] (row stride
// ldb), rows unit-stride.
// Must not throw; may use the intra-op threads. The extension installs ATen's CPU BLAS at
// import; without one (torch-free builds, gtests) the built-in register-blocked kernel runs.
// Its summation order is the BLAS's, not the built-in kernel's (float32 either way). Set once
// at start-up, before work runs.
using GemmBackend = void (*)(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                             const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
void set_gemm_backend(GemmBackend gemm);

// Internals shared by program.cpp, run.cpp, rewrite.cpp, execute.cpp and matmul.cpp.

// The bytes one view operand touches: [lo, hi) over the whole iteration box, and [row_lo, row_hi)
// at row 0 of axis 0, each later row row_stride further, over `rows` rows.
struct Footprint {
  int32_t slot = 0;
  int64_t lo = 0, hi = 0, row_lo = 0, row_hi = 0, row_stride = 0, rows = 1;
};
// Only for views that passed the parser's bounds check, of a non-empty box.
Footprint footprint(const Operand& o, const Instr& in);

// Parse-time rewrites of one instance's instructions (rewrite.cpp), before scheduling: loads
// whose tile is only read as loaded are forwarded to their readers, stores to their producer,
// and a matmul absorbs the `acc += result` after it. `arena`: the arena's slot. Results are
// bitwise those of the instructions as written; a run over aliasing arguments uses
// Program::instances (as traced) instead.
void rewrite_instance(std::vector<Instr>& instrs, int32_t arena);

// `parallel`: the instruction may split over threads (false inside grid instances, which
// already run in parallel).
void run_elementwise(const Instr& in, char* const* slots, bool parallel, uint64_t seed);
// Rows [p0, p1) of axis 0 (clipped to the instruction's extent) of an instruction with at least
// two axes and at least one unreduced axis, on the calling thread.
void run_elementwise_rows(const Instr& in, char* const* slots, uint64_t seed, int64_t p0,
                          int64_t p1);
void run_matmul(const Instr& in, char* const* slots, bool parallel);
// gather_scan.cpp. Throw std::runtime_error naming the program's line for an index or offset out
// of range.
void run_scan(const Instr& in, char* const* slots);
void run_gather(const Instr& in, char* const* slots, const Program& p);
void run_dynamic_copy(const Instr& in, char* const* slots, const Program& p, bool parallel,
                      uint64_t seed);
void run_indirect(const Instr& in, char* const* slots, const Program& p, uint64_t seed);
void run_nonzero(const Instr& in, char* const* slots);
// sync.cpp. Sets Program::has_sync; without run-time loops, checks the rules of phased runs for
// every instance's k-th sync point (throws std::invalid_argument naming the kernel line).
void find_sync_points(Program& p);
// The sync points the instances reached together (at[g]: instance g's, nullptr where it
// ended): empty when they may proceed (all ended, or all at points that match: barrier for
// barrier, each sendrecv's peer naming it back over the same shape), else the error naming the
// line (on the hardware the launch would hang).
std::string sync_step_error(const Program& p, const std::vector<const Instr*>& at);
// Moves the data of those sync points; slots[g]: instance g's.
void run_sync(const std::vector<const Instr*>& at, const std::vector<std::vector<char*>>& slots);
// "file:line: in kernel 'name': " of an instruction, the start of an error naming it.
std::string kernel_where(const Program& p, const Instr& in);
// control.cpp. Checks every kBranch of every instance (targets in range, starting a group) and
// sets br_group (throws std::invalid_argument
// naming the kernel line).
void find_branches(Program& p);
// Whether branch `in` jumps (stepping a kBrLoop's counter), reading its operands in slots.
bool branch_taken(const Instr& in, char* const* slots);
// A run's backward jumps per instance before branch_taken's caller gives up (loop_guard).
constexpr int64_t kMaxBackJumps = int64_t{1} << 24;
// Throws std::runtime_error naming the loop's line once *count passes kMaxBackJumps.
void loop_guard(const Program& p, const Instr& in, int64_t* count);
// Runs a kScalar instruction (throws std::runtime_error naming the line on a division by zero).
void run_scalar(const Program& p, const Instr& in, char* const* slots);

}  // namespace openneuron::nki
