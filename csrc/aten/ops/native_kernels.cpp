// Native layer norm (csrc/kernels/layer_norm.h, forward and backward), embedding backward
// (csrc/kernels/embedding.h) and matrix products with a few rows (csrc/kernels/gemv.h: mm and
// addmm, every form) for the neuron device, and the switch that turns all native kernels off
// (native_kernels.h).
// Each call checks its inputs, allocates its outputs and enqueues ONE work item that runs the
// kernel on raw device pointers. Cases the kernel does not cover (other shapes, non-contiguous
// or empty inputs, other dtypes) take the path they take without it: the boxed fallback
// (asynchronous ATen CPU kernel).
// NOTE: a native softmax / log_softmax was measured 1.2-2x slower than ATen's CPU kernel on the
// asynchronous path and was dropped (README "Numbers").
#include "aten/ops/native_kernels.h"

#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/embedding.h"
#include "kernels/gemv.h"
#include "kernels/layer_norm.h"
#include "runtime/config.h"

namespace openneuron::aten {
namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{runtime::config_or_defaults().native_kernels};
  return flag;
}

bool set_native_kernels(bool on) { return enabled_flag().exchange(on); }

// ---- layer norm -----------------------------------------------------------------------------

// The dtypes ATen uses: mean/rstd are float32 when the input is bf16/fp16 and the weight is
// float32 ("mixed"), else the input's dtype.
std::optional<kernels::LayerNormTypes> ln_types(const at::Tensor& x, const at::Tensor& w,
                                                const at::Tensor& b) {
  kernels::LayerNormTypes t;
  t.dtype = *kernel_dtype(x.scalar_type());
  t.wdtype = t.dtype;
  t.sdtype = t.dtype;
  const at::Tensor& p = w.defined() ? w : b;
  if (p.defined() && p.scalar_type() != x.scalar_type()) {
    if (p.scalar_type() != c10::ScalarType::Float) return std::nullopt;
    t.wdtype = kernels::DType::kFloat32;
    t.sdtype = kernels::DType::kFloat32;
  }
  if (w.defined() && b.defined() && w.scalar_type() != b.scalar_type()) return std::nullopt;
  return t;
}

