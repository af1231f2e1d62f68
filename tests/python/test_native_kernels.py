"""Native kernels of csrc/kernels on the neuron device (layer norm, scaled dot-product
attention, embedding backward, fused Adam/AdamW, matrix products with a few rows) against CPU PyTorch: forward results,
autograd gradients, odd and empty shapes, non-contiguous inputs, the cases routed to the
fallback (checked through the ops_report counters), the runtime switches, and errors on bad
input.

Tolerances: float32 results match CPU to 1e-5 relative (different summation order and exp
implementation; not bitwise; gradients that sum over rows or keys get a few times that);
bfloat16 to 2e-2 and float16 to 2e-3 (one rounding of the float32 result, where ATen may
round intermediates differently). Embedding backward is bitwise; fused Adam/AdamW is within
1e-6 of CPU's fused kernel."""

import pytest
import torch
import torch.nn.functional as F

import openneuron

DEV = torch.device("neuron:0")
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
DTYPES = list(TOL)


def native_calls(op: str) -> int:
    return sum(r.calls for r in openneuron.ops_report(print_table=False)
               if r.op == op and r.path == "native")


def async_calls(op: str) -> int:
    return sum(r.calls for r in openneuron.ops_report(print_table=False)
               if r.op == op and r.path == "async")


def close(neuron: torch.Tensor, cpu: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(neuron.cpu(), cpu, **tol)


@pytest.fixture
def native_off():
    torch.ops.openneuron._set_native_kernels(False)
    yield
    torch.ops.openneuron._set_native_kernels(True)


def test_switch_off_gives_the_same_results(native_off):
    x = torch.randn(4, 50)
    before = native_calls("aten::native_layer_norm")
    torch.testing.assert_close(F.layer_norm(x.to(DEV), (50,)).cpu(), F.layer_norm(x, (50,)),
                               rtol=1e-5, atol=1e-5)
    assert native_calls("aten::native_layer_norm") == before


# ---- layer norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,norm", [((8, 256), (256,)), ((3, 5, 7, 6), (7, 6)), ((1, 1), (1,))])
def test_layer_norm_forward_backward(dtype, affine, shape, norm):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 2 + 1).to(dtype)
    w = torch.randn(norm).to(dtype) if affine else None
    b = torch.randn(norm).to(dtype) if affine else None
    g = torch.randn(shape).to(dtype)
    cpu = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    dev = [t.to(DEV).requires_grad_() if t is not None else None for t in (x, w, b)]
    before = native_calls("aten::native_layer_norm")
    yc = F.layer_norm(cpu[0], norm, cpu[1], cpu[2])
    yn = F.layer_norm(dev[0], norm, dev[1], dev[2])
    yc.backward(g)
    yn.backward(g.to(DEV))
    close(yn, yc.detach(), dtype, scale=2)
    for tn, tc in zip(dev, cpu):
        if tc is not None:
            # dweight/dbias sum over rows: allow for the summation order
            close(tn.grad, tc.grad, dtype, scale=10 if dtype == torch.float32 else 4)
    assert native_calls("aten::native_layer_norm") == before + 1


def test_layer_norm_mixed_dtype_stats():
    x = torch.randn(6, 32).to(torch.bfloat16)
    w, b = torch.randn(32), torch.randn(32)
    rc = torch.native_layer_norm(x, [32], w, b, 1e-5)
    rn = torch.native_layer_norm(x.to(DEV), [32], w.to(DEV), b.to(DEV), 1e-5)
    for a, c in zip(rn, rc):
        assert a.dtype == c.dtype and a.shape == c.shape
        torch.testing.assert_close(a.cpu(), c, rtol=2e-2, atol=2e-2)


def test_layer_norm_noncontiguous_and_empty():
    x = torch.randn(16, 8).t()
    torch.testing.assert_close(F.layer_norm(x.to(DEV), (16,)).cpu(), F.layer_norm(x, (16,)),
                               rtol=1e-5, atol=1e-5)
    e = torch.empty(0, 8, device=DEV)
    assert F.layer_norm(e, (8,)).shape == (0, 8)
    with pytest.raises(RuntimeError, match="normalized_shape|Given normalized_shape"):
        F.layer_norm(torch.randn(4, 8, device=DEV), (7,))


# ---- scaled dot-product attention ------------------------------------------------------------

