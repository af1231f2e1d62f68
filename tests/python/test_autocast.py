# torch.autocast(device_type="neuron"): the policy registered under AutocastPrivateUse1
# (csrc/aten/autocast.cpp) mirrors CUDA's op lists. Output dtypes per op category, values
# against the same op run on CPU in the dtype the policy picks (and against CPU autocast for a
# model), nesting, disabled regions, the weight-cast cache and unsupported dtypes.
import warnings

import pytest
import torch
import torch.nn.functional as F

LOW = [torch.bfloat16, torch.float16]


def _r(*shape):
    return torch.randn(*shape, generator=_r.gen)


_r.gen = torch.Generator().manual_seed(0)

# Ops that run in the autocast dtype (CUDA's lower_precision_fp list); inputs are float32.
LOWER_PRECISION = {
    "mm": (torch.mm, lambda: (_r(8, 16), _r(16, 4))),
    "matmul": (torch.matmul, lambda: (_r(2, 8, 16), _r(16, 4))),
    "linear": (F.linear, lambda: (_r(8, 16), _r(4, 16), _r(4))),
    "bmm": (torch.bmm, lambda: (_r(3, 8, 16), _r(3, 16, 4))),
    "baddbmm": (torch.baddbmm, lambda: (_r(3, 8, 4), _r(3, 8, 16), _r(3, 16, 4))),
    "addmm": (torch.addmm, lambda: (_r(8, 4), _r(8, 16), _r(16, 4))),
    "addbmm": (torch.addbmm, lambda: (_r(8, 4), _r(3, 8, 16), _r(3, 16, 4))),
    "mv": (torch.mv, lambda: (_r(8, 16), _r(16))),
    "addmv": (torch.addmv, lambda: (_r(8), _r(8, 16), _r(16))),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: (_r(8, 16), _r(16, 4))),
    "conv1d": (F.conv1d, lambda: (_r(2, 3, 16), _r(5, 3, 3))),
    "conv2d": (F.conv2d, lambda: (_r(2, 3, 8, 8), _r(5, 3, 3, 3), _r(5))),
    "conv_transpose2d": (F.conv_transpose2d, lambda: (_r(2, 3, 6, 6), _r(3, 5, 3, 3))),
    "prelu": (F.prelu, lambda: (_r(2, 3, 4), torch.full((3,), 0.25))),
    "sdpa": (F.scaled_dot_product_attention, lambda: (_r(2, 4, 8, 16),) * 3),
}

# Ops that run in float32 (CUDA's fp32 and fp32_set_opt_dtype lists); inputs are low precision.
FP32 = {
    "exp": (torch.exp, lambda: (_r(8, 8),)),
    "log": (torch.log, lambda: (_r(8, 8).abs() + 0.1,)),
    "pow": (lambda a: torch.pow(a, 2.5), lambda: (_r(8, 8).abs(),)),
    "rsqrt": (torch.rsqrt, lambda: (_r(8, 8).abs() + 0.1,)),
    "softplus": (F.softplus, lambda: (_r(8, 8),)),
    "softmax": (lambda a: torch.softmax(a, -1), lambda: (_r(8, 8),)),
    "log_softmax": (lambda a: F.log_softmax(a, -1), lambda: (_r(8, 8),)),
    "layer_norm": (lambda a: F.layer_norm(a, (8,)), lambda: (_r(4, 8),)),
    "group_norm": (lambda a: F.group_norm(a, 2), lambda: (_r(2, 4, 5),)),
    "sum": (torch.sum, lambda: (_r(8, 8),)),
    "cumsum": (lambda a: torch.cumsum(a, 0), lambda: (_r(8, 8),)),
    "logsumexp": (lambda a: torch.logsumexp(a, -1), lambda: (_r(8, 8),)),
    "norm": (torch.norm, lambda: (_r(8, 8),)),
    "mse_loss": (F.mse_loss, lambda: (_r(8, 8), _r(8, 8))),
    "l1_loss": (F.l1_loss, lambda: (_r(8, 8), _r(8, 8))),
    "bce_with_logits": (F.binary_cross_entropy_with_logits,
                        lambda: (_r(8, 8), torch.rand(8, 8, generator=_r.gen))),
    "cosine_similarity": (F.cosine_similarity, lambda: (_r(8, 8), _r(8, 8))),
}