bool ln_param_ok(const at::Tensor& p, const at::Tensor& x, int64_t n) {
  return !p.defined() ||
         (kernel_operand(p) && p.device() == x.device() && p.is_contiguous() && p.numel() == n);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(
    const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight_opt, const std::optional<at::Tensor>& bias_opt,
    double eps) {
  static const c10::OperatorHandle op = find_op("aten::native_layer_norm", "");
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  const at::Tensor b = bias_opt.value_or(at::Tensor());
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  bool ok = native_kernels_enabled() && kernel_operand(input) && input.is_contiguous() &&
            axis >= 0 && input.numel() > 0;
  int64_t n = 1;
  if (ok) {
    for (size_t i = 0; i < normalized_shape.size(); ++i) {
      ok &= input.size(axis + static_cast<int64_t>(i)) == normalized_shape[i];
      n *= normalized_shape[i];
    }
  }
  ok = ok && n > 0 && ln_param_ok(w, input, n) && ln_param_ok(b, input, n);
  std::optional<kernels::LayerNormTypes> types;
  if (ok) types = ln_types(input, w, b);
  if (!types) {
    return boxed_fallback<std::tuple<at::Tensor, at::Tensor, at::Tensor>>(
        op, input, normalized_shape, weight_opt, bias_opt, eps);
  }
  static OpInfo& info = op_info("aten::native_layer_norm", "");
  const int64_t rows = input.numel() / n;
  c10::SmallVector<int64_t, 5> stat_sizes(input.sizes().begin(), input.sizes().begin() + axis);
  stat_sizes.append(normalized_shape.size(), 1);
  const c10::ScalarType stat_dtype =
      types->sdtype == kernels::DType::kFloat32 ? c10::ScalarType::Float : input.scalar_type();
  at::Tensor out = empty_on(input.sizes(), input.scalar_type(), input.device());
  at::Tensor mean = empty_on(stat_sizes, stat_dtype, input.device());
  at::Tensor rstd = empty_on(stat_sizes, stat_dtype, input.device());
  const kernels::LayerNormTypes t = *types;
  const void* x = ptr_of(input);
  const void* wp = ptr_of(w);
  const void* bp = ptr_of(b);
  void* y = ptr_of(out);
  void* mp = ptr_of(mean);
  void* rp = ptr_of(rstd);
  const float feps = static_cast<float>(eps);
  enqueue_native(info, input.device(),
                 [=] { kernels::layer_norm_forward(t, x, wp, bp, y, mp, rp, rows, n, feps); });
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt,
    const std::optional<at::Tensor>& bias_opt, std::array<bool, 3> output_mask) {
  static const c10::OperatorHandle op = find_op("aten::native_layer_norm_backward", "");
  const at::Tensor w = weight_opt.value_or(at::Tensor());
  const at::Tensor b = bias_opt.value_or(at::Tensor());
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  int64_t n = 1;
  for (int64_t s : normalized_shape) n *= s;
  bool ok = native_kernels_enabled() && kernel_operand(input) && input.is_contiguous() &&
            axis >= 0 && input.numel() > 0 && n > 0 && kernel_operand(grad_out) &&
            grad_out.is_contiguous() && grad_out.sizes().equals(input.sizes()) &&
            grad_out.scalar_type() == input.scalar_type() && ln_param_ok(w, input, n) &&
            ln_param_ok(b, input, n) && kernel_operand(mean) && kernel_operand(rstd) &&
            mean.is_contiguous() && rstd.is_contiguous() && mean.numel() * n == input.numel() &&
            rstd.numel() == mean.numel() && grad_out.device() == input.device() &&
            mean.device() == input.device() && rstd.device() == input.device();
  std::optional<kernels::LayerNormTypes> types;
  if (ok) types = ln_types(input, w, b);
  if (types) {
    const c10::ScalarType stat_dtype =
        types->sdtype == kernels::DType::kFloat32 ? c10::ScalarType::Float : input.scalar_type();
    if (mean.scalar_type() != stat_dtype || rstd.scalar_type() != stat_dtype) types.reset();
  }
  if (!types) {
    return boxed_fallback<std::tuple<at::Tensor, at::Tensor, at::Tensor>>(
        op, grad_out, input, normalized_shape, mean, rstd, weight_opt, bias_opt, output_mask);
  }
  static OpInfo& info = op_info("aten::native_layer_norm_backward", "");
  const int64_t rows = input.numel() / n;
  at::Tensor dx, dw, db;
  if (output_mask[0]) dx = empty_on(input.sizes(), input.scalar_type(), input.device());
  if (output_mask[1] && w.defined()) dw = empty_on(w.sizes(), w.scalar_type(), input.device());
  if (output_mask[2] && b.defined()) db = empty_on(b.sizes(), b.scalar_type(), input.device());
  if (!dx.defined() && !dw.defined() && !db.defined()) return {dx, dw, db};
  const kernels::LayerNormTypes t = *types;
  const void* g = ptr_of(grad_out);
  const void* x = ptr_of(input);
  const void* mp = ptr_of(mean);
  const void* rp = ptr_of(rstd);
  const void* wp = ptr_of(w);
  void* dxp = ptr_of(dx);
  void* dwp = ptr_of(dw);
  void* dbp = ptr_of(db);
  enqueue_native(info, input.device(), [=] {
    kernels::layer_norm_backward(t, g, x, mp, rp, wp, dxp, dwp, dbp, rows, n);
  });
  return {dx, dw, db};
}

// ---- embedding backward ---------------------------------------------------------------------

at::Tensor embedding_dense_bwd(const at::Tensor& grad_output, const at::Tensor& indices,
                               int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq) {
  static const c10::OperatorHandle op = find_op("aten::embedding_dense_backward", "");
  const bool ok = native_kernels_enabled() && !scale_grad_by_freq && kernel_operand(grad_output) &&
                  grad_output.is_contiguous() && grad_output.dim() >= 1 && on_neuron(indices) &&
                  indices.device() == grad_output.device() && indices.is_contiguous() &&
                  (indices.scalar_type() == c10::ScalarType::Long ||
                   indices.scalar_type() == c10::ScalarType::Int) &&
                  num_weights >= 0 && grad_output.numel() == indices.numel() * grad_output.size(-1);
  if (!ok) {
    return boxed_fallback<at::Tensor>(op, grad_output, indices, num_weights, padding_idx,
                                      scale_grad_by_freq);
  }
  static OpInfo& info = op_info("aten::embedding_dense_backward", "");
  const int64_t dim = grad_output.size(-1), n = indices.numel();
  at::Tensor out = empty_on({num_weights, dim}, grad_output.scalar_type(), grad_output.device());
  if (out.numel() == 0) return out;
  const kernels::DType dt = *kernel_dtype(grad_output.scalar_type());
  const bool index32 = indices.scalar_type() == c10::ScalarType::Int;
  const void* g = ptr_of(grad_output);
  const void* ix = ptr_of(indices);
  void* o = ptr_of(out);
  enqueue_native(info, grad_output.device(), [=] {
    int64_t bad = 0;
    kernels::embedding_backward(dt, g, ix, index32, n, dim, num_weights, padding_idx, o, &bad);
    if (bad > 0) {
      throw std::runtime_error("embedding_dense_backward: " + std::to_string(bad) +
                               " indices are out of range [0, " + std::to_string(num_weights) +
                               ") (the embedding's num_embeddings)");
    }
  });
  return out;
}

// ---- matrix products with a few rows ---------------------------------------------------------

// y = beta * c + alpha * (a @ b) through kernels::gemv when it takes the operands: neuron tensors
// of one kernel dtype on one device, a [m, k] with m <= kGemvMaxRows, b [k, n] with rows or
// columns contiguous, c (may be undefined) broadcastable to [m, n], y [m, n] with contiguous rows
// overlapping neither a nor b. False: not taken (the caller's boxed fallback runs ATen's).
bool try_gemv(OpInfo& info, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
              const c10::Scalar& beta, const c10::Scalar& alpha, const at::Tensor& y) {
  if (!native_kernels_enabled() || !kernel_operand(a) || !kernel_operand(b) || !kernel_operand(y) ||
      a.dim() != 2 || b.dim() != 2 || y.dim() != 2) {
    return false;
  }
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const c10::ScalarType dt = a.scalar_type();
  if (m < 1 || m > kernels::kGemvMaxRows || n < 1 || k < 1 || b.size(0) != k ||
      b.scalar_type() != dt || y.scalar_type() != dt || y.size(0) != m || y.size(1) != n ||
      (n > 1 && y.stride(1) != 1) || b.device() != a.device() || y.device() != a.device() ||
      beta.isComplex() || alpha.isComplex() ||
      at::get_overlap_status(y, a) != at::MemOverlapStatus::No ||
      at::get_overlap_status(y, b) != at::MemOverlapStatus::No) {
    return false;
  }
  kernels::GemvArgs g;
  g.dtype = *kernel_dtype(dt);
  g.m = m;
  g.n = n;
  g.k = k;
  g.a_rs = a.stride(0);
  g.a_cs = k == 1 ? 1 : a.stride(1);
  // A size-1 dimension's stride is never used: the one that lets a layout apply.
  g.b_rs = k == 1 ? 1 : b.stride(0);
  g.b_cs = n == 1 ? 1 : b.stride(1);
  g.y_rs = y.stride(0);
  g.alpha = static_cast<float>(alpha.toDouble());
  g.beta = static_cast<float>(beta.toDouble());
  if (c.defined() && g.beta != 0.0f) {
    if (!kernel_operand(c) || c.scalar_type() != dt || c.device() != a.device() || c.dim() > 2 ||
        !at::is_expandable_to(c.sizes(), {m, n})) {
      return false;
    }
    const at::Tensor ce = c.expand({m, n});
    g.c_rs = ce.stride(0);
    g.c_cs = ce.stride(1);
    // c may be y itself (addmm_), never a different view of y's memory.
    if (!c.is_same(y) && at::get_overlap_status(y, c) != at::MemOverlapStatus::No) return false;
    g.c = ptr_of(c);
  }
  g.a = ptr_of(a);
  g.b = ptr_of(b);
  g.y = ptr_of(y);
  if (!kernels::gemv_supported(g)) return false;
  enqueue_native(info, a.device(), [g] { kernels::gemv(g); });
  return true;
}

at::Tensor product_result(const at::Tensor& a, const at::Tensor& b) {
  return empty_on({a.size(0), b.size(1)}, a.scalar_type(), a.device());
}

// The functional forms as ATen's structured wrappers run them: the result allocated here, then
// the .out form, so that without the kernel the fallback's CPU kernel writes the device buffer
// (the functional CPU kernel's host result would be copied over). Other ranks: the functional
// op, for ATen's error.
bool out_form(const at::Tensor& a, const at::Tensor& b) {
  return on_neuron(a) && a.dim() == 2 && b.dim() == 2;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  static const c10::OperatorHandle op = find_op("aten::mm", "");
  static const c10::OperatorHandle op_out = find_op("aten::mm", "out");
  static OpInfo& info = op_info(op);
  if (!out_form(a, b)) return boxed_fallback<at::Tensor>(op, a, b);
  at::Tensor y = product_result(a, b);
  if (try_gemv(info, a, b, at::Tensor(), 0, 1, y)) return y;
  boxed_fallback<at::Tensor>(op_out, a, b, y);
  return y;
}

at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  static const c10::OperatorHandle op = find_op("aten::mm", "out");
  static OpInfo& info = op_info(op);
  if (try_gemv(info, a, b, at::Tensor(), 0, 1, out)) return out;
  boxed_fallback<at::Tensor>(op, a, b, out);
  return out;
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                 const c10::Scalar& beta, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = find_op("aten::addmm", "");
  static const c10::OperatorHandle op_out = find_op("aten::addmm", "out");
  static OpInfo& info = op_info(op);
  if (!out_form(a, b)) return boxed_fallback<at::Tensor>(op, self, a, b, beta, alpha);
  at::Tensor y = product_result(a, b);
  if (try_gemv(info, a, b, self, beta, alpha, y)) return y;
  boxed_fallback<at::Tensor>(op_out, self, a, b, beta, alpha, y);
  return y;
}