def sdpa_both(q, k, v, dtype, grads=True, **kw):
    """Forward and (optionally) gradients on CPU and neuron; returns (cpu, neuron) lists."""
    cpu = [t.to(dtype).clone().requires_grad_(grads) for t in (q, k, v)]
    dev = [t.to(dtype).to(DEV).requires_grad_(grads) for t in (q, k, v)]
    kw_dev = {k2: (v2.to(DEV) if isinstance(v2, torch.Tensor) else v2) for k2, v2 in kw.items()}
    try:
        oc = F.scaled_dot_product_attention(*cpu, **kw)
    except RuntimeError as err:  # the CPU reference itself, not neuron
        if "pack_vnni2" not in str(err):
            raise
        pytest.skip("no CPU reference: ATen's bf16 flash attention raises 'pack_vnni2 is only "
                    "supported when avx512 is supported' under ATEN_CPU_CAPABILITY=default on "
                    "an AMX host (a PyTorch limitation)")
    on = F.scaled_dot_product_attention(*dev, **kw_dev)
    out_c, out_n = [oc.detach()], [on]
    if grads:
        g = torch.randn_like(oc)
        gc = torch.autograd.grad(oc, cpu, g)
        gn = torch.autograd.grad(on, dev, g.to(DEV))
        out_c += list(gc)
        out_n += list(gn)
    return out_c, out_n


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,E,Ev", [(37, 45, 16, 24), (128, 128, 32, 32), (1, 1, 8, 8),
                                      (50, 20, 8, 8)])
def test_sdpa_matches_cpu(dtype, causal, L, S, E, Ev):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, L, E), torch.randn(2, 3, S, E), torch.randn(2, 3, S, Ev)
    before = native_calls("aten::_scaled_dot_product_fused_attention_overrideable")
    cpu, dev = sdpa_both(q, k, v, dtype, is_causal=causal)
    for a, c in zip(dev, cpu):
        close(a, c, dtype, scale=4 if dtype == torch.float32 else 2)
    assert native_calls("aten::_scaled_dot_product_fused_attention_overrideable") == before + 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [1, 3, 4, 5])  # up to 4 query rows: the decode path; 5: blocked
@pytest.mark.parametrize("S,E,Ev", [(1, 64, 64), (17, 8, 24), (300, 64, 40), (2048, 64, 64)])
@pytest.mark.parametrize("case", ["plain", "causal", "float_mask", "bool_mask"])
def test_sdpa_decode_shapes_match_cpu(dtype, L, S, E, Ev, case):
    """A few query rows against a long KV cache (token-by-token decoding): K and V are read in
    place from a strided cache slice; gradients come from the blocked backward with the decode
    forward's logsumexp. [2, 3, 4, 2048] spreads over threads."""
    torch.manual_seed(L * 1000 + S)
    cache_k, cache_v = torch.randn(2, 3, S + 7, E), torch.randn(2, 3, S + 7, Ev)
    q, k, v = torch.randn(2, 3, L, E), cache_k[:, :, :S], cache_v[:, :, :S]
    kw = {"is_causal": True} if case == "causal" else {}
    if case == "float_mask":
        kw["attn_mask"] = torch.randn(2, 1, L, S)
    elif case == "bool_mask":
        mask = torch.rand(1, 3, L, S) > 0.4
        mask[..., 0] = True
        mask[:, 1, 0] = False  # one fully masked row: zeros, as CPU
        kw["attn_mask"] = mask
    cpu, dev = sdpa_both(q, k, v, dtype, grads=S <= 300, **kw)
    for a, c in zip(dev, cpu):
        close(a, c, dtype, scale=4 if dtype == torch.float32 else 2)


@pytest.mark.parametrize("mask_shape", [(20, 30), (2, 1, 20, 30), (1, 30), (2, 3, 20, 30)])
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_sdpa_masks(mask_shape, kind):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 20, 16), torch.randn(2, 3, 30, 16), torch.randn(2, 3, 30, 16)
    if kind == "bool":
        mask = torch.rand(mask_shape) > 0.3
        mask[..., 0] = True  # no fully masked rows here (see the next test)
    else:
        mask = torch.randn(mask_shape)
    cpu, dev = sdpa_both(q, k, v, torch.float32, attn_mask=mask, scale=0.3)
    for a, c in zip(dev, cpu):
        close(a, c, torch.float32, scale=4)


