// Scaled dot-product attention on the neuron device with the native kernel of
// csrc/kernels/attention.h. torch's SDPA asks the device which backend to use
// (_fused_sdp_choice, registered here both as a dispatch stub and an op): "overrideable" when
// the kernel covers the call (4-d float32/bf16/fp16 q/k/v, dropout_p == 0, equal head counts,
// a mask that does not require grad), else "math" (the composite path, e.g. for dropout or
// GQA). The overrideable op and its backward (autograd from derivatives.yaml) run the kernel in
// one work item each.
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cmath>
#include <string>

#include "aten/ops/native_kernels.h"
#include "kernels/attention.h"

namespace openneuron::aten {
namespace {

using SdpaResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
                              c10::SymInt, at::Tensor, at::Tensor, at::Tensor>;

bool float_kind(const at::Tensor& t) { return kernel_dtype(t.scalar_type()).has_value(); }

// a == b, without a guard when the sizes are symbolic (torch.compile with dynamic shapes: a
// guard here would specialize the sequence length); false when not known without one.
bool same_size(const c10::SymInt& a, const c10::SymInt& b) {
  return a.sym_eq(b).guard_or_false(__FILE__, __LINE__);
}

// Whether the user's SDPA backend switches allow neuron's fused kernel. It is the device's
// flash and memory-efficient attention both (the overrideable backend to ATen): a CUDA script's
// `sdpa_kernel(SDPBackend.FLASH_ATTENTION)` keeps it, `sdpa_kernel(SDPBackend.MATH)` (or the
// deprecated sdp_kernel with flash and memory-efficient off) runs the math path.
bool fused_backend_enabled() {
  const at::Context& ctx = at::globalContext();
  return ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
         ctx.userEnabledMemEfficientSDP();
}

// Whether the native kernel covers this SDPA call (else the math path runs it).
bool sdpa_supported(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const std::optional<at::Tensor>& mask, double dropout_p) {
  if (!native_kernels_enabled() || !fused_backend_enabled()) return false;
  if (dropout_p != 0.0) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (!kernel_operand(*t) || t->dim() != 4 || t->is_nested() || t->device() != q.device())
      return false;
    if (t->scalar_type() != q.scalar_type()) return false;
  }
  if (!same_size(k.sym_size(0), q.sym_size(0)) || !same_size(v.sym_size(0), q.sym_size(0)) ||
      !same_size(k.sym_size(1), q.sym_size(1)) || !same_size(v.sym_size(1), q.sym_size(1)) ||
      !same_size(k.sym_size(2), v.sym_size(2)) || !same_size(k.sym_size(3), q.sym_size(3)))
    return false;
  if (mask && mask->defined()) {
    const at::Tensor& m = *mask;
    if (!on_neuron(m) || m.device() != q.device() || m.dim() > 4 || m.is_nested()) return false;
    if (m.scalar_type() != c10::ScalarType::Bool && !float_kind(m)) return false;
    if (m.requires_grad() && at::GradMode::is_enabled()) return false;
    // Broadcastable to [B, H, L, S].
    const c10::SymInt target[4] = {q.sym_size(0), q.sym_size(1), q.sym_size(2), k.sym_size(2)};
    for (int64_t i = 0; i < m.dim(); ++i) {
      const c10::SymInt s = m.sym_size(m.dim() - 1 - i);
      if (!same_size(s, 1) && !same_size(s, target[3 - i])) return false;
    }
  }
  return true;
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  return static_cast<int64_t>(sdpa_supported(q, k, v, mask, dropout_p)
                                  ? at::SDPBackend::overrideable
                                  : at::SDPBackend::math);
}

// An additive float mask from SDPA's attn_bias (a bool mask becomes 0 / -inf), or undefined.
at::Tensor additive_mask(const at::Tensor& bias, const at::Tensor& q) {
  if (!bias.defined()) return bias;
  TORCH_CHECK(on_neuron(bias) && bias.device() == q.device(),
              "scaled_dot_product_attention (neuron): attn_mask must be on ", q.device(), ", got ",
              bias.device());
  if (bias.scalar_type() == c10::ScalarType::Bool) {
    return at::zeros(bias.sizes(), q.options()).masked_fill_(bias.logical_not(), -INFINITY);
  }
  TORCH_CHECK(float_kind(bias), "scaled_dot_product_attention (neuron): attn_mask must be bool ",
              "or float32/bfloat16/float16, got ", bias.scalar_type());
  return bias;
}

// A result in the layout ATen's meta kernels give (torch/_meta_registrations.py:
// alloc_with_matching_layout for the output, empty_like for the gradients): compiled graphs
// trust those strides (a view after a permuted query failed). The kernels write `written`:
// the result itself, or, when its last dimension is not contiguous, a dense temporary that
// finish() copies over (an async device copy).
struct Result {
  at::Tensor result, written;
  Result(const at::Tensor& like, c10::IntArrayRef sizes) {
    if (like.sizes() == sizes) {
      result = at::empty_like(like);
    } else {
      std::array<int64_t, 4> order{0, 1, 2, 3};
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
      std::array<int64_t, 4> strides{};
      int64_t stride = 1;
      for (int i = 3; i >= 0; --i) {
        strides[order[i]] = stride;
        stride *= sizes[order[i]];
      }
      result = at::empty_strided(sizes, strides, like.options());
    }
    written =
        result.size(3) <= 1 || result.stride(3) == 1 ? result : at::empty(sizes, like.options());
  }
  at::Tensor finish() {
    if (!written.is_same(result)) result.copy_(written);
    return result;
  }
};

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

kernels::Strides4 strides_of(const at::Tensor& t) {
  kernels::Strides4 s;
  for (int i = 0; i < 4; ++i) s.s[i] = t.stride(i);
  if (t.size(3) <= 1) s.s[3] = 1;
  return s;
}

void check_inputs(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  double dropout_p) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": expected 4-d query/key/value [batch, heads, seq, dim] on the neuron device, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(kernel_operand(q) && kernel_operand(k) && kernel_operand(v) &&
                  k.device() == q.device() && v.device() == q.device(),
              op, ": query/key/value must be float32/bfloat16/float16 tensors on one neuron ",
              "device, got ", q.scalar_type(), " on ", q.device(), ", ", k.scalar_type(), " on ",
              k.device(), ", ", v.scalar_type(), " on ", v.device());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
              ": query/key/value must have one dtype, got ", q.scalar_type(), ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  v.size(1) == q.size(1) && k.size(2) == v.size(2) && k.size(3) == q.size(3),
              op, ": incompatible shapes query ", q.sizes(), ", key ", k.sizes(), ", value ",
              v.sizes(), " (GQA runs on the math path: torch's SDPA picks it automatically)");
  TORCH_CHECK(dropout_p == 0.0, op, ": the neuron kernel has no dropout (dropout_p=", dropout_p,
              "); torch's SDPA routes dropout to the math path");
}

