# torch.amp.GradScaler("neuron") for float16 training: the two ops it relies on
# (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_; run by the generic fallback)
# match CPU, and a training loop with identical inf injection grows and backs off the scale as on
# CPU, skips the step on inf, and ends close to CPU. Misuse gives PyTorch's own error.
import pytest
import torch
import torch.nn.functional as F

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    "values", [[1.0, -2.0, 3.0], [1.0, INF, 3.0], [NAN, 1.0, 2.0], [-INF, 0.0, 1.0]],
    ids=["finite", "inf", "nan", "neg_inf"],
)
def test_non_finite_check_and_unscale_matches_cpu(values, device):
    results = []
    for dev in ("cpu", device):
        grads = [torch.tensor(values, device=dev), torch.arange(6.0, device=dev).view(2, 3)]
        found_inf = torch.zeros(1, device=dev)
        inv_scale = torch.full((1,), 0.25, device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        results.append([g.cpu() for g in grads] + [found_inf.cpu()])
    for n, c in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(n, c, equal_nan=True, rtol=0, atol=0)
    assert results[1][-1].item() == (0.0 if values == [1.0, -2.0, 3.0] else 1.0)


@pytest.mark.parametrize("found", [0.0, 1.0])
@pytest.mark.parametrize("tracker", [0, 1])
def test_update_scale_matches_cpu(found, tracker, device):
    results = []
    for dev in ("cpu", device):
        scale = torch.full((1,), 1024.0, device=dev)
        growth = torch.full((1,), tracker, dtype=torch.int32, device=dev)
        found_inf = torch.full((1,), found, device=dev)
        torch._amp_update_scale_(scale, growth, found_inf, 2.0, 0.5, 2)
        results.append((scale.cpu(), growth.cpu()))
    assert torch.equal(results[1][0], results[0][0]) and torch.equal(results[1][1], results[0][1])
    expected = 512.0 if found else (2048.0 if tracker == 1 else 1024.0)
    assert results[1][0].item() == expected


def _model(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).to(dev)


INF_STEPS = {3, 4, 8}  # steps whose gradients get an inf injected after backward


def _train(dev, steps=10):
    model = _model(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**10, growth_interval=2)
    gen = torch.Generator().manual_seed(1)
    scales, skipped = [], []
    for step in range(steps):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        with torch.autocast(dev, dtype=torch.float16):
            out = model(x.to(dev))
            assert out.dtype == torch.float16
            loss = F.mse_loss(out, y.to(dev))
        scaler.scale(loss).backward()
        if step in INF_STEPS:
            model[0].weight.grad[0, 0] = INF
        before = [p.detach().cpu().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        after = [p.detach().cpu() for p in model.parameters()]
        skipped.append(all(torch.equal(a, b) for a, b in zip(after, before, strict=True)))
        scales.append(scaler.get_scale())
        opt.zero_grad(set_to_none=True)
    return scales, skipped, [p.detach().cpu() for p in model.parameters()]


def test_fp16_training_loop_matches_cpu():
    n_scales, n_skipped, n_params = _train("neuron")
    c_scales, c_skipped, c_params = _train("cpu")
    assert n_scales == c_scales
    # growth every 2 clean steps, halving on every inf step
    assert n_scales == [1024.0, 2048.0, 2048.0, 1024.0, 512.0, 512.0, 1024.0, 1024.0, 512.0, 512.0]
    assert n_skipped == [s in INF_STEPS for s in range(10)], "the step is skipped exactly on inf"
    assert n_skipped == c_skipped
    for n, c in zip(n_params, c_params, strict=True):
        assert torch.isfinite(n).all()
        torch.testing.assert_close(n, c, atol=1e-2, rtol=1e-2)


def test_unscale_or_step_twice_is_an_error(device):
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron")
    with torch.autocast("neuron", dtype=torch.float16):
        loss = model(torch.randn(2, 8, device=device)).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()


def test_fp16_gradients_are_refused(device):
    model = _model(device).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron")
    scaler.scale(model(torch.randn(2, 8, device=device, dtype=torch.half)).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(opt)