@pytest.fixture
def aten_flash_sdpa():
    previous = torch.ops.openneuron._sdpa_kernel("aten_flash")
    yield
    torch.ops.openneuron._sdpa_kernel(previous)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["causal", "float_mask", "bool_mask", "plain"])
def test_sdpa_aten_flash_option(aten_flash_sdpa, dtype, case):
    """The other implementation of the overrideable ops: ATen's CPU flash kernel in one work
    item (torch.ops.openneuron._sdpa_kernel("aten_flash"))."""
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 3, 33, 16), torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    kw = {"causal": {"is_causal": True}, "plain": {"scale": 0.5},
          "float_mask": {"attn_mask": torch.randn(2, 1, 33, 40)},
          "bool_mask": {"attn_mask": torch.rand(33, 40) > 0.5}}[case]
    cpu, dev = sdpa_both(q, k, v, dtype, **kw)
    for a, c in zip(dev, cpu):
        close(a, c, dtype, scale=4 if dtype == torch.float32 else 2)


FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
FLASH_BACKWARD = FLASH + "_backward"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_long_sequences_take_atens_flash_kernel(dtype):
    """By default ("auto") from 768 x 768 query x key positions the overrideable ops run ATen's
    CPU flash kernel (faster there: native_attention.cpp), bitwise CPU's result; shorter ones
    the hand-written kernel, except bfloat16/float16 forwards, ATen's from 256 x 256."""
    assert torch.ops.openneuron._sdpa_kernel() == "auto"
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 768, 32) for _ in range(3))
    calls = (async_calls(FLASH), async_calls(FLASH_BACKWARD))
    cpu, dev = sdpa_both(q, k, v, dtype, is_causal=True)
    for a, c in zip(dev, cpu):
        assert torch.equal(a.cpu(), c)
    assert (async_calls(FLASH), async_calls(FLASH_BACKWARD)) == (calls[0] + 1, calls[1] + 1)
    mid = [t[:, :, :512] for t in (q, k, v)]  # a forward of ATen's (bf16) and our backward
    calls = (async_calls(FLASH), async_calls(FLASH_BACKWARD))
    cpu, dev = sdpa_both(*mid, dtype, is_causal=True)
    if dtype == torch.bfloat16:
        assert torch.equal(dev[0].cpu(), cpu[0])
    for a, c in zip(dev[1:], cpu[1:]):
        close(a, c, dtype, scale=4)
    low = dtype != torch.float32
    assert (async_calls(FLASH), async_calls(FLASH_BACKWARD)) == (calls[0] + low, calls[1])
    short = [t[:, :, :128] for t in (q, k, v)]
    calls = (async_calls(FLASH), async_calls(FLASH_BACKWARD))
    sdpa_both(*short, dtype, is_causal=True)
    assert (async_calls(FLASH), async_calls(FLASH_BACKWARD)) == calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [256, 768])
