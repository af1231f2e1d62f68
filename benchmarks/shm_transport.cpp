// Throughput of the shared-memory collectives transport (csrc/collectives) alone: all_reduce,
// all_gather and reduce_scatter of float32 between 2 ranks that are separate processes (forked,
// as torchrun's ranks are), 64 KiB to 256 MiB, against memcpy of the same bytes on one core.
// Bus bandwidth as NCCL defines it (all_reduce moves 2(n-1)/n of the message per rank, the
// others (n-1)/n). Not a test: prints numbers only (`make bench-shm` builds and runs it).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/shm_comm.h"

namespace openneuron::collectives {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int iterations(size_t bytes) {
  return static_cast<int>(
      std::clamp<size_t>((size_t{2} << 30) / std::max<size_t>(bytes, 1), 3, 500));
}

// One rank: every size and op, timed; rank 0 prints. Returns the exit status.
int run_rank(const std::string& name, int rank, int size, const std::vector<size_t>& sizes) {
  Options opts;
  opts.group_name = "bench";
  std::unique_ptr<ShmComm> comm;
  try {
    comm = ShmComm::join(name, rank, size, opts);
  } catch (const CommError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const size_t max_bytes = sizes.back();
  std::vector<float> a(max_bytes / 4 * size, 1.0f), b(max_bytes / 4 * size, 0.0f);
  for (size_t bytes : sizes) {
    const size_t n = bytes / 4;
    const int iters = iterations(bytes);
    struct Op {
      const char* name;
      double factor;
    };
    const Op ops[] = {{"all_reduce", 2.0 * (size - 1) / size},
                      {"all_gather", 1.0 * (size - 1) / size},
                      {"reduce_scatter", 1.0 * (size - 1) / size}};
    for (const Op& op : ops) {
      auto call = [&] {
        if (std::strcmp(op.name, "all_reduce") == 0)
          comm->all_reduce(a.data(), a.data(), n, DType::kFloat32, ReduceOp::kSum);
        else if (std::strcmp(op.name, "all_gather") == 0)
          comm->all_gather(a.data(), b.data(), bytes);  // bytes per rank, output size x
        else
          comm->reduce_scatter(a.data(), b.data(), n / size, DType::kFloat32, ReduceOp::kSum);
      };
      call();
      comm->barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) call();
      comm->barrier();
      const double s = seconds_since(t0) / iters;
      // all_gather moves size x bytes in all; the others `bytes`
      const double moved = std::strcmp(op.name, "all_gather") == 0 ? bytes * size : bytes;
      if (rank == 0)
        std::printf("%-15s %9zu KiB %10.1f us %8.2f GB/s\n", op.name, bytes >> 10, s * 1e6,
                    moved * op.factor / s / 1e9);
    }
  }
  return 0;
}

double memcpy_gbps(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int iters = iterations(bytes);
  std::memcpy(dst.data(), src.data(), bytes);
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) std::memcpy(dst.data(), src.data(), bytes);
  return bytes * static_cast<double>(iters) / seconds_since(t0) / 1e9;
}

}  // namespace
}  // namespace openneuron::collectives

int main(int argc, char** argv) {
  using namespace openneuron::collectives;
  const int size = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::vector<size_t> sizes = {64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
  for (size_t b : {size_t{1} << 20, size_t{64} << 20})
    std::printf("memcpy %zu KiB on one core: %.2f GB/s\n", b >> 10, memcpy_gbps(b));
  std::printf("%d ranks (processes), float32 SUM; bus bandwidth as NCCL's\n", size);
  const std::string name = "/openneuron-bench-" + std::to_string(getpid());
  std::vector<pid_t> pids;
  for (int r = 1; r < size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(run_rank(name, r, size, sizes));
    pids.push_back(pid);
  }
  int status = run_rank(name, 0, size, sizes);
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
  }
  return status;
}
