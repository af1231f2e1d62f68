// Running a parsed NKI program (program_run): per-thread arenas, the schedule's groups of one
// instance (following its branches), grid instances in parallel, and the phased run of a program
// with sync points. The per-instruction loops are in execute.cpp and matmul.cpp.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "nki/program.h"
#include "runtime/parallel.h"

namespace openneuron::nki {
namespace {

// One arena per thread, reused across runs (a fresh 24 MiB allocation per launch would fault in
// every page again).
// NOTE: a tile's rows lie a partition pitch apart (several KiB), so one tile operand touches a
// page per row with 4 KiB pages; the arena asks for 2 MiB pages, where the kernel gives them.
constexpr size_t kHugePage = size_t{2} << 20;

struct Arena {
  char* p = nullptr;
  int64_t size = 0;
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept : p(o.p), size(o.size) { o.p = nullptr; }
  ~Arena() { std::free(p); }
  char* get(int64_t bytes) {
    if (size < bytes) {
      std::free(p);
      p = nullptr;
      size = 0;
      const size_t rounded = (static_cast<size_t>(bytes) + kHugePage - 1) & ~(kHugePage - 1);
      p = static_cast<char*>(std::aligned_alloc(kHugePage, rounded));
      if (p == nullptr) throw std::bad_alloc();
      madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
      size = static_cast<int64_t>(rounded);
    }
    return p;
  }
};

char* thread_arena(int64_t bytes) {
  thread_local Arena arena;
  return arena.get(bytes);
}

// The schedule assumes distinct slots are distinct memory; a caller may pass one tensor as two
// arguments (or overlapping views). A null slot (the executor's own arena) overlaps nothing.
bool slots_overlap(const Program& p, void* const* slots) {
  const size_t n = p.slot_bytes.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const auto a = reinterpret_cast<uintptr_t>(slots[i]);
      const auto b = reinterpret_cast<uintptr_t>(slots[j]);
      if (a == 0 || b == 0 || p.slot_bytes[i] == 0 || p.slot_bytes[j] == 0) continue;
      if (a < b + static_cast<uintptr_t>(p.slot_bytes[j]) &&
          b < a + static_cast<uintptr_t>(p.slot_bytes[i]))
        return true;
    }
  return false;
}

void run_one(const Program& p, const Instr& in, char* const* slots, bool parallel, uint64_t seed) {
  switch (in.kind) {
    case Kind::kMatmul:
      run_matmul(in, slots, parallel);
      break;
    case Kind::kScan:
      run_scan(in, slots);
      break;
    case Kind::kGather:
      run_gather(in, slots, p);
      break;
    case Kind::kDynamicCopy:
      run_dynamic_copy(in, slots, p, parallel, seed);
      break;
    case Kind::kIndirect:
      run_indirect(in, slots, p, seed);
      break;
    case Kind::kNonzero:
      run_nonzero(in, slots);
      break;
    case Kind::kScalar:
      run_scalar(p, in, slots);
      break;
    case Kind::kSync:    // a phase boundary: run_phased moves its data
    case Kind::kBranch:  // follow() takes it
      break;
    default:
      run_elementwise(in, slots, parallel, seed);
  }
}

void run_group(const Program& p, const std::vector<Instr>& instrs, const Group& g,
               char* const* slots, bool parallel, uint64_t seed) {
  if (!g.blocked) {
    run_one(p, instrs[static_cast<size_t>(g.begin)], slots, parallel, seed);
    return;
  }
  // Each thread takes one run of rows and goes through it block by block.
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t p0 = r0; p0 < r1; p0 += g.block_rows) {
      const int64_t p1 = std::min(r1, p0 + g.block_rows);
      for (int32_t i = g.begin; i < g.end; ++i) {
        const Instr& in = instrs[static_cast<size_t>(i)];
        if (!in.dropped) run_elementwise_rows(in, slots, seed, p0, p1);
      }
    }
  };
  // NOTE: a parallel region costs a few microseconds: worth it from ~32 K lanes of work.
  constexpr int64_t kParallelLanes = int64_t{1} << 15;
  if (parallel && g.rows > 1 && g.lanes >= kParallelLanes)
    runtime::parallel_for(0, g.rows, 1, rows);
  else
    rows(0, g.rows);
}

// Positions [k, n) of an instance, following its branches, up to its next sync point (returns
// its position; a phased run moves its data) or the end (returns n). first(k): the instruction
// a position starts with; run(k) runs the position; target(b): where branch b jumps. *back
// counts the backward jumps of the whole run (loop_guard).
template <class First, class Run, class Target>
size_t follow(const Program& p, size_t k, size_t n, char* const* slots, int64_t* back, First first,
              Run run, Target target) {
  while (k < n) {
    const Instr& in = first(k);
    if (in.kind == Kind::kSync) return k;
    if (in.kind != Kind::kBranch) {
      run(k);
      ++k;
    } else if (!branch_taken(in, slots)) {
      ++k;
    } else {
      const size_t to = target(in);
      if (to <= k) loop_guard(p, in, back);
      k = to;
    }
  }
  return k;
}

