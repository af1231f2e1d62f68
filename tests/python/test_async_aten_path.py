# The asynchronous ATen path (fallback.cpp): ATen's CPU kernel runs on the executor over views of
# the device tensors, its outputs sized ahead from the meta cache (meta_cache.cpp, keyed by the
# call's signature in a reused per-thread buffer) and copied into the device tensors (one memcpy
# when small, dense and of the same dtype, else ATen's copy_). Checked bit for bit against CPU:
# sizes around ATen's grain size, empty outputs, several dtypes, conjugate inputs and multiple
# returns; signatures that alternate; ops on a device that is not current (the tensor's device is
# made current only for the call); and ops given meta kernels so they stay asynchronous (histc,
# CTC loss backward).
import pytest
import torch

import openneuron

GRAIN = 32768  # at::internal::GRAIN_SIZE


def _paths(op: str) -> set[str]:
    return {r.path for r in openneuron.ops_report(print_table=False) if r.op == op}


@pytest.mark.parametrize("n", [0, 1, 100, GRAIN - 1, GRAIN, GRAIN + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_unary_results_across_sizes(n, dtype):
    x = (torch.randn(n) * 10).to(dtype)
    for fn in (torch.relu, torch.abs, lambda t: torch.clamp(t, min=-2, max=3)):
        ref = fn(x)
        got = fn(x.to("neuron"))
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(got.cpu(), ref)


def test_complex_and_conjugate_inputs():
    z = torch.randn(50, dtype=torch.complex64)
    for x in (z, z.conj()):
        for fn in (torch.sgn, torch.exp, lambda t: t.abs()):
            ref = fn(x)
            got = fn(x.to("neuron"))
            assert torch.equal(got.cpu(), ref)


def test_multiple_returns_and_bool():
    x = torch.randn(6, 7)
    values, indices = torch.max(x.to("neuron"), dim=1)
    ref_v, ref_i = torch.max(x, dim=1)
    assert torch.equal(values.cpu(), ref_v) and torch.equal(indices.cpu(), ref_i)
    assert torch.equal(torch.logical_not(x.to("neuron") > 0).cpu(), torch.logical_not(x > 0))


def test_non_contiguous_result_layout():
    x = torch.randn(5, 6).t()  # transposed input: the CPU kernel's output keeps its strides
    got = torch.relu(x.to("neuron"))
    ref = torch.relu(x)
    assert got.stride() == ref.stride() and torch.equal(got.cpu(), ref)


CALLS = [
    lambda t: torch.relu(t),
    lambda t: torch.clamp(t, min=0.25),
    lambda t: torch.clamp(t, min=-0.25),  # differs only in a scalar
    lambda t: t.sum(0),
    lambda t: t.sum(-1, keepdim=True),
    lambda t: torch.cat([t] * 7, 0),  # a long key (a list of tensors)
    lambda t: torch.cat([t, t], -1),
    lambda t: t.t().contiguous(),  # strides in the key
    lambda t: torch.nn.functional.softmax(t, -1),
]


@pytest.mark.parametrize("rounds", [3])
def test_alternating_signatures_get_their_own_sizes(rounds):
    shapes = [(4, 5), (5, 4), (1, 9), (8, 1)]
    for _ in range(rounds):
        for shape in shapes:
            x = torch.randn(shape)
            xn = x.to("neuron")
            for call in CALLS:
                ref, got = call(x), call(xn)
                assert got.shape == ref.shape and got.stride() == ref.stride()
                torch.testing.assert_close(got.cpu(), ref)


def test_from_another_thread():
    import threading

    errors = []

    def worker():
        try:
            test_alternating_signatures_get_their_own_sizes(2)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    test_alternating_signatures_get_their_own_sizes(2)
    for t in threads:
        t.join()
    assert not errors, errors


CASES = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul_scalar": lambda a, b: a * 0.5,
    "div": lambda a, b: a / (b + 1),
    "add_": lambda a, b: a.clone().add_(b),
    "mul_": lambda a, b: a.clone().mul_(b),
    "fill_": lambda a, b: a.clone().fill_(3.0),
    "zero_": lambda a, b: a.clone().zero_(),
    "relu": lambda a, b: torch.relu(a - 0.5),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.25),
}


@pytest.mark.parametrize("current,target", [(0, 1), (1, 0), (2, 2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_on_a_device_that_is_not_current(case, current, target):
    if torch.neuron.device_count() <= max(current, target):
        pytest.skip("needs 3 neuron devices (NEURON_RT_VISIBLE_CORES)")
    fn = CASES[case]
    a, b = torch.rand(100), torch.rand(100)
    ref = fn(a, b)
    before = torch.neuron.current_device()
    try:
        torch.neuron.set_device(current)
        got = fn(a.to(f"neuron:{target}"), b.to(f"neuron:{target}"))
        assert torch.neuron.current_device() == current, "the caller's device is restored"
        assert got.device == torch.device("neuron", target)
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
        # The result's memory is on the target device: further ops there see the values.
        torch.testing.assert_close((got * 2).cpu(), ref * 2, rtol=0, atol=0)
    finally:
        torch.neuron.set_device(before)


@pytest.mark.parametrize("lo,hi", [(0.0, 3.0), (0.0, 0.0)])
def test_histc_float_is_asynchronous_and_matches_cpu(device, lo, hi):
    # Fix: histc was listed as data-dependent (synchronous), but its output is always (bins,):
    # it now takes the asynchronous path (no host wait), which transformers' MoE relies on.
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 2
    openneuron.ops_report(print_table=False, reset=True)
    got = torch.histc(x.to(device), bins=9, min=lo, max=hi)
    assert _paths("aten::histc") == {"async"}
    assert torch.equal(got.cpu(), torch.histc(x, bins=9, min=lo, max=hi))


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
