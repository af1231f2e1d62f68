"""torch.nn.attention.flex_attention on neuron (openneuron/_inductor/flex_attention.py): eager and
compiled, forward and backward, block masks (causal, sliding window, documents), score_mod with a
learnable bias, GQA, bf16, against a dense reference computed on CPU in float64 (CPU PyTorch has
no flex-attention backward to compare with) and against compiled flex attention on CPU for
inference. The compile cache is shared by the test run (conftest.py)."""
import copy
import math

import pytest
import torch
import torch._dynamo
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DEV = torch.device("neuron:0")
B, H, S, D = 2, 4, 256, 32


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv < 64)


def documents(device):
    """Causal attention within three documents of up to 96 tokens (a captured tensor)."""
    doc = (torch.arange(S) // 96).to(device)

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)
    return mask_mod


MASKS = {"causal": lambda device: causal, "sliding_window": lambda device: sliding_window,
         "documents": documents}


def dense_mask(mask_mod):
    return mask_mod(0, 0, torch.arange(S).view(-1, 1), torch.arange(S).view(1, -1))


def reference(q, k, v, mask, bias=None):
    """Dense attention in float64 on CPU; bias[h, q - kv + S - 1] added to the scores."""
    q, k, v = (t.double() for t in (q, k, v))
    if k.size(1) != q.size(1):  # GQA
        rep = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        rel = torch.arange(S).view(-1, 1) - torch.arange(S).view(1, -1) + S - 1
        scores = scores + bias.double()[:, rel]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def inputs(dtype=torch.float32, kv_heads=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g, dtype=dtype)
    k = torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype)
    return q, k, v


def grads(fn, q, k, v, device, extra=()):
    leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v, *extra)]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(7)
    out.backward(torch.randn(out.shape, generator=g).to(device, out.dtype))
    return out.detach().cpu(), [t.grad.cpu() for t in leaves]


@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_forward_and_backward_match_dense_reference(mask_name, compiled):
    q, k, v = inputs()
    block_mask = create_block_mask(MASKS[mask_name](DEV), None, None, S, S, device=DEV)
    attn = torch.compile(flex_attention) if compiled else flex_attention
    out, got = grads(lambda q, k, v: attn(q, k, v, block_mask=block_mask), q, k, v, DEV)
    mask = dense_mask(MASKS[mask_name]("cpu"))
    ref_out, ref = grads(lambda q, k, v: reference(q, k, v, mask), q, k, v, "cpu")
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", got, ref):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_compiled_inference_matches_cpu(mask_name):
    # no gradient: Inductor's C++ flash template on both devices
    q, k, v = inputs()
    attn = torch.compile(flex_attention)
    with torch.no_grad():
        want = attn(q, k, v, block_mask=create_block_mask(MASKS[mask_name]("cpu"), None, None,
                                                          S, S, device="cpu"))
        got = attn(q.to(DEV), k.to(DEV), v.to(DEV),
                   block_mask=create_block_mask(MASKS[mask_name](DEV), None, None, S, S,
                                                device=DEV))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_score_mod_with_learnable_bias_gets_its_gradient():
    q, k, v = inputs()
    bias = torch.randn(H, 2 * S - 1, generator=torch.Generator().manual_seed(3)) * 0.5
    block_mask = create_block_mask(causal, None, None, S, S, device=DEV)

    def run(q, k, v, bias):
        def rel_bias(score, b, h, qi, kvi):
            return score + bias[h, qi - kvi + S - 1]
        return flex_attention(q, k, v, score_mod=rel_bias, block_mask=block_mask)

    out, got = grads(torch.compile(run), q, k, v, DEV, extra=(bias,))
    ref_out, ref = grads(lambda q, k, v, b: reference(q, k, v, dense_mask(causal), b),
                         q, k, v, "cpu", extra=(bias,))
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("q", "k", "v", "bias"), got, ref):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


def test_grouped_query_attention():
    q, k, v = inputs(kv_heads=2)
    block_mask = create_block_mask(causal, None, None, S, S, device=DEV)
    attn = torch.compile(flex_attention)
    out, got = grads(lambda q, k, v: attn(q, k, v, block_mask=block_mask, enable_gqa=True),
                     q, k, v, DEV)
    ref_out, ref = grads(lambda q, k, v: reference(q, k, v, dense_mask(causal)), q, k, v, "cpu")
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", got, ref):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


