# NKI kernels with PyTorch: launches on neuron tensors (queued on the current stream) against
# the same kernel on numpy arrays, custom ops (fake implementation from the trace, one node
# under torch.compile, autograd), a GPT training step with the NKI RMSNorm example against ATen's
# RMSNorm, the flash-attention example against SDPA, and alias() for unchanged kernel files.
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import openneuron.nki.language as nl
from openneuron import nki

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@nki.jit
def saxpy(x, y, alpha=2.0):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    for t in nl.affine_range((x.shape[0] + 127) // 128):
        rows = t * 128 + i_p
        a = nl.load(x[rows, i_f], mask=rows < x.shape[0])
        b = nl.load(y[rows, i_f], mask=rows < x.shape[0])
        nl.store(out[rows, i_f], nl.add(nl.multiply(a, alpha), b), mask=rows < x.shape[0])
    return out


@nki.jit
def cast_copy(x, dtype):
    out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


@pytest.mark.parametrize("src, dst", [(torch.float32, torch.float8_e4m3fn),
                                      (torch.float8_e4m3fn, torch.float8_e5m2),
                                      (torch.float8_e5m2, torch.float32),
                                      (torch.float32, torch.uint16), (torch.int16, torch.uint32)])
def test_neuron_tensors_of_narrow_dtypes(device, src, dst):
    x = (torch.randn(128, 40) * 300).to(src)
    name = {torch.float8_e4m3fn: "float8_e4m3"}.get(dst, str(dst).replace("torch.", ""))
    out = cast_copy(x.to(device), getattr(nl, name))
    assert out.device == device and out.dtype == dst
    host = cast_copy(x, getattr(nl, name))  # the same kernel on CPU tensors
    assert torch.equal(out.cpu().view(torch.uint8), host.view(torch.uint8))
    if dst.is_floating_point:
        assert torch.equal(host.view(torch.uint8), x.float().to(dst).view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_neuron_tensors_match_numpy(device, dtype):
    x, y = torch.randn(300, 96), torch.randn(300, 96)
    host = saxpy(x.float().numpy(), y.float().numpy(), 3.0)
    out = saxpy(x.to(device, dtype), y.to(device, dtype), 3.0)
    assert out.device == device and out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    ref = torch.from_numpy(host) if dtype == torch.float32 else (3 * x.to(dtype).float() +
                                                                 y.to(dtype).float())
    torch.testing.assert_close(out.cpu().float(), ref, rtol=tol, atol=tol)


def test_queued_after_producers_and_on_a_side_stream(device):
    x = torch.randn(256, 64, device=device)
    y = torch.randn(256, 64, device=device)
    x2 = x * 5  # queued producer: the kernel must read its result
    s = torch.neuron.Stream()
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        out = saxpy(x2, y, 1.0)
    torch.neuron.current_stream().wait_stream(s)
    torch.testing.assert_close(out.cpu(), (x * 5 + y).cpu())


def test_non_contiguous_inputs_and_written_argument(device):
    @nki.jit
    def into(a, out):
        nl.store(out, nl.exp(nl.load(a)))

    a = torch.randn(64, 32, device=device).t()  # non-contiguous
    out = torch.zeros(32, 64, device=device).t().contiguous().t()  # non-contiguous target
    into(a, out)
    torch.testing.assert_close(out.cpu(), a.cpu().exp())


def test_mixed_numpy_and_neuron_is_an_error(device):
    with pytest.raises(nki.NkiError, match="mix of neuron tensors"):
        saxpy(torch.randn(8, 8, device=device), np.ones((8, 8), np.float32))


saxpy_op = nki.custom_op("nki_tests::saxpy", saxpy)
saxpy_op.register_autograd(
    lambda ctx, g: (g * ctx.alpha, g, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "alpha", inputs[2]))


def test_custom_op_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(130, 16, device="neuron")
        out = saxpy_op(x, x, 2.0)
        assert out.shape == (130, 16) and out.dtype == torch.float32


def test_custom_op_one_node_under_torch_compile(device):
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, y):
        return torch.relu(saxpy_op(x, y, 3.0)) + 1

    x, y = torch.randn(200, 32, device=device), torch.randn(200, 32, device=device)
    out = torch.compile(f, backend=backend, fullgraph=True)(x, y)
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.nki_tests.saxpy.default) == 1
    torch.testing.assert_close(out.cpu(), (torch.relu(3 * x + y) + 1).cpu())
    inductor = torch.compile(f)(x, y)  # the default backend: Inductor on neuron
    torch.testing.assert_close(inductor.cpu(), out.cpu())


def test_autograd_through_custom_op(device):
    x = torch.randn(150, 24, device=device, requires_grad=True)
    y = torch.randn(150, 24, device=device, requires_grad=True)
    (saxpy_op(x, y, 2.5) * torch.arange(24.0, device=device)).sum().backward()
    w = torch.arange(24.0).expand(150, 24)
    torch.testing.assert_close(x.grad.cpu(), 2.5 * w)
    torch.testing.assert_close(y.grad.cpu(), w)


def _examples():
    sys.path.insert(0, str(EXAMPLES / "nki"))
    sys.path.insert(0, str(EXAMPLES))
    import flash_attention
    import rmsnorm
    return rmsnorm, flash_attention


