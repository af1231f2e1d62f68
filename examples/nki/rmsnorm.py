"""RMSNorm written in NKI (forward and backward kernels), registered as a torch custom op with
autograd, and used in a GPT training step on neuron next to the same model with ATen's RMSNorm.

    python examples/nki/rmsnorm.py           # 20 training steps, NKI vs ATen, losses side by side

The kernels are plain NKI (Beta 1 `neuronxcc.nki` style); with openneuron.nki.alias() the same
file would import `neuronxcc.nki.language as nl` unchanged. Rows go 128 to a tile (the partition
dimension); the last tile is masked.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki


@nki.jit
def rmsnorm_fwd(x, w, eps=1e-6):
    """out = x / sqrt(mean(x^2) + eps) * w, and rstd = 1 / sqrt(mean(x^2) + eps) per row."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    w_tile = nl.load(w.reshape((1, d)))
    for t in nl.affine_range(math.ceil(n / 128)):
        rows = t * 128 + i_p
        xt = nl.load(x[rows, i_f], mask=(rows < n), dtype=nl.float32)
        ms = nl.mean(nl.square(xt), axis=1, keepdims=True, mask=(rows < n))
        r = nl.rsqrt(ms + eps, mask=(rows < n))
        y = nl.multiply(nl.multiply(xt, r, mask=(rows < n)), w_tile, mask=(rows < n))
        nl.store(out[rows, i_f], y, mask=(rows < n))
        nl.store(rstd[rows, 0], r, mask=(rows < n))
    return out, rstd


@nki.jit
def rmsnorm_bwd(dy, x, w, rstd):
    """dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd; dw = sum dy * xhat."""
    n, d = x.shape
    dx = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((1, d), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    w_tile = nl.load(w.reshape((1, d)), dtype=nl.float32)
    dw_acc = nl.zeros((1, d), dtype=nl.float32)
    for t in nl.affine_range(math.ceil(n / 128)):
        rows = t * 128 + i_p
        m = rows < n
        g_out = nl.load(dy[rows, i_f], mask=m, dtype=nl.float32)
        r = nl.load(rstd[rows, 0], mask=m)
        xhat = nl.multiply(nl.load(x[rows, i_f], mask=m, dtype=nl.float32), r, mask=m)
        g = nl.multiply(g_out, w_tile, mask=m)
        c = nl.mean(nl.multiply(g, xhat, mask=m), axis=1, keepdims=True, mask=m)
        res = nl.multiply(nl.subtract(g, nl.multiply(xhat, c, mask=m), mask=m), r, mask=m)
        nl.store(dx[rows, i_f], res, mask=m)
        # dw: a sum across rows is a partition reduction (GpSimd engine); masked rows skipped
        dw_acc += nisa.tensor_partition_reduce(nl.add, nl.multiply(g_out, xhat, mask=m), mask=m)
    nl.store(dw, dw_acc)
    return dx, dw


rmsnorm_op = nki.custom_op("nki_examples::rmsnorm", rmsnorm_fwd, num_outputs=2)
rmsnorm_bwd_op = nki.custom_op("nki_examples::rmsnorm_bwd", rmsnorm_bwd, num_outputs=2)


def _setup(ctx, inputs, output):
    x, w, _ = inputs
    ctx.save_for_backward(x, w, output[1])


def _backward(ctx, dout, _drstd):
    x, w, rstd = ctx.saved_tensors
    dx, dw = rmsnorm_bwd_op(dout.contiguous(), x, w, rstd)
    return dx, dw.view(-1).to(w.dtype), None


rmsnorm_op.register_autograd(_backward, setup_context=_setup)


class NkiRMSNorm(nn.Module):
    """nn.RMSNorm's interface over the NKI kernels (normalizes the last dimension)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out, _ = rmsnorm_op(x.reshape(-1, shape[-1]).contiguous(), self.weight, self.eps)
        return out.view(shape)


def swap_norms(model: nn.Module, factory) -> nn.Module:
    """Replaces every nn.LayerNorm of the model with factory(dim)."""
    for name, child in model.named_children():
        if isinstance(child, nn.LayerNorm):
            setattr(model, name, factory(child.normalized_shape[0]))
        else:
            swap_norms(child, factory)
    return model


def train(norm: str, steps: int, device="neuron", compile=False):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpt import GPT, CharTokenizer, GPTConfig, get_batch, load_text

    text = load_text()
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=2)
    model = GPT(cfg)
    factory = (lambda d: NkiRMSNorm(d)) if norm == "nki" else (lambda d: nn.RMSNorm(d, eps=1e-6))
    model = swap_norms(model, factory).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = torch.compile(model) if compile else model
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = get_batch(data, 16, cfg.block_size, gen)
        _, loss = step(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    nki_losses = train("nki", steps)
    aten_losses = train("aten", steps)
    for i, (a, b) in enumerate(zip(nki_losses, aten_losses)):
        print(f"step {i:3d}  loss NKI RMSNorm {a:.5f}  ATen RMSNorm {b:.5f}  diff {a - b:+.2e}")
    print(f"max |diff| over {steps} steps: {max(abs(a - b) for a, b in zip(nki_losses, aten_losses)):.2e}")