def test_bfloat16_forward_and_backward():
    q, k, v = inputs(torch.bfloat16)
    block_mask = create_block_mask(causal, None, None, S, S, device=DEV)
    attn = torch.compile(flex_attention)
    out, got = grads(lambda q, k, v: attn(q, k, v, block_mask=block_mask), q, k, v, DEV)
    ref_out, ref = grads(lambda q, k, v: reference(q, k, v, dense_mask(causal)), q, k, v, "cpu")
    # bf16 inputs, fp32 softmax: within bf16 rounding of the float64 result
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    for name, a, b in zip("qkv", got, ref):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2,
                                   msg=f"grad of {name}")


class FlexBlock(torch.nn.Module):
    """A causal self-attention block whose attention is flex_attention."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x, block_mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if block_mask is None:  # the reference: SDPA on CPU
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = flex_attention(q, k, v, block_mask=block_mask)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, c))


def test_training_steps_with_flex_attention_match_cpu_sdpa():
    torch.manual_seed(0)
    blocks = [FlexBlock() for _ in range(2)]
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(4, 128, 64, generator=g)] * 5  # one batch, fitted

    def run(device, use_flex):
        mods = [copy.deepcopy(b).to(device) for b in blocks]
        params = [p for m in mods for p in m.parameters()]
        opt = torch.optim.SGD(params, lr=0.02)
        mask = create_block_mask(causal, None, None, 128, 128, device=device) if use_flex \
            else None

        def step(x):
            for m in mods:
                x = m(x, mask)
            return x.square().mean()

        fn = torch.compile(step) if use_flex else step
        losses = []
        for x in data:
            loss = fn(x.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    got, want = run(DEV, True), run(torch.device("cpu"), False)
    assert want[-1] < want[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_flex_attention_imported_before_anything_compiles(run_py):
    # importing flex attention first imports torch._dynamo inside an Inductor import cycle:
    # the neuron registration must wait for it, not fail
    r = run_py("""
        import warnings
        warnings.simplefilter("error", RuntimeWarning)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        import torch
        q = torch.randn(1, 2, 128, 16, device="neuron")
        mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 128, 128,
                                 device="neuron")
        with torch.no_grad():
            out = torch.compile(flex_attention)(q, q, q, block_mask=mask)
        print("ok", out.shape)
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr[-3000:]


def test_hugging_face_llama_with_flex_attention_matches_cpu_sdpa():
    # attn_implementation="flex_attention": Hugging Face compiles flex attention itself and asks
    # for the logsumexp on every device but CPU
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(copy.deepcopy(cfg))
    cfg._attn_implementation = "flex_attention"
    model = transformers.LlamaForCausalLM(cfg)
    model.load_state_dict(ref.state_dict())
    model.to(DEV)
    ids = torch.randint(256, (2, 64), generator=torch.Generator().manual_seed(2))

    loss = model(ids.to(DEV), labels=ids.to(DEV)).loss
    loss.backward()
    want = ref(ids, labels=ids).loss
    want.backward()
    torch.testing.assert_close(loss.item(), want.item(), rtol=1e-5, atol=0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=name)

    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids.to(DEV)).logits.cpu(), ref(ids).logits,
                                   rtol=1e-5, atol=1e-5)
    got = model.generate(ids[:1, :8].to(DEV), max_new_tokens=10, do_sample=False)
    assert torch.equal(got.cpu(), ref.generate(ids[:1, :8], max_new_tokens=10, do_sample=False))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_under_autocast(compiled):
    # torch.autocast("neuron", bfloat16): q, k, v cast to bf16 (PyTorch's shim exists for CPU
    # and CUDA only), gradients flow back to the float32 inputs
    q, k, v = inputs()
    block_mask = create_block_mask(causal, None, None, S, S, device=DEV)
    attn = torch.compile(flex_attention) if compiled else flex_attention

    def run(q, k, v):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            out = attn(q, k, v, block_mask=block_mask)
        assert out.dtype == torch.bfloat16
        return out.float()

    out, got = grads(run, q, k, v, DEV)
    ref_out, ref = grads(lambda q, k, v: reference(q, k, v, dense_mask(causal)), q, k, v, "cpu")
    torch.testing.assert_close(out, ref_out.float(), rtol=2e-2, atol=2e-2)
    for name, a, b in zip("qkv", got, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b.float(), rtol=5e-2, atol=5e-2, msg=f"grad of {name}")
