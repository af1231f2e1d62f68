// Throughput of the kernel IR interpreter (csrc/ir) on a tanh-GELU chain of 8 ops over 4M
// float32, against memcpy of the same bytes: with std::tanh, with a vector tanh math hook, and
// with tanh replaced by abs (the interpreter's own cost). One thread and two. Not a test: prints
// numbers only (`make bench-ir` builds and runs it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "ir/execute.h"
#include "ir/kernel.h"
#include "runtime/parallel.h"

namespace openneuron::ir {
namespace {

// A vectorizable tanh stand-in for SLEEF (the ATen glue installs the real one): a rational
// approximation, accurate to a few ulp in [-9, 9], clamped outside, compiled for AVX-512 like
// SLEEF's vector functions.
// NOTE: no ifunc clones under sanitizers: the resolver runs before their runtime is up.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
__attribute__((optimize("O3")))
#else
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#endif
void fast_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = std::min(9.f, std::max(-9.f, x[i]));
    float v2 = v * v;
    float p = v * (135135.f + v2 * (17325.f + v2 * (378.f + v2)));
    float q = 135135.f + v2 * (62370.f + v2 * (3150.f + v2 * 28.f));
    y[i] = std::min(1.f, std::max(-1.f, p / q));
  }
}

double gbps(double bytes, double secs) { return bytes / secs / 1e9; }

template <class F>
double best_seconds(F f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

void gelu_tanh_chain_vs_memcpy() {
  // gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): 8 ops + tanh.
  KernelBuilder b;
  int xi = b.add_input(DType::kFloat32);
  auto c = [&](double v) { return b.constant(v, DType::kFloat32); };
  ValueId x = b.load(xi);
  ValueId x3 = b.binary(Op::kMul, b.binary(Op::kMul, x, x), x);
  ValueId inner = b.binary(Op::kAdd, x, b.binary(Op::kMul, c(0.044715), x3));
  ValueId t = b.unary(Op::kTanh, b.binary(Op::kMul, c(0.7978845608028654), inner));
  ValueId y = b.binary(Op::kMul, b.binary(Op::kMul, c(0.5), x), b.binary(Op::kAdd, c(1.0), t));
  b.store(b.add_output(DType::kFloat32), y);
  auto k = b.build();
  // The same chain with tanh replaced by abs: the interpreter's own cost, no transcendental.
  KernelBuilder a;
  xi = a.add_input(DType::kFloat32);
  auto ca = [&](double v) { return a.constant(v, DType::kFloat32); };
  x = a.load(xi);
  x3 = a.binary(Op::kMul, a.binary(Op::kMul, x, x), x);
  inner = a.binary(Op::kAdd, x, a.binary(Op::kMul, ca(0.044715), x3));
  t = a.unary(Op::kAbs, a.binary(Op::kMul, ca(0.7978845608028654), inner));
  y = a.binary(Op::kMul, a.binary(Op::kMul, ca(0.5), x), a.binary(Op::kAdd, ca(1.0), t));
  a.store(a.add_output(DType::kFloat32), y);
  auto ka = a.build();
  const int64_t n = 4 << 20;
  std::vector<float> in(n), out(n), dst(n);
  for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 2001) - 1000) / 250.f;
  int64_t st = 1;
  Operand ins[1] = {{in.data(), &st}};
  Operand outs[1] = {{out.data(), &st}};
  double bytes = 2.0 * n * sizeof(float);
  auto run_suite = [&](const char* label) {
    double t_memcpy = best_seconds([&] { std::memcpy(dst.data(), in.data(), n * 4); }, 10);
    set_float_math(Op::kTanh, nullptr);
    double t_std = best_seconds([&] { execute(*k, &n, 1, ins, outs); }, 5);
    set_float_math(Op::kTanh, fast_tanh);
    double t_fast = best_seconds([&] { execute(*k, &n, 1, ins, outs); }, 10);
    set_float_math(Op::kTanh, nullptr);
    double t_arith = best_seconds([&] { execute(*ka, &n, 1, ins, outs); }, 10);
    std::printf(
        "[%s] memcpy %.2f GB/s | gelu, std::tanh: %.2f GB/s (%.0f%%) | gelu, vector tanh "
        "hook: %.2f GB/s (%.0f%%) | same chain, tanh->abs: %.2f GB/s (%.0f%% of memcpy)\n",
        label, gbps(bytes, t_memcpy), gbps(bytes, t_std), 100 * t_memcpy / t_std,
        gbps(bytes, t_fast), 100 * t_memcpy / t_fast, gbps(bytes, t_arith),
        100 * t_memcpy / t_arith);
  };
  runtime::set_parallel_backend(nullptr);
  run_suite("1 thread");
  runtime::set_parallel_backend(
      [](int64_t begin, int64_t end, int64_t, runtime::ParallelBody body, void* ctx) {
        int64_t mid = begin + (end - begin) / 2;
        std::thread th([&] { body(ctx, begin, mid); });
        body(ctx, mid, end);
        th.join();
      });
  run_suite("2 threads");
  runtime::set_parallel_backend(nullptr);
}

}  // namespace
}  // namespace openneuron::ir

int main() {
  openneuron::ir::gelu_tanh_chain_vs_memcpy();
  return 0;
}