// Instance g from position `at` to its next sync point or its end, returning where it stopped:
// its schedule's groups, or (in_order, aliasing slots) its instructions as written.
size_t run_phase(const Program& p, size_t g, size_t at, char* const* slots, bool parallel,
                 bool in_order, uint64_t seed, int64_t* back) {
  if (in_order) {
    const std::vector<Instr>& instrs = p.instances[g];
    return follow(
        p, at, instrs.size(), slots, back, [&](size_t i) -> const Instr& { return instrs[i]; },
        [&](size_t i) { run_one(p, instrs[i], slots, parallel, seed); },
        [](const Instr& b) { return static_cast<size_t>(b.br_target); });
  }
  const std::vector<Instr>& instrs = p.rewritten[g];
  const std::vector<Group>& groups = p.schedules[g];
  return follow(
      p, at, groups.size(), slots, back,
      [&](size_t k) -> const Instr& { return instrs[static_cast<size_t>(groups[k].begin)]; },
      [&](size_t k) { run_group(p, instrs, groups[k], slots, parallel, seed); },
      [](const Instr& b) { return static_cast<size_t>(b.br_group); });
}

// A program with core barriers or sendrecvs: instances run phase by phase (all of them up to
// their next sync point, in parallel; then the sync points they reached are checked against
// each other (sync_step_error) and their data moved), each with an arena of its own that lives
// across the phases (per calling thread; the first kKeptArenas reused across runs, the rest
// freed when the run ends). With run-time loops, the points each instance reaches are known
// only as it runs.
constexpr size_t kKeptArenas = 4;

void run_phased(const Program& p, void* const* slots, bool in_order, uint64_t seed) {
  const size_t n = p.instances.size();
  const size_t n_slots = p.slot_bytes.size();
  thread_local std::vector<Arena> arenas;
  if (arenas.size() < n) arenas.resize(n);
  struct Trim {
    std::vector<Arena>& a;
    ~Trim() {
      if (a.size() > kKeptArenas) a.resize(kKeptArenas);
    }
  } trim{arenas};
  std::vector<std::vector<char*>> local(n);
  for (size_t g = 0; g < n; ++g) {
    for (size_t i = 0; i < n_slots; ++i) local[g].push_back(static_cast<char*>(slots[i]));
    if (n > 1 || local[g][n_slots - 1] == nullptr)
      local[g][n_slots - 1] = arenas[g].get(p.slot_bytes.back());
  }
  std::vector<size_t> pos(n, 0);
  std::vector<int64_t> back(n, 0);
  std::vector<const Instr*> reached(n);
  for (;;) {
    if (n == 1) {
      pos[0] = run_phase(p, 0, pos[0], local[0].data(), true, in_order, seed, &back[0]);
    } else {
      std::atomic<bool> failed{false};
      std::string error;
      std::atomic_flag error_taken = ATOMIC_FLAG_INIT;
      runtime::parallel_for(0, static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) {
        for (int64_t g = b; g < e && !failed.load(std::memory_order_relaxed); ++g) {
          const auto i = static_cast<size_t>(g);
          try {
            pos[i] = run_phase(p, i, pos[i], local[i].data(), false, in_order, seed, &back[i]);
          } catch (const std::exception& ex) {
            if (!error_taken.test_and_set()) error = ex.what();
            failed.store(true);
          }
        }
      });
      if (failed.load()) throw std::runtime_error(error);
    }
    for (size_t g = 0; g < n; ++g) {
      const std::vector<Instr>& instrs = in_order ? p.instances[g] : p.rewritten[g];
      const size_t end = in_order ? instrs.size() : p.schedules[g].size();
      reached[g] = pos[g] == end ? nullptr
                   : in_order    ? &instrs[pos[g]]
                                 : &instrs[static_cast<size_t>(p.schedules[g][pos[g]].begin)];
    }
    const std::string error = sync_step_error(p, reached);
    if (!error.empty()) throw std::runtime_error(error);
    if (reached[0] == nullptr) return;  // all at their end
    run_sync(reached, local);
    for (size_t& at : pos) ++at;
  }
}

// in_order: instruction by instruction, as written (aliasing slots).
void run_instance(const Program& p, size_t instance, void* const* slots, bool parallel,
                  bool in_order, uint64_t seed) {
  const size_t n_slots = p.slot_bytes.size();
  char* local[64];
  for (size_t i = 0; i < n_slots; ++i) local[i] = static_cast<char*>(slots[i]);
  if (local[n_slots - 1] == nullptr) local[n_slots - 1] = thread_arena(p.slot_bytes.back());
  int64_t back = 0;
  run_phase(p, instance, 0, local, parallel, in_order, seed, &back);
}

}  // namespace

void program_run(const Program& p, void* const* slots) {
  program_run(p, slots, p.launches.fetch_add(1, std::memory_order_relaxed));
}

void program_run(const Program& p, void* const* slots, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(p.instances.size());
  const bool in_order = slots_overlap(p, slots);
  if (p.has_sync) {
    run_phased(p, slots, in_order, seed);
    return;
  }
  if (n == 1) {
    run_instance(p, 0, slots, /*parallel=*/true, in_order, seed);
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
    for (int64_t g = 0; g < n; ++g)
      run_instance(p, static_cast<size_t>(g), slots, true, in_order, seed);
    return;
  }
  runtime::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e && !failed.load(std::memory_order_relaxed); ++g) {
      try {
        run_instance(p, static_cast<size_t>(g), shared.data(), false, in_order, seed);
      } catch (const std::exception& ex) {
        if (!error_taken.test_and_set()) error = ex.what();
        failed.store(true);
      }
    }
  });
  if (failed.load()) throw std::runtime_error(error);
}

}  // namespace openneuron::nki