def test_rmsnorm_kernels_vs_aten(device):
    rmsnorm, _ = _examples()
    x = torch.randn(300, 128, device=device, requires_grad=True)
    w = torch.randn(128, device=device, requires_grad=True)
    out, _ = rmsnorm.rmsnorm_op(x, w, 1e-6)
    ref = torch.nn.functional.rms_norm(x, (128,), w, 1e-6)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (x, w), g),
                               torch.autograd.grad(ref, (x, w), g), rtol=1e-4, atol=1e-4)


def test_training_step_with_nki_rmsnorm():
    rmsnorm, _ = _examples()
    nki_losses = rmsnorm.train("nki", 4)
    aten_losses = rmsnorm.train("aten", 4)
    np.testing.assert_allclose(nki_losses, aten_losses, rtol=1e-4)
    assert nki_losses[-1] < nki_losses[0]


def test_training_step_with_nki_rmsnorm_compiled():
    rmsnorm, _ = _examples()
    np.testing.assert_allclose(rmsnorm.train("nki", 2, compile=True),
                               rmsnorm.train("aten", 2), rtol=1e-4)


def test_flash_attention_example_vs_sdpa(device):
    _, fa = _examples()
    q, k, v = (torch.randn(1, 2, 256, 32, device=device, requires_grad=True) for _ in range(3))
    out = fa.flash_attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (q, k, v), g),
                               torch.autograd.grad(ref, (q, k, v), g), rtol=1e-4, atol=1e-4)


def test_alias_runs_kernel_files_unchanged(run_py):
    r = run_py("""
        import sys
        assert "neuronxcc" not in sys.modules and "nki" not in sys.modules
        import openneuron.nki
        assert "neuronxcc" not in sys.modules and "nki" not in sys.modules  # opt-in only
        openneuron.nki.alias()
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl
        import neuronxcc.nki.isa as nisa
        import nki as nki0
        import nki.isa as nisa0
        import nki.language as nl0
        assert nki is nki0 is openneuron.nki and nisa is nisa0 and nl is nl0
        from neuronxcc.nki.isa.constants import dge_mode, oob_mode
        from nki.isa.constants import engine
        import neuronxcc.nki.compiler as ncc
        assert dge_mode is nisa.dge_mode and oob_mode is nisa.oob_mode and engine is nisa.engine
        assert ncc is openneuron.nki.compiler

        @nki.jit
        def beta1(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nisa.activation(op=nl.exp, data=nl.load(a)))
            return out

        @nki0.jit
        def zero_x(a):
            out = nl0.ndarray(a.shape, dtype=a.dtype, buffer=nl0.shared_hbm)
            t = nl0.ndarray(a.shape, dtype=a.dtype, buffer=nl0.sbuf)
            nisa0.dma_copy(dst=t, src=a)
            nisa0.activation(dst=t, op=nl0.exp, data=t)
            nisa0.dma_copy(dst=out, src=t)
            return out

        a = np.random.rand(64, 32).astype(np.float32)
        np.testing.assert_allclose(beta1(a), np.exp(a), rtol=1e-6)
        np.testing.assert_allclose(nki0.simulate(zero_x)(a), np.exp(a), rtol=1e-6)
        np.testing.assert_allclose(nki0.simulate(zero_x[2])(a), np.exp(a), rtol=1e-6)
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


@nki.jit
def _two_outputs(x):
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)

    def twice(v):  # a helper's return is not the kernel's
        return nl.multiply(v, 2.0)

    nl.store(a, twice(t))
    nl.store(b, nl.negative(t))
    return a, b


@nki.jit
def _in_place(x):
    nl.store(x, nl.multiply(nl.load(x), 2.0))


@nki.jit
def _listed(x):
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(a, nl.load(x))
    outs = [a, a]
    return outs


def test_custom_op_reads_the_number_of_outputs_from_the_kernel(device):
    two = nki.custom_op("nki_tests::two_outputs", _two_outputs)
    x = torch.randn(128, 64)
    a, b = two(x.to(device))
    np.testing.assert_allclose(a.cpu().numpy(), 2 * x.numpy(), rtol=1e-6)
    np.testing.assert_allclose(b.cpu().numpy(), -x.numpy(), rtol=1e-6)
    inplace = nki.custom_op("nki_tests::in_place", _in_place, mutates_args=("x",))
    xd = x.to(device)
    assert inplace(xd) is None
    np.testing.assert_allclose(xd.cpu().numpy(), 2 * x.numpy(), rtol=1e-6)
    assert saxpy_op(x.to(device), x.to(device)).shape == x.shape  # `return out`: one
    # a name read as one tensor that turns out to be two: said at the call
    listed = nki.custom_op("nki_tests::listed", _listed)
    with pytest.raises(Exception, match=r"returns 2 tensor\(s\); read from its return "
                                         r"statements: num_outputs=1; pass num_outputs=2"):
        listed(x.to(device))


def test_custom_op_whose_outputs_the_source_does_not_show_asks_for_num_outputs():
    def made(x):
        return make_outputs(x)  # noqa: F821 - never called

    def mixed(x, flag=False):
        if flag:
            return x, x
        return x

    with pytest.raises(nki.NkiError, match=r"returns `make_outputs\(x\)` \(line 2.*pass num_outputs="):
        nki.custom_op("nki_tests::made", made)
    with pytest.raises(nki.NkiError, match=r"returns \[1, 2\] tensors on different paths"):
        nki.custom_op("nki_tests::mixed", mixed)
