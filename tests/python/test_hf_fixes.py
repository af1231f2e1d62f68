# Regression tests for backend fixes found by running Hugging Face models on neuron
# (tests/python/test_hf_models.py, test_generate.py). Each test names the fix it guards; the
# reference is CPU PyTorch, or CUDA's documented semantics where ATen's CPU kernel lacks a dtype.
import pytest
import torch

import openneuron


def _paths(op: str) -> set[str]:
    return {r.path for r in openneuron.ops_report(print_table=False) if r.op == op}


def _histc_int_reference(x: torch.Tensor, bins: int, lo: int, hi: int) -> torch.Tensor:
    """CUDA's histc for integer input: int64 bin arithmetic, data range when min == max."""
    v = x.reshape(-1).long()
    if lo == hi:
        if v.numel():
            lo, hi = v.min().item(), v.max().item()
        if lo == hi:
            lo, hi = lo - 1, hi + 1
    keep = (v >= lo) & (v <= hi)
    b = ((v - lo) * bins // (hi - lo)).clamp(0, bins - 1)[keep]
    return torch.bincount(b, minlength=bins).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (49, 0, 49), (7, -2, 50), (5, 0, 0)])
def test_histc_integer_input_counts_like_cuda(device, dtype, bins, lo, hi):
    # Fix: histc on integer tensors (CPU's histogram kernel raises "not implemented for 'Int'";
    # CUDA counts them). Mixtral/Qwen-MoE's grouped_mm experts call histc on int32 expert ids.
    lo = max(lo, 0) if dtype == torch.uint8 else lo  # uint8 holds no negative bound
    g = torch.Generator().manual_seed(bins)
    x = torch.randint(0 if dtype == torch.uint8 else -5, 60, (257,), generator=g, dtype=dtype)
    openneuron.ops_report(print_table=False, reset=True)
    got = torch.histc(x.to(device), bins=bins, min=lo, max=hi)
    assert got.device == device and got.dtype == dtype
    assert torch.equal(got.cpu(), _histc_int_reference(x, bins, lo, hi))
    assert "sync" not in _paths("aten::histc") and "fallback" not in _paths("aten::histc")


def test_histc_integer_constant_and_empty_input(device):
    x = torch.full((6,), 3, dtype=torch.int32)
    assert torch.equal(torch.histc(x.to(device), bins=3).cpu(), _histc_int_reference(x, 3, 0, 0))
    e = torch.empty(0, dtype=torch.int64)
    assert torch.equal(torch.histc(e.to(device), bins=4).cpu(), torch.zeros(4, dtype=torch.int64))


def test_histc_integer_bad_range_raises_clear_error(device):
    x = torch.arange(5, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"histc: max must be larger than min.*neuron"):
        torch.histc(x, bins=4, min=3, max=1)


@pytest.mark.parametrize("lo,hi", [(0.0, 3.0), (0.0, 0.0)])
def test_histc_float_is_asynchronous_and_matches_cpu(device, lo, hi):
    # Fix: histc was listed as data-dependent (synchronous), but its output is always (bins,):
    # it now takes the asynchronous path (no host wait), which transformers' MoE relies on.
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 2
    openneuron.ops_report(print_table=False, reset=True)
    got = torch.histc(x.to(device), bins=9, min=lo, max=hi)
    assert _paths("aten::histc") == {"async"}
    assert torch.equal(got.cpu(), torch.histc(x, bins=9, min=lo, max=hi))


def test_compile_backend_neuron_is_registered_and_matches_eager(device):
    # Fix: transformers' generate() with a static KV cache compiles the decoding step with
    # torch.compile(backend=model.device.type), i.e. "neuron", which did not exist ("Invalid
    # backend: 'neuron'"). The backend comes from the torch_dynamo_backends entry point.
    import torch._dynamo

    assert "neuron" in torch._dynamo.list_backends(exclude_tags=())

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).softmax(-1).sum(0)

    g = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(6, 8, generator=g), torch.randn(8, 5, generator=g)
    x = x0.to(device).requires_grad_()
    xe = x0.to(device).requires_grad_()
    out = torch.compile(f, backend="neuron", mode="reduce-overhead")(x, w0.to(device))
    ref = f(xe, w0.to(device))
    out.sum().backward()
    ref.sum().backward()
    assert out.device == device
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.cpu(), xe.grad.cpu(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ref.cpu(), f(x0, w0), rtol=1e-5, atol=1e-6)


def test_histc_out_integer_input(device):
    x = torch.randint(0, 10, (50,), dtype=torch.int32, generator=torch.Generator().manual_seed(4))
    out = torch.empty(0, dtype=torch.int32, device=device)
    res = torch.histc(x.to(device), bins=5, min=0, max=9, out=out)
    assert res is out and out.shape == (5,)
    assert torch.equal(out.cpu(), _histc_int_reference(x, 5, 0, 9))
    with pytest.raises(RuntimeError, match=r"histc: out has dtype Float.*Int"):
        torch.histc(x.to(device), bins=5, out=torch.empty(5, device=device))
    f = torch.randn(50)
    fo = torch.empty(0, device=device)
    torch.histc(f.to(device), bins=5, min=-1, max=1, out=fo)
    assert torch.equal(fo.cpu(), torch.histc(f, bins=5, min=-1, max=1))


