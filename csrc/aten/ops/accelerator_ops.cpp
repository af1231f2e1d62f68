// Ops ATen sends only to accelerators (CUDA, XPU, PrivateUse1) and that have no CPU kernel, so the
// boxed fallback (which runs ATen's CPU kernel) cannot serve them. Here: the fused RNN cells that
// ATen's LSTMCell/GRUCell (RNN.cpp) call for non-CPU inputs, forward and backward, written as
// composites of neuron ops with the arithmetic of CUDA's kernels (aten/native/cuda/RNN.cu: float
// accumulation for bf16/fp16, the same workspace layouts), plus meta kernels ATen lacks for the
// GRU cell. README "Accelerator-only ATen paths" lists every such path and what neuron does.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/ops/op_table.h"

namespace openneuron::aten {
namespace {

at::Tensor acc(const at::Tensor& t) {
  return t.defined() && at::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
}

at::Tensor bias_of(const std::optional<at::Tensor>& b) {
  return b.has_value() && b->defined() ? acc(*b) : at::Tensor();
}

// As CUDA's checkSizes: gates [N, factor * H], biases [factor * H], hidden [N, H].
void check_cell(const char* op, const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& ib,
                const at::Tensor& hb, int64_t factor, const at::Tensor& hidden) {
  TORCH_CHECK(ig.dim() == 2 && ig.sizes().equals(hg.sizes()), op,
              ": input_gates and hidden_gates must be 2-D of one shape, got ", ig.sizes(), " and ",
              hg.sizes(), " on ", ig.device());
  TORCH_CHECK(ig.size(1) % factor == 0, op, ": gates must have ", factor,
              " * hidden_size columns, got ", ig.sizes());
  TORCH_CHECK(ib.defined() == hb.defined(), op, ": pass both biases or neither");
  if (ib.defined()) {
    TORCH_CHECK(ib.dim() == 1 && ib.numel() == ig.size(1) && hb.sizes().equals(ib.sizes()), op,
                ": biases must be [", ig.size(1), "], got ", ib.sizes(), " and ", hb.sizes());
  }
  TORCH_CHECK(
      hidden.dim() == 2 && hidden.size(0) == ig.size(0) && hidden.size(1) * factor == ig.size(1),
      op, ": hidden state must be [", ig.size(0), ", ", ig.size(1) / factor, "], got ",
      hidden.sizes());
}

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
//   -> (hy, cy, workspace [N, 4H] = sigmoid(i), sigmoid(f), tanh(g), sigmoid(o))
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor b1 = bias_of(input_bias);
  const at::Tensor b2 = bias_of(hidden_bias);
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, b1, b2, 4, cx);
  const auto dtype = input_gates.scalar_type();
  at::Tensor gates = acc(input_gates).add(acc(hidden_gates));
  if (b1.defined()) gates.add_(b1).add_(b2);
  auto g = gates.unsafe_chunk(4, 1);
  const at::Tensor i = g[0].sigmoid(), f = g[1].sigmoid(), c = g[2].tanh(), o = g[3].sigmoid();
  const at::Tensor cy = f.mul(acc(cx)).add_(i.mul(c));
  const at::Tensor hy = o.mul(cy.tanh());
  return {hy.to(dtype), cy.to(dtype), at::cat({i, f, c, o}, 1).to(dtype)};
}

