# Activation checkpointing (torch.utils.checkpoint) on neuron, reentrant and non-reentrant: with
# dropout inside, the recomputation replays the same masks (the device RNG state is saved and
# restored through torch.neuron.get_rng_state/set_rng_state), so gradients equal the
# non-checkpointed run bitwise; without dropout they match CPU.
import pytest
import torch
from torch.utils.checkpoint import checkpoint


class Block(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.drop = torch.nn.Dropout(p)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))


class Net(torch.nn.Module):
    def __init__(self, p: float, ckpt: bool | None, preserve_rng_state: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(Block(p) for _ in range(3))
        self.ckpt = ckpt  # None: no checkpointing; else use_reentrant
        self.preserve = preserve_rng_state

    def forward(self, x):
        for block in self.blocks:
            if self.ckpt is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.ckpt,
                               preserve_rng_state=self.preserve)
        return x


def _grads(dev, p, ckpt, preserve=True, autocast=False):
    model = Net(p, ckpt, preserve).to(dev).train()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(dev).requires_grad_()
    torch.neuron.manual_seed(123)
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
    out.float().square().mean().backward()
    return [t.cpu() for t in [out.detach(), x.grad] + [q.grad for q in model.parameters()]]


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_dropout_gradients_equal_without_checkpointing(use_reentrant):
    ref = _grads("neuron", 0.3, None)
    got = _grads("neuron", 0.3, use_reentrant)
    for g, r in zip(got, ref, strict=True):
        assert torch.equal(g, r)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_without_rng_preservation_gradients_differ(use_reentrant):
    # Shows the test above can fail: the masks replayed are only equal because the state is
    # restored.
    ref = _grads("neuron", 0.3, None)
    got = _grads("neuron", 0.3, use_reentrant, preserve=False)
    assert torch.equal(got[0], ref[0])  # the forward itself is unchanged
    assert not all(torch.equal(g, r) for g, r in zip(got[1:], ref[1:], strict=True))


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpoint_under_autocast(use_reentrant):
    ref = _grads("neuron", 0.3, None, autocast=True)
    got = _grads("neuron", 0.3, use_reentrant, autocast=True)
    assert ref[0].dtype == torch.bfloat16
    for g, r in zip(got, ref, strict=True):
        assert torch.equal(g, r)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_no_dropout_matches_cpu(use_reentrant):
    ref = _grads("cpu", 0.0, None)
    got = _grads("neuron", 0.0, use_reentrant)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


def test_rng_state_advances_and_is_restored():
    # After a checkpointed forward + backward the device RNG is where the plain run leaves it.
    _grads("neuron", 0.3, None)
    plain = torch.neuron.get_rng_state()
    _grads("neuron", 0.3, False)
    assert torch.equal(torch.neuron.get_rng_state(), plain)