kernels::AttentionArgs make_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& mask, bool is_causal,
                                 std::optional<double> scale) {
  kernels::AttentionArgs a;
  a.dtype = *kernel_dtype(q.scalar_type());
  a.B = q.size(0);
  a.H = q.size(1);
  a.L = q.size(2);
  a.S = k.size(2);
  a.E = q.size(3);
  a.Ev = v.size(3);
  a.q = strides_of(q);
  a.k = strides_of(k);
  a.v = strides_of(v);
  a.causal = is_causal;
  a.scale =
      static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(a.E)));
  if (mask.defined()) {
    at::Tensor m = mask.expand({a.B, a.H, a.L, a.S});
    a.mask = ptr_of(m);
    a.mask_dtype = *kernel_dtype(m.scalar_type());
    for (int i = 0; i < 4; ++i) a.m.s[i] = m.stride(i);
  }
  return a;
}

// Which kernel runs the overrideable SDPA ops: the hand-written one (csrc/kernels/attention.h)
// or ATen's CPU flash-attention kernel on host views of the device buffers (one work item
// through the asynchronous ATen path; bitwise the CPU eager result; needs equal q/k/v head
// sizes). Both keep the logsumexp of the scaled scores per query row, so a forward of one and a
// backward of the other compose. "auto" (the default) picks by query x key positions:
// bfloat16/float16 forwards from kLowPrecisionForward (ATen's multiplies in those dtypes, ours
// in float32), everything else from kLongAttention.
// torch.ops.openneuron._sdpa_kernel("auto" | "hand" | "aten_flash") switches.
enum SdpaKernel : int { kAuto, kHand, kAtenFlash };
std::atomic<int> g_sdpa_kernel{kAuto};

// ms, hand | ATen's on the device (2 cores, AVX-512 + AMX, causal, 2026-12-04):
//   forward + backward: [8, 4, 128, 64] fp32 2.0-2.8 | 4.5, bf16 1.7-2.3 | 5.6;
//   [2, 8, 512, 64] fp32 9.5-13.9 | 14.5-17.8, bf16 9.1-13.8 | 11.8-12.2; [2, 8, 640, 64] fp32
//   18.4 | 22.4, bf16 13.8 | 18.1; [2, 8, 768, 64] fp32 26.0 | 25.3, bf16 25.5 | 17.7;
//   [1, 8, 1024, 64] fp32 22.8 | 19.0, bf16 25.1 | 12.8.
//   forward alone, bf16: [1, 8, 256, 64] 0.77 | 0.27, [2, 8, 512, 64] 3.4-4.2 | 1.6, [8, 4, 128,
//   64] 0.71 | 0.37 but [1, 12, 128, 64] 0.21 | 0.82; fp32 [2, 8, 512, 64] 3.5-5.0 | 4.6-5.0.
//   A decode step's [1, 4, 1, 16] forward 0.010 | 0.079.
constexpr int64_t kLongAttention = 768 * 768;
constexpr int64_t kLowPrecisionForward = 256 * 256;

