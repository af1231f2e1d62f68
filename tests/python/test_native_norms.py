"""Native RMS norm (csrc/kernels/rms_norm.*, csrc/aten/ops/native_norms.cpp) on the neuron
device against CPU PyTorch: forward results, input and weight gradients, dtypes, eps None,
multi-dim normalized shapes, double backward (differentiable backward in ATen ops), inference
mode, the cases routed to ATen's composite (checked through the ops_report counters) and the
native-kernel switch.

Tolerances: float32 within 1e-5 (different summation order); bfloat16 2e-2, float16 2e-3 (one
rounding of a float32 result, as ATen computes rms_norm in float32 for them too)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import openneuron

DEV = torch.device("neuron:0")
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
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
    (y, dx, _), (yn, dxn, _) = run_both(x, (32,), None, None, torch.randn(32, 4).t())
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