// _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
//   -> (grad_gates, grad_cx, grad_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy_opt, const std::optional<at::Tensor>& grad_cy_opt,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const at::Tensor ghy = grad_hy_opt.has_value() ? acc(*grad_hy_opt) : at::Tensor();
  const at::Tensor gcy = grad_cy_opt.has_value() ? acc(*grad_cy_opt) : at::Tensor();
  if (!ghy.defined() && !gcy.defined()) return {};
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == cx.size(0) &&
                  workspace.size(1) == 4 * cx.size(1) && cy.sizes().equals(cx.sizes()),
              "_thnn_fused_lstm_cell_backward: workspace must be [N, 4H] for cx/cy [N, H], got ",
              workspace.sizes(), ", ", cx.sizes(), ", ", cy.sizes());
  const auto dtype = workspace.scalar_type();
  auto w = acc(workspace).unsafe_chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &c = w[2], &o = w[3];
  const at::Tensor cx_a = acc(cx);
  at::Tensor gog, gcx;
  if (ghy.defined()) {
    const at::Tensor tanh_cy = acc(cy).tanh();
    gog = ghy.mul(tanh_cy);
    gcx = at::tanh_backward(ghy.mul(o), tanh_cy);
    if (gcy.defined()) gcx.add_(gcy);
  } else {
    gog = at::zeros_like(cx_a, at::MemoryFormat::Contiguous);
    gcx = gcy;
  }
  const at::Tensor gig = at::sigmoid_backward(gcx.mul(c), i);
  const at::Tensor gfg = at::sigmoid_backward(gcx.mul(cx_a), f);
  const at::Tensor gcg = at::tanh_backward(gcx.mul(i), c);
  const at::Tensor grad_gates = at::cat({gig, gfg, gcg, at::sigmoid_backward(gog, o)}, 1).to(dtype);
  const at::Tensor grad_cx = gcx.mul(f).to(dtype);
  return {grad_gates, grad_cx, has_bias ? grad_gates.sum(0) : at::Tensor()};
}

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
//   -> (hy, workspace [N, 5H] = r, z, n, hx, hidden n-gate + its bias)
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates,
                                            const at::Tensor& hidden_gates, const at::Tensor& hx,
                                            const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor b1 = bias_of(input_bias);
  const at::Tensor b2 = bias_of(hidden_bias);
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, b1, b2, 3, hx);
  const auto dtype = input_gates.scalar_type();
  const int64_t h = hx.size(1);
  const at::Tensor ig = acc(input_gates), hg = acc(hidden_gates), hx_a = acc(hx);
  at::Tensor rz = ig.narrow(1, 0, 2 * h).add(hg.narrow(1, 0, 2 * h));
  at::Tensor in = ig.narrow(1, 2 * h, h);
  at::Tensor hn = hg.narrow(1, 2 * h, h);
  if (b1.defined()) {
    rz.add_(b1.narrow(0, 0, 2 * h)).add_(b2.narrow(0, 0, 2 * h));
    in = in.add(b1.narrow(0, 2 * h, h));
    hn = hn.add(b2.narrow(0, 2 * h, h));
  }
  rz.sigmoid_();
  const at::Tensor r = rz.narrow(1, 0, h), z = rz.narrow(1, h, h);
  const at::Tensor n = in.add(r.mul(hn)).tanh_();
  const at::Tensor hy = z.mul(hx_a.sub(n)).add_(n);
  return {hy.to(dtype), at::cat({r, z, n, hx_a, hn}, 1).to(dtype)};
}

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
//   -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) &&
                  workspace.size(1) == 5 * grad_hy.size(1),
              "_thnn_fused_gru_cell_backward: workspace must be [N, 5H] for grad_hy [N, H], got ",
              workspace.sizes(), " and ", grad_hy.sizes(), " on ", grad_hy.device());
  const auto dtype = grad_hy.scalar_type();
  const at::Tensor go = acc(grad_hy);
  auto w = acc(workspace).unsafe_chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  const at::Tensor gz = at::sigmoid_backward(go.mul(hx.sub(n)), z);
  const at::Tensor ghx = go.mul(z).to(dtype);
  const at::Tensor gn = at::tanh_backward(go.mul(at::rsub(z, 1)), n);
  const at::Tensor ghn = gn.mul(r);
  const at::Tensor gr = at::sigmoid_backward(gn.mul(hn), r);
  const at::Tensor g_in = at::cat({gr, gz, gn}, 1).to(dtype);
  const at::Tensor g_hid = at::cat({gr, gz, ghn}, 1).to(dtype);
  if (!has_bias) return {g_in, g_hid, ghx, at::Tensor(), at::Tensor()};
  return {g_in, g_hid, ghx, g_in.sum(0), g_hid.sum(0)};
}

// The neuron registrations count their calls as native (openneuron.ops_report()).
void count(const char* name) {
  op_info(name, "").native_calls.fetch_add(1, std::memory_order_relaxed);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_neuron(
    const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& cx,
    const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb) {
  count("aten::_thnn_fused_lstm_cell");
  return lstm_cell(ig, hg, cx, ib, hb);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward_neuron(
    const std::optional<at::Tensor>& ghy, const std::optional<at::Tensor>& gcy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  count("aten::_thnn_fused_lstm_cell_backward_impl");
  return lstm_cell_backward(ghy, gcy, cx, cy, workspace, has_bias);
}

std::tuple<at::Tensor, at::Tensor> gru_cell_neuron(const at::Tensor& ig, const at::Tensor& hg,
                                                   const at::Tensor& hx,
                                                   const std::optional<at::Tensor>& ib,
                                                   const std::optional<at::Tensor>& hb) {
  count("aten::_thnn_fused_gru_cell");
  return gru_cell(ig, hg, hx, ib, hb);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward_neuron(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  count("aten::_thnn_fused_gru_cell_backward");
  return gru_cell_backward(grad_hy, workspace, has_bias);
}

}  // namespace
}  // namespace openneuron::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace openneuron::aten;
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell_neuron));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward_neuron));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell_neuron));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward_neuron));
}

// ATen has meta kernels for the LSTM cell (torch/_meta_registrations.py) but none for the GRU
// cell; the composites above are shape-exact on meta tensors (FakeTensor, torch.compile).
TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_thnn_fused_gru_cell", TORCH_FN(openneuron::aten::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(openneuron::aten::gru_cell_backward));
}