std::string set_sdpa_kernel(const std::string& which) {
  static const char* kNames[] = {"auto", "hand", "aten_flash"};
  const int was = g_sdpa_kernel.load();
  if (!which.empty()) {
    int mode = -1;
    for (int i = 0; i < 3; ++i)
      if (which == kNames[i]) mode = i;
    TORCH_CHECK(mode >= 0, "openneuron::_sdpa_kernel: expected \"auto\", \"hand\" or ",
                "\"aten_flash\", got \"", which, "\"");
    g_sdpa_kernel = mode;
  }
  return kNames[was];
}

// ATen's CPU flash kernel needs one head size for q, k and v; the hand-written kernel takes
// any value head size.
bool use_aten_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool forward) {
  if (q.size(3) != v.size(3)) return false;
  switch (g_sdpa_kernel.load(std::memory_order_relaxed)) {
    case kHand:
      return false;
    case kAtenFlash:
      return true;
    default: {
      const int64_t positions = q.size(2) * k.size(2);
      const bool low_precision = q.scalar_type() != c10::ScalarType::Float;
      return positions >= (forward && low_precision ? kLowPrecisionForward : kLongAttention);
    }
  }
}

SdpaResult sdpa_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                        const std::optional<at::Tensor>& attn_bias, double dropout_p,
                        bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  static const char* kOp = "_scaled_dot_product_fused_attention_overrideable";
  check_inputs(kOp, query, key, value, dropout_p);
  TORCH_CHECK(!return_debug_mask, kOp, ": return_debug_mask is not supported on neuron");
  static OpInfo& info = op_info("aten::_scaled_dot_product_fused_attention_overrideable", "");
  const at::Tensor q = last_dim_contiguous(query), k = last_dim_contiguous(key),
                   v = last_dim_contiguous(value);
  const at::Tensor mask = additive_mask(attn_bias.value_or(at::Tensor()), q);
  if (use_aten_flash(q, k, v, /*forward=*/true)) {
    static const c10::OperatorHandle op =
        find_op("aten::_scaled_dot_product_flash_attention_for_cpu", "");
    auto [flash_out, flash_lse] = boxed_fallback<std::tuple<at::Tensor, at::Tensor>>(
        op, q, k, v, 0.0, is_causal,
        mask.defined() ? std::optional<at::Tensor>(mask) : std::optional<at::Tensor>(), scale);
    info.native_calls.fetch_add(1, std::memory_order_relaxed);
    // NOTE: ATen's kernel returns out and logsumexp as transposed views of [B, L, H, *]; the
    // op's meta kernel (which compiled graphs check strides against) says out in the query's
    // layout and logsumexp contiguous.
    Result res(query, {q.size(0), q.size(1), q.size(2), v.size(3)});
    at::Tensor out = flash_out;
    if (!out.strides().equals(res.result.strides())) out = res.result.copy_(flash_out);
    return {out,
            flash_lse.contiguous(),
            at::Tensor(),
            at::Tensor(),
            c10::SymInt(q.size(2)),
            c10::SymInt(k.size(2)),
            at::empty({}, at::dtype(at::kLong)),
            at::empty({}, at::dtype(at::kLong)),
            at::Tensor()};
  }
  kernels::AttentionArgs a = make_args(q, k, v, mask, is_causal, scale);
  Result res(query, {a.B, a.H, a.L, a.Ev});
  const at::Tensor out = res.written;
  a.out = strides_of(out);
  at::Tensor lse = empty_on({a.B, a.H, a.L}, c10::ScalarType::Float, q.device());
  at::Tensor seed = at::empty({}, at::dtype(at::kLong));
  at::Tensor offset = at::empty({}, at::dtype(at::kLong));
  if (out.numel() > 0 || lse.numel() > 0) {
    const void* qp = ptr_of(q);
    const void* kp = ptr_of(k);
    const void* vp = ptr_of(v);
    void* op = ptr_of(out);
    float* lp = static_cast<float*>(ptr_of(lse));
    enqueue_native(info, q.device(), [=] { kernels::attention_forward(a, qp, kp, vp, op, lp); });
  }
  return {res.finish(),     lse,  at::Tensor(), at::Tensor(), c10::SymInt(a.L),
          c10::SymInt(a.S), seed, offset,       at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& cum_seq_q,
    const at::Tensor& cum_seq_k, int64_t max_q, int64_t max_k, double dropout_p, bool is_causal,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset, std::optional<double> scale) {
  static const char* kOp = "_scaled_dot_product_fused_attention_overrideable_backward";
  check_inputs(kOp, query, key, value, dropout_p);
  TORCH_CHECK(!(grad_input_mask[3] && attn_bias.defined()), kOp,
              ": no gradient for attn_mask on neuron; torch's SDPA runs masks that require grad ",
              "on the math path");
  static OpInfo& info =
      op_info("aten::_scaled_dot_product_fused_attention_overrideable_backward", "");
  const at::Tensor q = last_dim_contiguous(query), k = last_dim_contiguous(key),
                   v = last_dim_contiguous(value);
  const at::Tensor mask = additive_mask(attn_bias, q);
  if (use_aten_flash(q, k, v, /*forward=*/false)) {
    static const c10::OperatorHandle op =
        find_op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "");
    auto [dq, dk, dv] = boxed_fallback<std::tuple<at::Tensor, at::Tensor, at::Tensor>>(
        op, grad_out, q, k, v, out, logsumexp, 0.0, is_causal,
        mask.defined() ? std::optional<at::Tensor>(mask) : std::optional<at::Tensor>(), scale);
    info.native_calls.fetch_add(1, std::memory_order_relaxed);
    // NOTE: as in the forward: ATen's gradients are transposed views; the meta kernel's are in
    // their inputs' layouts.
    auto in_layout = [](const at::Tensor& like, const at::Tensor& grad) {
      Result r(like, grad.sizes());
      return grad.strides().equals(r.result.strides()) ? grad : r.result.copy_(grad);
    };
    return {grad_input_mask[0] ? in_layout(query, dq) : at::Tensor(),
            grad_input_mask[1] ? in_layout(key, dk) : at::Tensor(),
            grad_input_mask[2] ? in_layout(value, dv) : at::Tensor(), at::Tensor()};
  }
  kernels::AttentionArgs a = make_args(q, k, v, mask, is_causal, scale);
  TORCH_CHECK(grad_out.dim() == 4 && out.dim() == 4 &&
                  grad_out.sizes().equals(c10::IntArrayRef{a.B, a.H, a.L, a.Ev}) &&
                  out.sizes().equals(grad_out.sizes()) &&
                  grad_out.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type() && on_neuron(grad_out) && on_neuron(out),
              kOp, ": grad_out ", grad_out.sizes(), " / out ", out.sizes(),
              " must be neuron tensors of shape [", a.B, ", ", a.H, ", ", a.L, ", ", a.Ev,
              "] and dtype ", q.scalar_type());
  const at::Tensor g = last_dim_contiguous(grad_out), o = last_dim_contiguous(out);
  const at::Tensor lse = logsumexp.scalar_type() == c10::ScalarType::Float
                             ? logsumexp.contiguous()
                             : logsumexp.to(c10::ScalarType::Float).contiguous();
  TORCH_CHECK(lse.numel() == a.B * a.H * a.L, kOp, ": logsumexp has ", lse.numel(),
              " elements, expected ", a.B * a.H * a.L);
  Result rq(query, {a.B, a.H, a.L, a.E}), rk(key, {a.B, a.H, a.S, a.E}),
      rv(value, {a.B, a.H, a.S, a.Ev});
  const at::Tensor dq = rq.written, dk = rk.written, dv = rv.written;
  a.dq = strides_of(dq);
  a.dk = strides_of(dk);
  a.dv = strides_of(dv);
  if (dq.numel() + dk.numel() + dv.numel() > 0) {
    const void* qp = ptr_of(q);
    const void* kp = ptr_of(k);
    const void* vp = ptr_of(v);
    const void* op = ptr_of(o);
    const void* gp = ptr_of(g);
    const float* lp = static_cast<const float*>(ptr_of(lse));
    void* dqp = ptr_of(dq);
    void* dkp = ptr_of(dk);
    void* dvp = ptr_of(dv);
    const kernels::Strides4 os = strides_of(o), gs = strides_of(g);
    enqueue_native(info, q.device(), [=] {
      kernels::attention_backward(a, qp, kp, vp, op, os, gp, gs, lp, dqp, dkp, dvp);
    });
  }
  return {grad_input_mask[0] ? rq.finish() : at::Tensor(),
          grad_input_mask[1] ? rk.finish() : at::Tensor(),
          grad_input_mask[2] ? rv.finish() : at::Tensor(), at::Tensor()};
}

}  // namespace
}  // namespace openneuron::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &openneuron::aten::fused_sdp_choice)
}  // namespace at::native

TORCH_LIBRARY_FRAGMENT(openneuron, m) {
  m.def("_sdpa_kernel(str which=\"\") -> str", &openneuron::aten::set_sdpa_kernel);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("_fused_sdp_choice", TORCH_FN(ops::fused_sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(ops::sdpa_forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(ops::sdpa_backward));
}
