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
// every float32 bit pattern (notes/bandwidth.md) and in tests/python/test_fusion_math.py.
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

struct Cached {
  at::Tensor in, out;
  std::unique_ptr<at::TensorIterator> iter;
};

template <StubCall kCall>
void run_stub(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  thread_local std::unordered_map<int64_t, Cached> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    if (cache.size() > 256) cache.clear();
    Cached c;
    c.in = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    c.out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    c.iter = std::make_unique<at::TensorIterator>(
        at::TensorIteratorConfig().add_output(c.out).add_const_input(c.in).build());
    it = cache.emplace(n, std::move(c)).first;
  }
  at::TensorIterator& iter = *it->second.iter;
  iter.unsafe_replace_operand(0, y);
  iter.unsafe_replace_operand(1, const_cast<float*>(x));
  kCall(iter);
}

#ifndef OPENNEURON_DIRECT_VML
void tanh_call(at::TensorIteratorBase& i) { at::native::tanh_stub(c10::DeviceType::CPU, i); }
void exp_call(at::TensorIteratorBase& i) { at::native::exp_stub(c10::DeviceType::CPU, i); }
void log_call(at::TensorIteratorBase& i) { at::native::log_stub(c10::DeviceType::CPU, i); }
void cos_call(at::TensorIteratorBase& i) { at::native::cos_stub(c10::DeviceType::CPU, i); }
void erf_call(at::TensorIteratorBase& i) { at::native::erf_stub(c10::DeviceType::CPU, i); }
void sqrt_call(at::TensorIteratorBase& i) { at::native::sqrt_stub(c10::DeviceType::CPU, i); }
#endif
void rsqrt_call(at::TensorIteratorBase& i) { at::native::rsqrt_stub(c10::DeviceType::CPU, i); }
void reciprocal_call(at::TensorIteratorBase& i) {
  at::native::reciprocal_stub(c10::DeviceType::CPU, i);
}

const bool kInstalled = [] {
#ifdef OPENNEURON_DIRECT_VML
  ir::set_float_math(ir::Op::kTanh, &run_vml<&vmsTanh>);
  ir::set_float_math(ir::Op::kExp, &run_vml<&vmsExp>);
  ir::set_float_math(ir::Op::kLog, &run_vml<&vmsLn>);
  ir::set_float_math(ir::Op::kCos, &run_vml<&vmsCos>);
  ir::set_float_math(ir::Op::kErf, &run_vml<&vmsErf>);
  ir::set_float_math(ir::Op::kSqrt, &run_vml<&vmsSqrt>);
#else
  ir::set_float_math(ir::Op::kTanh, &run_stub<&tanh_call>);
  ir::set_float_math(ir::Op::kExp, &run_stub<&exp_call>);
  ir::set_float_math(ir::Op::kLog, &run_stub<&log_call>);
  ir::set_float_math(ir::Op::kCos, &run_stub<&cos_call>);
  ir::set_float_math(ir::Op::kErf, &run_stub<&erf_call>);
  ir::set_float_math(ir::Op::kSqrt, &run_stub<&sqrt_call>);
#endif
  ir::set_float_math(ir::Op::kRsqrt, &run_stub<&rsqrt_call>);
  ir::set_float_math(ir::Op::kReciprocal, &run_stub<&reciprocal_call>);
  return true;
}();

}  // namespace
}  // namespace openneuron::aten::fusion