# Mixed-type ops: the widest floating input type wins (CUDA's promote list).
PROMOTE = {
    "addcmul": (torch.addcmul, lambda: (_r(8), _r(8), _r(8))),
    "addcdiv": (torch.addcdiv, lambda: (_r(8), _r(8), _r(8).abs() + 1)),
    "atan2": (torch.atan2, lambda: (_r(8), _r(8), _r(8))[:2]),
    "dot": (torch.dot, lambda: (_r(8), _r(8))),
    "cross": (lambda a, b: torch.cross(a, b, dim=1), lambda: (_r(4, 3), _r(4, 3))),
}


def _run(fn, inputs, device, dtype, **kw):
    with torch.autocast(device_type="neuron", dtype=dtype, **kw):
        return fn(*[t.to(device) for t in inputs])


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(LOWER_PRECISION))
def test_lower_precision_ops(name, dtype, device):
    fn, make = LOWER_PRECISION[name]
    inputs = make()
    out = _run(fn, inputs, device, dtype)
    assert out.device == device and out.dtype == dtype
    ref = fn(*[t.to(dtype) for t in inputs])  # what the policy does, on CPU
    torch.testing.assert_close(out.cpu(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", ["mm", "linear", "bmm", "baddbmm", "addmm", "conv2d", "sdpa"])
def test_values_close_to_cpu_autocast_bf16(name, device):
    fn, make = LOWER_PRECISION[name]
    inputs = make()
    out = _run(fn, inputs, device, torch.bfloat16)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ref = fn(*inputs)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(FP32))
def test_fp32_ops(name, dtype, device):
    fn, make = FP32[name]
    inputs = [t.to(dtype) for t in make()]
    out = _run(fn, inputs, device, dtype)
    assert out.dtype == torch.float32
    ref = fn(*[t.float() for t in inputs])
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(PROMOTE))
def test_promote_ops(name, dtype, device):
    fn, make = PROMOTE[name]
    inputs = make()
    mixed = [inputs[0].to(dtype)] + list(inputs[1:])
    assert _run(fn, mixed, device, dtype).dtype == torch.float32
    low = [t.to(dtype) for t in inputs]
    out = _run(fn, low, device, dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu(), fn(*low), atol=1e-2, rtol=1e-2)


def test_index_put_promotes(device):
    x = torch.zeros(8, device=device, dtype=torch.bfloat16)
    idx = torch.tensor([1, 3], device=device)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.index_put(x, (idx,), torch.ones(2, device=device))
    assert out.dtype == torch.float32
    assert out.cpu().tolist() == [0, 1, 0, 1, 0, 0, 0, 0]


def test_ops_without_policy_and_ineligible_inputs_untouched(device):
    a = torch.randn(4, 4, device=device)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (a + a).dtype == torch.float32
        assert torch.relu(a.bfloat16()).dtype == torch.bfloat16
        assert a.double().mm(a.double()).dtype == torch.float64
        i = torch.arange(16, device=device).view(4, 4)
        assert i.mm(i).dtype == torch.int64
        cpu = torch.randn(4, 4)
        assert cpu.mm(cpu).dtype == torch.float32, "neuron autocast must not touch CPU tensors"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert a.mm(a).dtype == torch.float32, "CPU autocast must not touch neuron tensors"


def test_binary_cross_entropy_is_banned(device):
    p = torch.rand(4, device=device)
    with (
        torch.autocast("neuron", dtype=torch.float16),
        pytest.raises(RuntimeError, match="unsafe to autocast"),
    ):
        F.binary_cross_entropy(p, p)


