"""Causal flash attention written in NKI: forward and backward kernels (online softmax over
128-key tiles, Q^T K on the Tensor Engine into PSUM, the diagonal tile masked with
nisa.affine_select, tiles above the diagonal skipped), one SPMD program per (batch, head),
registered as a torch custom op with autograd and compared with ATen's SDPA.

    python examples/nki/flash_attention.py     # forward and gradients vs F.scaled_dot_product_attention

Layout: q, k, v are [B*H, S, D] with D <= 128 and S a multiple of 128.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

TILE = 128
NEG = -30000.0  # masked score: exp() underflows to 0 in float32


def _scores(q_t, k, j, d, scale):
    """S = scale * q_tile @ k_tile^T for key tile j, [128 q, 128 k], in float32 (PSUM -> SBUF)."""
    k_t = nl.load_transpose2d(k[j * TILE:(j + 1) * TILE, 0:d])  # [D, 128 k]
    return nl.multiply(nl.matmul(q_t, k_t, transpose_x=True), scale)


@nki.jit
def flash_fwd(q, k, v, scale=1.0):
    """out [B*H, S, D] and the row log-sum-exp lse [B*H, S, 1] (for the backward)."""
    bh, s, d = q.shape
    out = nl.ndarray((bh, s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((bh, s, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    b = nl.program_id(0)
    qb, kb, vb = q[b], k[b], v[b]
    for i in nl.affine_range(s // TILE):
        q_t = nl.load_transpose2d(qb[i * TILE:(i + 1) * TILE, 0:d], dtype=nl.float32)
        m = nl.full((TILE, 1), NEG, dtype=nl.float32)
        l_sum = nl.zeros((TILE, 1), dtype=nl.float32)
        acc = nl.zeros((TILE, d), dtype=nl.float32)
        for j in nl.sequential_range(i + 1):  # causal: key tiles up to the diagonal
            sc = _scores(q_t, kb, j, d, scale)
            if j == i:
                i_q, i_k = nl.mgrid[0:TILE, 0:TILE]
                sc = nisa.affine_select(i_q >= i_k, sc, NEG)
            m_new = nl.maximum(m, nl.max(sc, axis=1, keepdims=True))
            p = nl.exp(nl.subtract(sc, m_new))
            alpha = nl.exp(nl.subtract(m, m_new))
            l_sum = nl.add(nl.multiply(l_sum, alpha), nl.sum(p, axis=1, keepdims=True))
            v_t = nl.load(vb[j * TILE:(j + 1) * TILE, 0:d], dtype=nl.float32)
            acc = nl.add(nl.multiply(acc, alpha), nl.matmul(p, v_t))  # p @ v
            m = m_new
        nl.store(out[b, i * TILE:(i + 1) * TILE, 0:d], nl.divide(acc, l_sum))
        nl.store(lse[b, i * TILE:(i + 1) * TILE, 0:1], nl.add(m, nl.log(l_sum)))
    return out, lse


@nki.jit
def flash_bwd(q, k, v, o, do, lse, scale=1.0):
    """dq, dk, dv: P = exp(S - lse) recomputed per tile; dS = P * (dP - rowsum(dO * O))."""
    bh, s, d = q.shape
    dq = nl.ndarray((bh, s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((bh, s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((bh, s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    b = nl.program_id(0)
    n = s // TILE
    dk_acc = [nl.zeros((TILE, d), dtype=nl.float32) for _ in range(n)]
    dv_acc = [nl.zeros((TILE, d), dtype=nl.float32) for _ in range(n)]
    for i in nl.sequential_range(n):
        rows = slice(i * TILE, (i + 1) * TILE)
        q_t = nl.load_transpose2d(q[b, rows, 0:d], dtype=nl.float32)  # [D, 128 q]
        q_i = nl.load(q[b, rows, 0:d], dtype=nl.float32)
        do_i = nl.load(do[b, rows, 0:d], dtype=nl.float32)
        do_t = nl.load_transpose2d(do[b, rows, 0:d], dtype=nl.float32)
        delta = nl.sum(nl.multiply(do_i, nl.load(o[b, rows, 0:d], dtype=nl.float32)), axis=1,
                       keepdims=True)
        lse_i = nl.load(lse[b, rows, 0:1])
        dq_acc = nl.zeros((TILE, d), dtype=nl.float32)
        for j in nl.sequential_range(i + 1):
            cols = slice(j * TILE, (j + 1) * TILE)
            sc = _scores(q_t, k[b], j, d, scale)
            if j == i:
                i_q, i_k = nl.mgrid[0:TILE, 0:TILE]
                sc = nisa.affine_select(i_q >= i_k, sc, NEG)
            p = nl.exp(nl.subtract(sc, lse_i))  # [128 q, 128 k]
            v_t = nl.load_transpose2d(v[b, cols, 0:d], dtype=nl.float32)  # [D, 128 k]
            dp = nl.matmul(do_t, v_t, transpose_x=True)  # dO @ V^T
            ds = nl.multiply(nl.multiply(p, nl.subtract(dp, delta)), scale)
            k_j = nl.load(k[b, cols, 0:d], dtype=nl.float32)
            dq_acc = nl.add(dq_acc, nl.matmul(ds, k_j))  # dS @ K
            dv_acc[j] = nl.add(dv_acc[j], nl.matmul(p, do_i, transpose_x=True))  # P^T @ dO
            dk_acc[j] = nl.add(dk_acc[j], nl.matmul(ds, q_i, transpose_x=True))  # dS^T @ Q
        nl.store(dq[b, rows, 0:d], dq_acc)
    for j in nl.affine_range(n):
        nl.store(dk[b, j * TILE:(j + 1) * TILE, 0:d], dk_acc[j])
        nl.store(dv[b, j * TILE:(j + 1) * TILE, 0:d], dv_acc[j])
    return dq, dk, dv


attention_op = None
attention_bwd_op = None


def _register():
    """The kernels as custom ops (once), one program per batch*heads row: grid from q."""
    global attention_op, attention_bwd_op
    if attention_op is not None:
        return
    grid = lambda q, *_: (q.shape[0],)
    attention_op = nki.custom_op("nki_examples::flash_attention", flash_fwd, num_outputs=2,
                                 grid=grid)
    attention_bwd_op = nki.custom_op("nki_examples::flash_attention_bwd", flash_bwd,
                                     num_outputs=3, grid=grid)

    def setup(ctx, inputs, output):
        q, k, v, scale = inputs
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, output[0], output[1])

    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd_op(q, k, v, o, do.contiguous(), lse, ctx.scale)
        return dq, dk, dv, None

    attention_op.register_autograd(backward, setup_context=setup)


def flash_attention(q, k, v):
    """Causal attention of [B, H, S, D] tensors through the NKI kernels (differentiable)."""
    _register()
    B, H, S, D = q.shape
    flat = [t.reshape(B * H, S, D).contiguous() for t in (q, k, v)]
    out, _ = attention_op(*flat, 1.0 / math.sqrt(D))
    return out.view(B, H, S, D)


if __name__ == "__main__":
    torch.manual_seed(0)
    B, H, S, D = 2, 2, 256, 64
    q, k, v = (torch.randn(B, H, S, D, device="neuron", requires_grad=True) for _ in range(3))
    out = flash_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f"forward  max |NKI - ATen SDPA| = {(out - ref).abs().max().item():.2e}")
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for name, a, b in zip("qkv", grads, ref_grads):
        print(f"d{name}      max |NKI - ATen SDPA| = {(a - b).abs().max().item():.2e}")
