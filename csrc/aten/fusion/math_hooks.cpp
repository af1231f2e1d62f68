// The IR's float math hooks for adaptive eager: each runs ATen's own CPU kernel (the DispatchStub
// eager uses: MKL VML or SLEEF, whichever this build picked) over the interpreter's chunk, so a
// fused tanh/exp/... is bitwise what eager computes. Eager's results for these ops do not depend
// on an element's position or the tensor's layout (vectorized tails), which is what makes a
// chunk-wise call exact (verified in tests/python/test_fusion.py). Not the op table
// (aten_ops.cpp) nor the recorder.
// tanh/exp/log/cos/erf/sqrt call MKL VML directly: for contiguous float32 ATen's CPU kernel
// (UnaryOpsKernel.cpp, IMPLEMENT_*_KERNEL -> at::vml::v<op>, ATen/cpu/vml.h) is exactly
// vms<Op>(n, in, out, VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE) on this MKL-enabled build, so
// calling it on a chunk gives eager's bits without the TensorIterator/DispatchStub overhead
// (which cost more than the math on 1024-element chunks). Checked against torch's CPU ops on
// every float32 bit pattern in tests/python/test_fusion_math.py.
// bf16/fp16 values run ATen's kernel for that dtype (run_stub_as): eager never uses VML there.
// NOTE: rsqrt/reciprocal (not MKL in ATen) and builds without MKL keep the stub path: a
// TensorIterator per chunk length is built once per thread and re-pointed at each chunk
// (unsafe_replace_operand), so a call costs the kernel plus a few hundred nanoseconds.
// NOTE: DispatchStub's layout and entry points depend on the CPU capabilities the torch build
// had (x86-64 wheels: AVX512 and AVX2); declare them so the stubs link against libtorch_cpu.
#if defined(__x86_64__) && !defined(HAVE_AVX512_CPU_DEFINITION)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#include <ATen/Config.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/UnaryOps.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "ir/execute.h"

#if AT_MKL_ENABLED() && defined(__x86_64__) && !defined(__APPLE__)
#define OPENNEURON_DIRECT_VML 1
// MKL's VML entry points (LP64: MKL_INT is int; the mode is MKL_INT64), exported by
// libtorch_cpu. torch ships no MKL headers, so declare the few we call.
extern "C" {
void vmsTanh(int n, const float* a, float* r, long long mode);
void vmsExp(int n, const float* a, float* r, long long mode);
void vmsLn(int n, const float* a, float* r, long long mode);
void vmsCos(int n, const float* a, float* r, long long mode);
void vmsErf(int n, const float* a, float* r, long long mode);
void vmsSqrt(int n, const float* a, float* r, long long mode);
}
#endif

namespace openneuron::aten::fusion {
namespace {

#ifdef OPENNEURON_DIRECT_VML
// VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE: the mode ATen's vml.h passes.
constexpr long long kVmlMode = 0x2 | 0x00140000 | 0x00000100;
using VmlFn = void (*)(int, const float*, float*, long long);

template <VmlFn kFn>
void run_vml(const float* x, float* y, int64_t n) {
  if (n > 0) kFn(static_cast<int>(n), x, y, kVmlMode);  // n <= ir::kChunkElems
}
#endif

using StubCall = void (*)(at::TensorIteratorBase&);

// A TensorIterator over one chunk length of dtype S, built once per thread and re-pointed at
// each chunk (unsafe_replace_operand).
template <class S>
struct Cached {
  at::Tensor in, out;
  std::unique_ptr<at::TensorIterator> iter;
};

template <class S>
at::TensorIterator& chunk_iter(int64_t n) {
  thread_local std::unordered_map<int64_t, Cached<S>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    if (cache.size() > 256) cache.clear();
    Cached<S> c;
    const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<S>::value);
    c.in = at::empty({n}, opts);
    c.out = at::empty({n}, opts);
    c.iter = std::make_unique<at::TensorIterator>(
        at::TensorIteratorConfig().add_output(c.out).add_const_input(c.in).build());
    it = cache.emplace(n, std::move(c)).first;
  }
  return *it->second.iter;
}