def test_state_queries_behave_as_for_cuda():
    assert torch.amp.is_autocast_available("neuron")
    assert torch.get_autocast_dtype("neuron") == torch.float16  # the default, as for cuda
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        assert not torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    assert not torch.is_autocast_enabled("neuron")
    assert torch.get_autocast_dtype("neuron") == torch.float16
    assert set(torch.neuron.get_amp_supported_dtype()) == set(LOW)


def test_nested_and_disabled_regions(device):
    a = torch.randn(4, 4, device=device)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert a.mm(a).dtype == torch.bfloat16
        with torch.autocast("neuron", enabled=False):
            assert not torch.is_autocast_enabled("neuron")
            assert a.mm(a).dtype == torch.float32
        with torch.autocast("neuron", dtype=torch.float16):
            assert a.mm(a).dtype == torch.float16
        assert a.mm(a).dtype == torch.bfloat16
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16

    @torch.autocast("neuron", dtype=torch.bfloat16)
    def decorated(x):
        return x.mm(x)

    assert decorated(a).dtype == torch.bfloat16
    assert a.mm(a).dtype == torch.float32


def _weight_cast_node(out):
    return out.grad_fn.next_functions[1][0]


def test_weight_cast_cache(device):
    w = torch.randn(4, 4, device=device, requires_grad=True)
    x = torch.randn(4, 4, device=device)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y1, y2 = x.mm(w), x.mm(w)
        assert _weight_cast_node(y1) is _weight_cast_node(y2), "fp32 leaf weight cast once"
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y3 = x.mm(w)
    assert _weight_cast_node(y3) is not _weight_cast_node(y1), "cache cleared on exit"
    with torch.autocast("neuron", dtype=torch.bfloat16, cache_enabled=False):
        assert _weight_cast_node(x.mm(w)) is not _weight_cast_node(x.mm(w))
    (y1.float().sum() + y2.float().sum()).backward()
    assert w.grad.dtype == torch.float32
    expected = 2 * x.bfloat16().cpu().t().mm(torch.ones(4, 4, dtype=torch.bfloat16)).float()
    torch.testing.assert_close(w.grad.cpu(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_unsupported_dtype_warns_and_disables_like_cpu(dtype, device):
    a = torch.randn(4, 4, device=device)
    for dev in ("neuron", "cpu"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(dev, dtype=dtype):
                assert not torch.is_autocast_enabled(dev)
                if dev == "neuron":
                    assert a.mm(a).dtype == torch.float32
        msgs = [str(w.message) for w in caught]
        assert any("target dtype is not supported. Disabling autocast" in m for m in msgs), msgs
        if dev == "neuron":
            assert any("float16" in m and "bfloat16" in m for m in msgs), msgs


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    )


def test_model_forward_backward_close_to_cpu_autocast_bf16(device):
    cpu_model = _model()
    neuron_model = _model().to(device)
    x = torch.randn(8, 16)
    target = torch.randint(0, 10, (8,))
    grads = []
    for model, dev in ((cpu_model, "cpu"), (neuron_model, "neuron")):
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = model(x.to(dev))
            loss = F.cross_entropy(logits, target.to(dev))
        assert logits.dtype == torch.bfloat16
        loss.backward()
        grads.append((logits.float().cpu(), loss.cpu(), [p.grad.cpu() for p in model.parameters()]))
    (l_cpu, loss_cpu, g_cpu), (l_n, loss_n, g_n) = grads
    torch.testing.assert_close(l_n, l_cpu, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(loss_n, loss_cpu, atol=1e-2, rtol=1e-2)
    for gn, gc in zip(g_n, g_cpu, strict=True):
        assert gn.dtype == torch.float32
        torch.testing.assert_close(gn, gc, atol=3e-2, rtol=3e-2)