def test_compile_backend_neuron_trains_hf_llama_like_cpu(device):
    # torch.compile(model, backend="neuron") on a whole HF model: forward and backward graphs
    # (AOTAutograd) give CPU eager's loss and gradients.
    import copy

    import test_hf_models as hf

    cpu_model = hf.build_model("llama")
    neuron_model = torch.compile(copy.deepcopy(cpu_model).to(device), backend="neuron")
    batch = hf.make_batch("llama")
    ref_loss, ref_logits, ref_grads, _ = hf.train_step(cpu_model, batch, torch.device("cpu"))
    loss, logits, grads, _ = hf.train_step(neuron_model, batch, device)
    torch.testing.assert_close(loss, ref_loss, **hf.LOSS_TOL)
    torch.testing.assert_close(logits, ref_logits, **hf.LOGITS_TOL)
    grads = {k.removeprefix("_orig_mod."): g for k, g in grads.items()}
    assert grads.keys() == ref_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(g, ref_grads[n], **hf.GRAD_TOL, msg=n)


@pytest.mark.parametrize("fusion", [False, True])
def test_results_stay_on_the_inputs_device_under_adaptive_eager(fusion):
    # Fix: device_empty() allocated on the *current* device whatever device it was given; the
    # adaptive-eager recorder calls it outside a DeviceGuard, so with fusion on, torch.where on
    # neuron:1 tensors returned a neuron:0 tensor and Llama's causal mask (where(mask, 0, -inf))
    # broke a neuron:1 training step ("found at least two devices, neuron:1 and neuron:0").
    dev1 = torch.device("neuron:1")
    g = torch.Generator().manual_seed(0)
    c = torch.rand(12, 12, generator=g) > 0.5
    a, b, x = torch.tensor(0.0), torch.tensor(-1.0), torch.randn(12, 12, generator=g)
    cases = {
        "where(tensor, 0-dim, 0-dim)": lambda c, a, b, x: torch.where(c, a, b),
        "where(tensor, scalar, 0-dim)": lambda c, a, b, x: torch.where(c, 1.5, b),
        "where(tensor, tensor, scalar)": lambda c, a, b, x: torch.where(c, x, -2.0),
        "chain": lambda c, a, b, x: (x * 2 + a).sigmoid() * x,
    }
    with torch.neuron.fusion_enabled(fusion):
        got = {k: f(c.to(dev1), a.to(dev1), b.to(dev1), x.to(dev1)) for k, f in cases.items()}
        torch.neuron.fusion_flush()
    for k, f in cases.items():
        assert got[k].device == dev1 and got[k].untyped_storage().device == dev1, k
        torch.testing.assert_close(got[k].cpu(), f(c, a, b, x), rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("reduction,zero_infinity", [("mean", False), ("sum", True)])
def test_ctc_loss_backward_is_asynchronous_and_matches_cpu(device, reduction, zero_infinity):
    # Fix: _ctc_loss_backward had no meta kernel, so CTC training (Wav2Vec2ForCTC, HubertForCTC,
    # nn.CTCLoss) took the warned synchronous fallback every step. compat_ops.cpp gives it one.
    g = torch.Generator().manual_seed(0)
    T_, N, C, S = 30, 3, 6, 8
    logits = torch.randn(T_, N, C, generator=g)
    targets = torch.randint(1, C, (N, S), generator=g)
    input_lengths = torch.tensor([30, 25, 20])
    target_lengths = torch.tensor([8, 5, 12 - 9])

    def run(dev):
        x = logits.to(dev).detach().requires_grad_()
        loss = torch.nn.functional.ctc_loss(
            x.log_softmax(-1), targets.to(dev), input_lengths.to(dev), target_lengths.to(dev),
            reduction=reduction, zero_infinity=zero_infinity)
        loss.backward()
        return loss.detach().cpu(), x.grad.cpu()

    ref_loss, ref_grad = run("cpu")
    openneuron.ops_report(print_table=False, reset=True)
    loss, grad = run(device)
    assert _paths("aten::_ctc_loss_backward") == {"async"}
    assert _paths("aten::_ctc_loss") == {"async"}
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-7)


def test_ctc_loss_backward_meta_shape():
    lp = torch.empty(30, 3, 6, device="meta")
    out = torch.ops.aten._ctc_loss_backward(
        torch.empty(3, device="meta"), lp, torch.empty(3, 8, dtype=torch.long, device="meta"),
        [30, 25, 20], [8, 5, 3], torch.empty(3, device="meta"),
        torch.empty(3, 30, 17, device="meta"), 0, False)
    assert out.shape == lp.shape and out.dtype == lp.dtype and out.is_contiguous()