template <StubCall kCall>
void run_stub(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  at::TensorIterator& iter = chunk_iter<float>(n);
  iter.unsafe_replace_operand(0, y);
  iter.unsafe_replace_operand(1, const_cast<float*>(x));
  kCall(iter);
}

// bf16/fp16 values: eager runs the op's kernel for that dtype (ATen's Vectorized<Half> /
// <BFloat16> math, never MKL VML, whose float32 results differ between CPU vendors and MKL code
// paths: VML's sqrt is not correctly rounded on some), so run exactly that kernel on the chunk.
// The chunk's floats are exactly representable in S, so both conversions are exact.
template <class S, StubCall kCall>
void run_stub_as(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  thread_local std::vector<S> in, out;
  if (static_cast<int64_t>(in.size()) < n) {
    in.resize(static_cast<size_t>(n));
    out.resize(static_cast<size_t>(n));
  }
  for (int64_t i = 0; i < n; ++i) in[i] = static_cast<S>(x[i]);
  at::TensorIterator& iter = chunk_iter<S>(n);
  iter.unsafe_replace_operand(0, out.data());
  iter.unsafe_replace_operand(1, in.data());
  kCall(iter);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(out[i]);
}

void tanh_call(at::TensorIteratorBase& i) { at::native::tanh_stub(c10::DeviceType::CPU, i); }
void exp_call(at::TensorIteratorBase& i) { at::native::exp_stub(c10::DeviceType::CPU, i); }
void log_call(at::TensorIteratorBase& i) { at::native::log_stub(c10::DeviceType::CPU, i); }
void cos_call(at::TensorIteratorBase& i) { at::native::cos_stub(c10::DeviceType::CPU, i); }
void erf_call(at::TensorIteratorBase& i) { at::native::erf_stub(c10::DeviceType::CPU, i); }
void sqrt_call(at::TensorIteratorBase& i) { at::native::sqrt_stub(c10::DeviceType::CPU, i); }
void rsqrt_call(at::TensorIteratorBase& i) { at::native::rsqrt_stub(c10::DeviceType::CPU, i); }
void reciprocal_call(at::TensorIteratorBase& i) {
  at::native::reciprocal_stub(c10::DeviceType::CPU, i);
}

template <StubCall kCall>
void install(ir::Op op, ir::VecMathFn f32) {
  ir::set_float_math(op, f32);
  ir::set_float_math(op, &run_stub_as<c10::BFloat16, kCall>, ir::DType::kBFloat16);
  ir::set_float_math(op, &run_stub_as<c10::Half, kCall>, ir::DType::kFloat16);
}

// The float32 implementation: MKL VML where ATen's kernel calls it, else ATen's kernel itself.
#ifdef OPENNEURON_DIRECT_VML
#define OPENNEURON_F32_MATH(vml, call) (&run_vml<&vml>)
#else
#define OPENNEURON_F32_MATH(vml, call) (&run_stub<&call>)
#endif

// One row per hooked op: the IR op, ATen's kernel (bf16/fp16, and float32 without VML), and the
// float32 path.
const bool kInstalled = [] {
  install<&tanh_call>(ir::Op::kTanh, OPENNEURON_F32_MATH(vmsTanh, tanh_call));
  install<&exp_call>(ir::Op::kExp, OPENNEURON_F32_MATH(vmsExp, exp_call));
  install<&log_call>(ir::Op::kLog, OPENNEURON_F32_MATH(vmsLn, log_call));
  install<&cos_call>(ir::Op::kCos, OPENNEURON_F32_MATH(vmsCos, cos_call));
  install<&erf_call>(ir::Op::kErf, OPENNEURON_F32_MATH(vmsErf, erf_call));
  install<&sqrt_call>(ir::Op::kSqrt, OPENNEURON_F32_MATH(vmsSqrt, sqrt_call));
  install<&rsqrt_call>(ir::Op::kRsqrt, &run_stub<&rsqrt_call>);  // not MKL in ATen
  install<&reciprocal_call>(ir::Op::kReciprocal, &run_stub<&reciprocal_call>);
  return true;
}();
#undef OPENNEURON_F32_MATH

}  // namespace
}  // namespace openneuron::aten::fusion
