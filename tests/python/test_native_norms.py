"""Native RMS norm and fused cross-entropy (csrc/kernels/{rms_norm,cross_entropy}.*,
csrc/aten/ops/native_norms.cpp) on the neuron device against CPU PyTorch: forward results, input and weight gradients, dtypes, eps None,
multi-dim normalized shapes, double backward (differentiable backward in ATen ops), inference
mode, the cases routed to ATen's composite (checked through the ops_report counters) and the
native-kernel switch.

Tolerances: float32 within 1e-5 (different summation order); bfloat16 2e-2, float16 2e-3 (one
rounding of a float32 result, as ATen computes rms_norm in float32 for them too)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import openneuron

DEV = torch.device("neuron:0")
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
DTYPES = list(TOL)
FWD = "aten::rms_norm"
BWD = "aten::_rms_norm_backward (native)"


def native_calls(op: str) -> int:
    return sum(r.calls for r in openneuron.ops_report(print_table=False)
               if r.op == op and r.path == "native")


def close(neuron, cpu, dtype, scale=1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(neuron.cpu(), cpu, **tol)


@pytest.fixture
def native_off():
    torch.ops.openneuron._set_native_kernels(False)
    yield
    torch.ops.openneuron._set_native_kernels(True)


def run_both(x, norm, w, eps, grad):
    """rms_norm forward + backward on CPU and on neuron; returns (cpu, neuron) tuples of
    (y, dx, dw)."""
    out = []
    for dev in ("cpu", DEV):
        xd = x.detach().to(dev).requires_grad_()
        wd = w.detach().to(dev).requires_grad_() if w is not None else None
        y = F.rms_norm(xd, norm, wd, eps)
        y.backward(grad.to(dev))
        out.append((y.detach(), xd.grad, wd.grad if wd is not None else None))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("shape,norm", [((8, 256), (256,)), ((3, 5, 7, 6), (7, 6)),
                                        ((2, 3, 33), (33,)), ((1, 1), (1,))])
def test_rms_norm_forward_backward(dtype, affine, eps, shape, norm):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 2 + 0.5).to(dtype)
    w = (torch.rand(norm) + 0.5).to(dtype) if affine else None
    g = torch.randn(shape).to(dtype)
    f0, b0 = native_calls(FWD), native_calls(BWD)
    (y, dx, dw), (yn, dxn, dwn) = run_both(x, norm, w, eps, g)
    assert native_calls(FWD) == f0 + 1 and native_calls(BWD) == b0 + 1
    assert yn.dtype == y.dtype and yn.shape == y.shape
    close(yn, y, dtype)
    close(dxn, dx, dtype, 4)
    if affine:
        close(dwn, dw, dtype, 8)  # summed over all rows


def test_eps_none_is_float32_epsilon():
    # Tiny inputs make eps dominate; ATen's default is the float32 epsilon for all three dtypes.
    x = torch.randn(4, 16) * 1e-4
    for dtype in DTYPES:
        xd = x.to(dtype)
        close(F.rms_norm(xd.to(DEV), (16,)), F.rms_norm(xd, (16,)), dtype)


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_mixed_weight_dtype(wdtype):
    torch.manual_seed(1)
    x = torch.randn(6, 40).to(torch.bfloat16 if wdtype == torch.float32 else torch.float32)
    w = torch.rand(40).to(wdtype) + 0.5
    g = torch.randn(6, 40).to(x.dtype)
    (y, dx, dw), (yn, dxn, dwn) = run_both(x, (40,), w, 1e-6, g)
    assert yn.dtype == y.dtype and dwn.dtype == dw.dtype
    close(yn, y, torch.bfloat16)
    close(dxn, dx, torch.bfloat16)
    close(dwn, dw, torch.bfloat16, 4)


def test_module_and_weight_only_grad():
    torch.manual_seed(2)
    m = nn.RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    mn = nn.RMSNorm(64, eps=1e-6).to(DEV)
    mn.load_state_dict(m.state_dict())
    x = torch.randn(10, 64)
    m(x).sum().backward()
    mn(x.to(DEV)).sum().backward()  # x does not require grad: only the weight gradient
    close(mn.weight.grad, m.weight.grad, torch.float32, 8)


def test_double_backward():
    torch.manual_seed(3)
    x = torch.randn(5, 12, dtype=torch.float32)
    w = torch.rand(12) + 0.5
    res = []
    for dev in ("cpu", DEV):
        xd = x.detach().to(dev).requires_grad_()
        wd = w.detach().to(dev).requires_grad_()
        y = F.rms_norm(xd, (12,), wd, 1e-5)
        (gx,) = torch.autograd.grad((y * y).sum(), xd, create_graph=True)
        gx.pow(2).sum().backward()
        res.append((gx.detach(), xd.grad, wd.grad))
    for a, b in zip(res[1], res[0]):
        close(a, b, torch.float32, 10)


def test_inference_mode_and_no_grad():
    x = torch.randn(7, 30)
    w = torch.rand(30)
    ref = F.rms_norm(x, (30,), w)
    f0 = native_calls(FWD)
    with torch.inference_mode():
        close(F.rms_norm(x.to(DEV), (30,), w.to(DEV)), ref, torch.float32)
    with torch.no_grad():
        close(F.rms_norm(x.to(DEV), (30,), w.to(DEV)), ref, torch.float32)
    assert native_calls(FWD) == f0 + 2


def test_non_contiguous_grad_output():
    x = torch.randn(4, 32)
    (_y, dx, _), (_yn, dxn, _) = run_both(x, (32,), None, None, torch.randn(32, 4).t())
    close(dxn, dx, torch.float32, 4)


@pytest.mark.parametrize("case", ["non_contiguous", "float64", "empty", "strided_weight"])
def test_fallback_cases_match_cpu(case):
    torch.manual_seed(4)
    x = torch.randn(6, 20)
    w = torch.rand(20) + 0.5
    if case == "float64":
        x, w = x.double(), w.double()
    elif case == "empty":
        x = torch.randn(0, 20)
    f0 = native_calls(FWD)
    res = []
    for dev in ("cpu", DEV):
        xd = x.detach().to(dev)
        if case == "non_contiguous":  # same values, transposed storage
            xd = xd.t().contiguous().t()
            assert not xd.is_contiguous()
        xd.requires_grad_()
        wd = w.detach().to(dev)
        if case == "strided_weight":  # same values, every other element of a buffer
            wd = wd.repeat_interleave(2)[::2]
            assert not wd.is_contiguous()
        wd.requires_grad_()
        y = F.rms_norm(xd, (20,), wd, 1e-5)
        y.sum().backward()
        res.append((y.detach(), xd.grad, wd.grad))
    assert native_calls(FWD) == f0  # ATen's composite
    for a, b in zip(res[1], res[0]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def test_switch_off_takes_the_composite(native_off):
    x = torch.randn(4, 50, requires_grad=True)
    xn = x.detach().to(DEV).requires_grad_()
    f0, b0 = native_calls(FWD), native_calls(BWD)
    y, yn = F.rms_norm(x, (50,)), F.rms_norm(xn, (50,))
    y.sum().backward()
    yn.sum().backward()
    assert native_calls(FWD) == f0 and native_calls(BWD) == b0
    close(yn.detach(), y.detach(), torch.float32)
    close(xn.grad, x.grad, torch.float32, 4)


def test_bad_shapes_raise_torch_errors():
    x = torch.randn(4, 10, device=DEV)
    with pytest.raises(RuntimeError, match="normalized_shape|shape"):
        F.rms_norm(x, (11,))
    with pytest.raises(RuntimeError, match="weight|shape"):
        F.rms_norm(x, (10,), torch.ones(9, device=DEV))


# ---- cross-entropy ---------------------------------------------------------------------------
# The fused kernel runs for float32 2-D logits with at least 512 classes (fewer classes and
# bf16/fp16 measured slower than the composite path and take it; see native_norms.cpp).
CE_FWD = "aten::cross_entropy_loss"
CE_BWD = "aten::_cross_entropy_loss_backward (native)"


def ce_both(x, t, **kw):
    out = []
    for dev in ("cpu", DEV):
        xd = x.detach().to(dev).requires_grad_()
        loss = F.cross_entropy(xd, t.to(dev), **kw)
        g = torch.rand(loss.shape, generator=torch.Generator().manual_seed(9)).to(x.dtype)
        loss.backward(g.to(dev))
        out.append((loss.detach(), xd.grad))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [None, -100, 3])
@pytest.mark.parametrize("shape", [(37, 512), (4, 1000)])
def test_cross_entropy_forward_backward(dtype, reduction, ignore, shape):
    torch.manual_seed(5)
    rows, classes = shape
    x = (torch.randn(shape) * 3).to(dtype)
    t = torch.randint(0, classes, (rows,))
    kw = {"reduction": reduction}
    if ignore is not None:
        t[::3] = ignore
        kw["ignore_index"] = ignore
    f0, b0 = native_calls(CE_FWD), native_calls(CE_BWD)
    (l, dx), (ln, dxn) = ce_both(x, t, **kw)
    # float32 only: bf16/fp16 measured slower than the composite and take it.
    n = 1 if dtype == torch.float32 else 0
    assert native_calls(CE_FWD) == f0 + n and native_calls(CE_BWD) == b0 + n
    assert ln.dtype == l.dtype and ln.shape == l.shape
    close(ln, l, dtype, 4 if reduction != "none" else 1)  # ATen sums rounded rows in bf16/fp16
    close(dxn, dx, dtype)


def test_cross_entropy_all_ignored():
    x = torch.randn(4, 600)
    t = torch.full((4,), -100)
    (l, dx), (ln, dxn) = ce_both(x, t)
    assert torch.isnan(l) and torch.isnan(ln.cpu())
    torch.testing.assert_close(dxn.cpu(), dx)


def test_cross_entropy_bad_target_raises():
    x = torch.randn(4, 600, device=DEV)
    t = torch.tensor([0, 1, 600, 2], device=DEV)
    with pytest.raises(RuntimeError, match="cross_entropy: 1 targets are out of range"):
        F.cross_entropy(x, t).cpu()
    torch.neuron.synchronize()


def test_cross_entropy_double_backward():
    torch.manual_seed(6)
    x = torch.randn(6, 512)
    t = torch.randint(0, 512, (6,))
    res = []
    for dev in ("cpu", DEV):
        xd = x.detach().to(dev).requires_grad_()
        (gx,) = torch.autograd.grad(F.cross_entropy(xd, t.to(dev)), xd, create_graph=True)
        gx.pow(2).sum().backward()
        res.append((gx.detach(), xd.grad))
    for a, b in zip(res[1], res[0]):
        close(a, b, torch.float32, 10)


@pytest.mark.parametrize("case", ["few_classes", "weight", "label_smoothing", "3d", "prob_targets",
                                  "float64", "non_contiguous", "switch_off"])
def test_cross_entropy_fallback_cases_match_cpu(case):
    torch.manual_seed(7)
    x = torch.randn(8, 512)
    t = torch.randint(0, 512, (8,))
    kw = {}
    if case == "few_classes":
        x, t = torch.randn(8, 100), torch.randint(0, 100, (8,))
    elif case == "weight":
        kw["weight"] = torch.rand(512)
    elif case == "label_smoothing":
        kw["label_smoothing"] = 0.1
    elif case == "3d":
        x, t = torch.randn(2, 512, 3), torch.randint(0, 512, (2, 3))
    elif case == "prob_targets":
        t = torch.softmax(torch.randn(8, 512), 1)
    elif case == "float64":
        x = x.double()
    f0 = native_calls(CE_FWD)
    if case == "switch_off":
        torch.ops.openneuron._set_native_kernels(False)
    try:
        res = []
        for dev in ("cpu", DEV):
            xd = x.detach().to(dev)
            if case == "non_contiguous":
                xd = xd.t().contiguous().t()
            xd.requires_grad_()
            kwd = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
            loss = F.cross_entropy(xd, t.to(dev), **kwd)
            loss.backward()
            res.append((loss.detach(), xd.grad))
    finally:
        torch.ops.openneuron._set_native_kernels(True)
    assert native_calls(CE_FWD) == f0
    for a, b in zip(res[1], res[0]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)
