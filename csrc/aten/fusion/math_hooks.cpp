// The IR's float math hooks for adaptive eager: each runs ATen's own CPU kernel (the DispatchStub
// eager uses: MKL VML or SLEEF, whichever this build picked) over the interpreter's chunk, so a
// fused tanh/exp/... is bitwise what eager computes. Eager's results for these ops do not depend
// on an element's position or the tensor's layout (vectorized tails), which is what makes a
// chunk-wise call exact (verified in tests/python/test_fusion.py). Not the op table
// (aten_ops.cpp) nor the recorder.
// NOTE: a TensorIterator per chunk length is built once per thread and re-pointed at each chunk
// (unsafe_replace_operand), so a call costs the kernel plus a few hundred nanoseconds.
// NOTE: DispatchStub's layout and entry points depend on the CPU capabilities the torch build
// had (x86-64 wheels: AVX512 and AVX2); declare them so the stubs link against libtorch_cpu.
#if defined(__x86_64__) && !defined(HAVE_AVX512_CPU_DEFINITION)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#include <ATen/TensorIterator.h>
#include <ATen/native/UnaryOps.h>

#include <memory>
#include <unordered_map>

#include "ir/execute.h"

namespace openneuron::aten::fusion {
namespace {

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

const bool kInstalled = [] {
  ir::set_float_math(ir::Op::kTanh, &run_stub<&tanh_call>);
  ir::set_float_math(ir::Op::kExp, &run_stub<&exp_call>);
  ir::set_float_math(ir::Op::kLog, &run_stub<&log_call>);
  ir::set_float_math(ir::Op::kCos, &run_stub<&cos_call>);
  ir::set_float_math(ir::Op::kErf, &run_stub<&erf_call>);
  ir::set_float_math(ir::Op::kSqrt, &run_stub<&sqrt_call>);
  ir::set_float_math(ir::Op::kRsqrt, &run_stub<&rsqrt_call>);
  ir::set_float_math(ir::Op::kReciprocal, &run_stub<&reciprocal_call>);
  return true;
}();

}  // namespace
}  // namespace openneuron::aten::fusion