at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                      const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  static const c10::OperatorHandle op = find_op("aten::addmm", "out");
  static OpInfo& info = op_info(op);
  if (try_gemv(info, a, b, self, beta, alpha, out)) return out;
  boxed_fallback<at::Tensor>(op, self, a, b, beta, alpha, out);
  return out;
}

at::Tensor& addmm_inplace(at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                          const c10::Scalar& beta, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = find_op("aten::addmm_", "");
  static OpInfo& info = op_info(op);
  if (try_gemv(info, a, b, self, beta, alpha, self)) return self;
  boxed_fallback<at::Tensor>(op, self, a, b, beta, alpha);
  return self;
}

}  // namespace

bool native_kernels_enabled() { return enabled_flag().load(std::memory_order_relaxed); }

}  // namespace openneuron::aten

TORCH_LIBRARY_FRAGMENT(openneuron, m) {
  m.def("_set_native_kernels(bool enabled) -> bool", &openneuron::aten::set_native_kernels);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = openneuron::aten;
  m.impl("native_layer_norm", TORCH_FN(ops::layer_norm_fwd));
  m.impl("native_layer_norm_backward", TORCH_FN(ops::layer_norm_bwd));
  m.impl("embedding_dense_backward", TORCH_FN(ops::embedding_dense_bwd));
  m.impl("mm", TORCH_FN(ops::mm));
  m.impl("mm.out", TORCH_FN(ops::mm_out));
  m.impl("addmm", TORCH_FN(ops::addmm));
  m.impl("addmm.out", TORCH_FN(ops::addmm_out));
  m.impl("addmm_", TORCH_FN(ops::addmm_inplace));
}