def test_sdpa_compiled_matches_eager_whichever_kernel_runs(dtype, length):
    """Compiled graphs check each output's strides against the op's meta kernel: ATen's flash
    kernel's transposed results are returned in the meta layout (they were not: an
    AssertionError at the first compiled call)."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, length, 32, dtype=dtype, device=DEV, requires_grad=True)
               for _ in range(3))
    g = torch.randn(1, 2, length, 32, dtype=dtype, device=DEV)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    eager = [f(q, k, v)]
    eager += torch.autograd.grad(eager[0], (q, k, v), g)
    compiled = [torch.compile(f, fullgraph=True, dynamic=False)(q, k, v)]
    compiled += torch.autograd.grad(compiled[0], (q, k, v), g)
    for a, b in zip(compiled, eager):
        assert a.stride() == b.stride()
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("kernel", ["aten_flash", "hand"])
def test_sdpa_fully_masked_rows_are_zero_like_cpu(kernel):
    previous = torch.ops.openneuron._sdpa_kernel(kernel)
    try:
        q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
        mask = torch.ones(4, 4, dtype=torch.bool)
        mask[1] = False
        cpu, dev = sdpa_both(q, k, v, torch.float32, attn_mask=mask)
        for a, c in zip(dev, cpu):
            close(a, c, torch.float32, scale=4)
    finally:
        torch.ops.openneuron._sdpa_kernel(previous)


def test_sdpa_noncontiguous_inputs():
    # the usual [B, L, H, E] -> transpose(1, 2) layout of attention modules
    q, k, v = (torch.randn(2, 24, 4, 16).transpose(1, 2) for _ in range(3))
    cpu, dev = sdpa_both(q, k, v, torch.float32, is_causal=True)
    for a, c in zip(dev, cpu):
        close(a, c, torch.float32, scale=4)


@pytest.mark.parametrize("layout", ["fused_qkv", "last_dim_strided", "value_wider"])
def test_sdpa_results_in_the_meta_layout_written_in_place(layout):
    """The kernels write out / dq / dk / dv at the strides ATen's meta kernels give (compiled
    graphs assert them), with no copy when the last dimension is contiguous."""
    torch.manual_seed(3)
    B, L, H, E = 2, 24, 4, 16
    Ev = 24 if layout == "value_wider" else E
    def views(make):
        if layout == "last_dim_strided":  # [B, H, E, L] -> transpose: the last dim has stride L
            return [make(B, H, E, L).transpose(2, 3) for _ in range(3)]
        # one [B, L, H * (2E + Ev)] projection split into heads, as GPT's attention does
        q, k, v = make(B, L, H * (2 * E + Ev)).split([H * E, H * E, H * Ev], dim=2)
        return [q.view(B, L, H, E).transpose(1, 2), k.view(B, L, H, E).transpose(1, 2),
                v.view(B, L, H, Ev).transpose(1, 2)]

    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default
    base = []
    q, k, v = views(lambda *shape: base.append(torch.randn(*shape)) or base[-1])
    it = iter(base)
    dev = views(lambda *shape: next(it).to(DEV))
    meta = [torch.empty_strided(t.size(), t.stride(), device="meta") for t in dev]
    out_m = fwd(*meta, None, 0.0, True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out_d = fwd(*dev, None, 0.0, True)
    copies = [e.name for e in prof.events() if "copy" in e.name]
    assert bool(copies) == (layout == "last_dim_strided"), copies  # a temporary only there
    assert out_d[0].stride() == out_m[0].stride()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(out_d[0], ref, torch.float32, scale=4)
    g = torch.randn(B, H, L, Ev)
    args = lambda ts, o, gr: (gr, *ts, None, [True, True, True, False], o[0], o[1], None, None,
                              L, L, 0.0, True, o[6], o[7])
    grads_m = bwd(*args(meta, out_m, g.to("meta")))
    grads_d = bwd(*args(dev, out_d, g.to(DEV)))
    qc, kc, vc = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref_grads = torch.autograd.grad(F.scaled_dot_product_attention(qc, kc, vc, is_causal=True),
                                    (qc, kc, vc), g)
    for got, want_meta, want in zip(grads_d[:3], grads_m[:3], ref_grads):
        assert got.stride() == want_meta.stride()
        close(got, want, torch.float32, scale=4)


def test_sdpa_unsupported_cases_take_the_math_path():
    torch.manual_seed(0)
    name = "aten::_scaled_dot_product_fused_attention_overrideable"
    before = native_calls(name)
    # GQA
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    cpu, dev = sdpa_both(q, k, v, torch.float32, enable_gqa=True)
    for a, c in zip(dev, cpu):
        close(a, c, torch.float32, scale=4)
    # 3-d inputs
    q3 = torch.randn(3, 10, 8)
    cpu, dev = sdpa_both(q3, q3, q3, torch.float32)
    for a, c in zip(dev, cpu):
        close(a, c, torch.float32, scale=4)
    # dropout: shape and finiteness only (the masks come from different generators)
    qd = torch.randn(2, 2, 10, 8, device=DEV)
    out = F.scaled_dot_product_attention(qd, qd, qd, dropout_p=0.5)
    assert out.shape == qd.shape and torch.isfinite(out.cpu()).all()
    assert native_calls(name) == before


def test_sdpa_switch_off(native_off):
    q, k, v = (torch.randn(2, 2, 10, 8) for _ in range(3))
    name = "aten::_scaled_dot_product_fused_attention_overrideable"
    before = native_calls(name)
    cpu, dev = sdpa_both(q, k, v, torch.float32, is_causal=True)
    for a, c in zip(dev, cpu):
        close(a, c, torch.float32, scale=4)
    assert native_calls(name) == before


def test_sdpa_empty_and_bad_inputs():
    q = torch.randn(2, 3, 0, 8, device=DEV)
    k = torch.randn(2, 3, 5, 8, device=DEV)
    assert F.scaled_dot_product_attention(q, k, k).shape == (2, 3, 0, 8)
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    x3 = torch.randn(2, 3, 8, device=DEV)
    with pytest.raises(RuntimeError, match="expected 4-d query"):
        op(x3, x3, x3)
    x4 = torch.randn(1, 2, 4, 8, device=DEV)
    with pytest.raises(RuntimeError, match="dropout"):
        op(x4, x4, x4, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="one dtype"):
        op(x4, x4.double().float().half(), x4)


# ---- fused Adam / AdamW ----------------------------------------------------------------------

def run_adam(cls, device, dtype, steps=3, **kw):
    torch.manual_seed(0)
    shapes = [(7,), (33, 5), (1000,), (1,)]
    params = [torch.nn.Parameter(torch.randn(s).to(dtype).to(device)) for s in shapes]
    opt = cls(params, **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype).to(device)
        opt.step()
    state = [opt.state[p] for p in params]
    return [p.detach().cpu() for p in params], [s["exp_avg"].cpu() for s in state], \
        [s["exp_avg_sq"].cpu() for s in state]


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"amsgrad": True},
                                {"maximize": True, "weight_decay": 0.05},
                                {"lr": torch.tensor(0.01)}])
def test_fused_adam_matches_cpu(cls, kw):
    op = "aten::_fused_adamw_" if cls is torch.optim.AdamW else "aten::_fused_adam_"
    before = native_calls(op)
    ref = run_adam(cls, "cpu", torch.float32, fused=True, **kw)
    got = run_adam(cls, DEV, torch.float32, fused=True, **kw)
    for a_list, c_list in zip(got, ref):
        for a, c in zip(a_list, c_list):
            torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    assert native_calls(op) == before + 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_adamw_low_precision(dtype):
    ref = run_adam(torch.optim.AdamW, "cpu", dtype, fused=True, lr=1e-2)
    got = run_adam(torch.optim.AdamW, DEV, dtype, fused=True, lr=1e-2)
    for a_list, c_list in zip(got, ref):
        for a, c in zip(a_list, c_list):
            torch.testing.assert_close(a, c, **TOL[dtype])


def test_fused_adamw_grad_scale_and_found_inf():
    params = [torch.nn.Parameter(torch.randn(10, device=DEV))]
    p0 = params[0].detach().cpu().clone()
    params[0].grad = torch.randn(10, device=DEV)
    g0 = params[0].grad.cpu().clone()
    step = torch.zeros((), device=DEV)
    skip = torch.ones((), device=DEV)
    torch._fused_adamw_(params, [params[0].grad], [torch.zeros(10, device=DEV)],
                        [torch.zeros(10, device=DEV)], [], [step + 1], lr=0.1, beta1=0.9,
                        beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                        grad_scale=torch.full((), 2.0, device=DEV), found_inf=skip)
    torch.testing.assert_close(params[0].detach().cpu(), p0)  # found_inf: nothing changes
    torch.testing.assert_close(params[0].grad.cpu(), g0)
    torch._fused_adamw_(params, [params[0].grad], [torch.zeros(10, device=DEV)],
                        [torch.zeros(10, device=DEV)], [], [step + 1], lr=0.1, beta1=0.9,
                        beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                        grad_scale=torch.full((), 2.0, device=DEV), found_inf=skip * 0)
    torch.testing.assert_close(params[0].grad.cpu(), g0 / 2)  # unscaled in place, as on CPU
    # first step: p - lr * sign-ish(g) = p - 0.1 * g / (|g| + eps')
    expect = p0 - 0.1 * (g0 / 2) / ((g0 / 2).abs() + 1e-8)
    torch.testing.assert_close(params[0].detach().cpu(), expect, rtol=1e-5, atol=1e-5)


def test_fused_adamw_noncontiguous_uses_the_fallback():
    def step(device):
        torch.manual_seed(0)
        p = torch.randn(6, 5).to(device).t()  # non-contiguous parameter
        g = torch.randn(6, 5).to(device).t()
        m, v = torch.zeros_like(p), torch.zeros_like(p)
        s = torch.ones((), device=device)
        torch._fused_adamw_([p], [g], [m], [v], [], [s], lr=0.1, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
        return p.cpu(), m.cpu(), v.cpu()
    before = native_calls("aten::_fused_adamw_")
    for a, c in zip(step(DEV), step("cpu")):
        torch.testing.assert_close(a, c)
    assert native_calls("aten::_fused_adamw_") == before


# ---- embedding backward ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_backward_is_bitwise_cpu(dtype, padding_idx):
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (4, 33))
    idx[0, :5] = 3  # repeated rows, and the padding row
    w = torch.randn(50, 24).to(dtype)
    g = torch.randn(4, 33, 24).to(dtype)
    wc, wn = w.clone().requires_grad_(), w.to(DEV).requires_grad_()
    before = native_calls("aten::embedding_dense_backward")
    F.embedding(idx, wc, padding_idx=padding_idx).backward(g)
    F.embedding(idx.to(DEV), wn, padding_idx=padding_idx).backward(g.to(DEV))
    torch.testing.assert_close(wn.grad.cpu(), wc.grad, rtol=0, atol=0)
    assert native_calls("aten::embedding_dense_backward") == before + 1


def test_embedding_backward_int32_indices_and_freq_scaling():
    g = torch.randn(10, 8)
    idx = torch.randint(0, 6, (10,))
    op = torch.ops.aten.embedding_dense_backward
    for i in (idx, idx.int()):
        torch.testing.assert_close(op(g.to(DEV), i.to(DEV), 6, -1, False).cpu(),
                                   op(g, i, 6, -1, False), rtol=0, atol=0)
    before = native_calls("aten::embedding_dense_backward")
    torch.testing.assert_close(op(g.to(DEV), idx.to(DEV), 6, -1, True).cpu(),
                               op(g, idx, 6, -1, True))  # scale_grad_by_freq: the fallback
    assert native_calls("aten::embedding_dense_backward") == before


def test_embedding_backward_empty_and_bad_indices():
    op = torch.ops.aten.embedding_dense_backward
    out = op(torch.empty(0, 4, device=DEV), torch.empty(0, dtype=torch.long, device=DEV), 5, -1,
             False)
    assert out.shape == (5, 4) and (out.cpu() == 0).all()
    bad = torch.tensor([0, 7], device=DEV)
    with pytest.raises(RuntimeError, match="out of range"):
        op(torch.ones(2, 4, device=DEV), bad, 5, -1, False)
        torch.neuron.synchronize()


# ---- _foreach_* ops (the default foreach Adam/AdamW step) --------------------------------------

@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"amsgrad": True}])
def test_foreach_adam_matches_cpu(cls, kw):
    name = "aten::_foreach_addcdiv_.ScalarList"
    before = native_calls(name)
    ref = run_adam(cls, "cpu", torch.float32, foreach=True, **kw)
    got = run_adam(cls, DEV, torch.float32, foreach=True, **kw)
    for a_list, c_list in zip(got, ref):
        for a, c in zip(a_list, c_list):
            torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    assert native_calls(name) == before + 3  # one per step for the whole list


def test_foreach_adamw_bfloat16():
    ref = run_adam(torch.optim.AdamW, "cpu", torch.bfloat16, foreach=True, lr=1e-2)
    got = run_adam(torch.optim.AdamW, DEV, torch.bfloat16, foreach=True, lr=1e-2)
    for a_list, c_list in zip(got, ref):
        for a, c in zip(a_list, c_list):
            torch.testing.assert_close(a, c, **TOL[torch.bfloat16])


@pytest.mark.parametrize("contiguous", [True, False])
def test_foreach_ops_match_cpu(contiguous):
    torch.manual_seed(0)
    base = [torch.randn(5, 6), torch.randn(17), torch.rand(3, 4) + 0.5]
    if not contiguous:
        base[0] = base[0].t()  # routed to the per-tensor loop
    others = [torch.rand_like(t) + 0.5 for t in base]
    scalars = [0.5, -2.0, 3.0]

    def run(device):
        xs = [t.to(device) for t in base]
        ys = [t.to(device) for t in others]
        torch._foreach_mul_(xs, 0.9)
        torch._foreach_add_(xs, 1e-3)
        torch._foreach_div_(xs, scalars)
        torch._foreach_lerp_(xs, ys, 0.1)
        torch._foreach_lerp_(xs, ys, 0.7)
        torch._foreach_addcmul_(xs, ys, ys, 0.01)
        torch._foreach_addcdiv_(xs, ys, [y + 1 for y in ys], scalars)
        roots = torch._foreach_sqrt([y for y in ys])
        return [x.cpu() for x in xs] + [r.cpu() for r in roots]

    for a, c in zip(run(DEV), run("cpu")):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)


def test_foreach_bad_inputs():
    xs = [torch.ones(3, device=DEV), torch.ones(2, device=DEV)]
    with pytest.raises(RuntimeError, match="same number of tensors|2 and 1|got"):
        torch._foreach_lerp_(xs, [torch.ones(3, device=DEV)], 0.5)
    with pytest.raises(RuntimeError, match="scalars"):
        torch._foreach_div_(xs, [1.0])
    with pytest.raises(RuntimeError, match="at least one tensor"):  # as on CPU
        torch._foreach_mul_([], 2.0)


# ---- bfloat16 / float16 matrix products in float32 ---------------------------------------------
# Where ATen's CPU kernel for the dtype is its scalar loop (fallback.cpp: gemm_in_float32) the
# products run in float32 and round once; forced on (and off) here so every CPU runs both paths.

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
            "aten::baddbmm_"}


def gemm_native_calls() -> int:  # any overload (functional products arrive as .out)
    return sum(r.calls for r in openneuron.ops_report(print_table=False)
               if r.op.split(".")[0] in GEMM_OPS and r.path == "native")


@pytest.fixture(params=[1, 0], ids=["float32", "aten"])
def float32_gemm(request):
    previous = torch.ops.openneuron._set_float32_gemm(request.param)
    yield request.param
    torch.ops.openneuron._set_float32_gemm(previous)


def _gemm_cases(a, w, bias, x, y, z):
    return {
        "linear": lambda: F.linear(a, w, bias),
        "mm": lambda: torch.mm(a, w.t()),
        "mm_out": lambda: torch.mm(a, w.t(), out=torch.empty(a.shape[0], w.shape[0],
                                                              dtype=a.dtype, device=a.device)),
        "addmm": lambda: torch.addmm(bias, a, w.t(), beta=0.5, alpha=2.0),
        "addmm_": lambda: torch.mm(a, w.t()).addmm_(a, w.t(), beta=0.25),
        "bmm": lambda: torch.bmm(x, y),
        "baddbmm": lambda: torch.baddbmm(z, x, y, beta=0.5, alpha=1.5),
        "baddbmm_": lambda: z.clone().baddbmm_(x, y),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(_gemm_cases(*[None] * 6)))
def test_low_precision_gemm_in_float32(float32_gemm, dtype, case):
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(*s, generator=g).to(dtype)
           for s in [(37, 70), (50, 70), (50,), (3, 37, 70), (3, 70, 50), (3, 37, 50)]]
    before = gemm_native_calls()
    got = _gemm_cases(*[t.to(DEV) for t in cpu])[case]().cpu()
    ref = _gemm_cases(*cpu)[case]()
    assert got.dtype == dtype and got.shape == ref.shape
    if float32_gemm == 0:  # ATen's kernel on the asynchronous path: CPU's bits
        assert torch.equal(got, ref)
        assert gemm_native_calls() == before
        return
    # The same product in float32, rounded once: equal up to one unit in the last place.
    exact = _gemm_cases(*[t.float() for t in cpu])[case]().to(dtype)
    torch.testing.assert_close(got, exact, rtol=torch.finfo(dtype).eps, atol=1e-6)
    close(got.to(DEV), ref, dtype, scale=4.0)
    assert gemm_native_calls() > before


def test_low_precision_gemm_in_float32_trains_like_cpu(float32_gemm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 8))
    x = torch.randn(32, 64)
    grads = {}
    for dev in ("cpu", DEV):
        m = model.to(dev)
        m.zero_grad()
        with torch.autocast(torch.device(dev).type, dtype=torch.bfloat16):
            loss = m(x.to(dev)).float().square().mean()
        loss.backward()
        grads[torch.device(dev).type] = [p.grad.to("cpu", copy=True) for p in m.parameters()]
    for n, c in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(n, c, rtol=2e-2, atol=2e-2)


def test_float32_gemm_switch_rejects_bad_modes():
    with pytest.raises(RuntimeError, match="mode must be -1"):
        torch.ops.openneuron._set_float32_gemm(2)


# ---- matrix products with a few rows (kernels/gemv.h) ------------------------------------------
# mm / addmm / addmm_ and their .out forms with at most 4 rows (token-by-token decoding): the
# weight streamed once, float32 sums (not MKL's order: TOL, not bitwise), bf16 / fp16 rounded
# once. Both weight layouts: nn.Linear's [n, k] transposed and Conv1D's (GPT-2) [k, n].

def _few_row_cases(a, w, w_kn, bias):
    def out_like():
        return torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
    return {
        "linear": lambda: F.linear(a, w, bias),
        "mm": lambda: torch.mm(a, w.t()),
        "mm_kn": lambda: torch.mm(a, w_kn),
        "mm_out": lambda: torch.mm(a, w_kn, out=out_like()),
        "addmm_conv1d": lambda: torch.addmm(bias, a, w_kn),
        "addmm_scaled": lambda: torch.addmm(bias, a, w.t(), beta=0.5, alpha=2.0),
        "addmm_beta0": lambda: torch.addmm(torch.full_like(bias, float("nan")), a, w_kn, beta=0),
        "addmm_out": lambda: torch.addmm(bias, a, w.t(), out=out_like()),
        "addmm_": lambda: bias.repeat(a.shape[0], 1).addmm_(a, w_kn, beta=0.25),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("case", list(_few_row_cases(*[None] * 4)))
def test_few_row_products_match_cpu(dtype, rows, case):
    g = torch.Generator().manual_seed(rows)
    n, k = 130, 77  # off every vector width
    cpu = [torch.randn(*s, generator=g).to(dtype) for s in [(rows, k), (n, k), (k, n), (n,)]]
    before = gemm_native_calls()
    got = _few_row_cases(*[t.to(DEV) for t in cpu])[case]().cpu()
    assert gemm_native_calls() > before  # the native kernel ran
    exact = _few_row_cases(*[t.double() for t in cpu])[case]()
    assert got.dtype == dtype and got.shape == exact.shape
    # float32 sums rounded once at the end: within the dtype's rounding of the exact result
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)
    close(got.to(DEV), _few_row_cases(*cpu)[case](), dtype, scale=4.0)


def test_few_row_products_elsewhere_take_atens_product(native_off):
    g = torch.Generator().manual_seed(0)
    a, w, bias = torch.randn(2, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32)
    before = gemm_native_calls()
    assert torch.equal(F.linear(a.to(DEV), w.to(DEV), bias.to(DEV)).cpu(), F.linear(a, w, bias))
    assert gemm_native_calls() == before


def test_few_row_products_not_taken():
    """Five rows, an output overlapping an input, a weight with neither layout, integer and
    mixed-device operands: ATen's product (CPU's bits, CPU's errors)."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(5, 48, generator=g), torch.randn(48, 40, generator=g)
    before = gemm_native_calls()
    assert torch.equal(torch.mm(a.to(DEV), w.to(DEV)).cpu(), torch.mm(a, w))
    wide = torch.randn(48, 80, generator=g)  # a view with columns 2 apart, rows 80 apart
    assert torch.equal(torch.mm(a[:2].to(DEV), wide.to(DEV)[:, ::2]).cpu(),
                       torch.mm(a[:2], wide[:, ::2]))
    sq = torch.randn(2, 2, generator=g)
    d = sq.to(DEV)
    torch.mm(d, d.clone(), out=d)  # out is an input: left to ATen
    ref = sq.clone()
    torch.mm(ref, sq.clone(), out=ref)
    torch.testing.assert_close(d.cpu(), ref)
    ints = torch.randint(0, 5, (2, 3))
    assert torch.equal(torch.mm(ints.to(DEV), ints.t().to(DEV)).cpu(), torch.mm(ints, ints.t()))
    assert gemm_native_calls() == before
    with pytest.raises(RuntimeError, match="size mismatch|cannot be multiplied|shapes"):
        torch.mm(torch.ones(2, 3, device=DEV), torch.ones(4, 5, device=DEV))
    with pytest.raises(RuntimeError, match="device|neuron|cpu"):
        torch.mm(torch.ones(2, 3, device=DEV), torch.ones(3, 5))


def test_few_row_products_in_a_decode_step_match_cpu():
    """GPT-2's Conv1D layers and a tied lm head, token by token, under autograd's no_grad."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 192), torch.nn.GELU(),
                                torch.nn.Linear(192, 64), torch.nn.Linear(64, 500, bias=False))
    x = torch.randn(1, 3, 64)
    with torch.no_grad():
        ref = model(x)
        got = model.to(DEV)(x.to(DEV)).cpu()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
