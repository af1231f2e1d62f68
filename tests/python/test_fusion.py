# Adaptive eager (TORCH_NEURONX_ENABLE_CONCATENATION=1 / torch.neuron.set_fusion_enabled): fused
# runs must be BITWISE identical to plain eager on the same device (which test_opinfo.py checks
# against CPU): a GPT training step (fp32 and bf16 autocast, outputs, gradients and AdamW
# updates), every fusible op per dtype, random op chains (hypothesis), plus the machinery:
# dead intermediates, kernel cache, each boundary kind (log reasons), stats, log, threads.
import sys
import threading

import pytest
import torch
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(REPO / "examples"))
from gpt import GPT, GPTConfig

NEURON = "neuron"


@pytest.fixture
def fusion():
    """Adaptive eager off before and after the test; stats reset."""
    torch.neuron.set_fusion_enabled(False)
    torch.neuron.reset_fusion_stats()
    yield
    torch.neuron.set_fusion_enabled(False)
    torch.neuron.set_fusion_max_ops(64)


_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape, strides and bits (any NaN equals any NaN)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert a.stride() == b.stride(), (what, a.stride(), b.stride())
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype in _INT_VIEW:
        iv = _INT_VIEW[a.dtype]
        same = (a.contiguous().view(iv) == b.contiguous().view(iv)) | (a.isnan() & b.isnan())
        bad = (~same).sum().item()
        assert bad == 0, f"{what}: {bad} of {a.numel()} elements differ bitwise"
    else:
        assert torch.equal(a, b), what


def run_both(fn, *args):
    """fn(*args) with adaptive eager off, then on; returns (off, on) results (on the CPU)."""
    torch.neuron.set_fusion_enabled(False)
    off = fn(*args)
    torch.neuron.synchronize()
    torch.neuron.set_fusion_enabled(True)
    on = fn(*args)
    torch.neuron.synchronize()
    torch.neuron.set_fusion_enabled(False)
    return off, on


# ---------------------------------------------------------------------------------------------
# 1. A GPT-style training step: outputs, gradients and AdamW updates bitwise identical.


def gpt_steps(autocast: bool, steps: int = 3, use_sdpa: bool = False):
    cfg = GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=32, use_sdpa=use_sdpa)
    torch.manual_seed(0)
    model = GPT(cfg).to(NEURON)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    out = {"loss": [], "grads": []}
    for _ in range(steps):
        idx = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=g).to(NEURON)
        tgt = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=g).to(NEURON)
        with torch.autocast(NEURON, dtype=torch.bfloat16, enabled=autocast):
            logits, loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        out["loss"].append(loss.detach().cpu())
        out["logits"] = logits.detach().cpu()
        out["grads"].append({k: p.grad.detach().cpu() for k, p in model.named_parameters()})
        opt.step()
    out["params"] = {k: p.detach().cpu() for k, p in model.named_parameters()}
    return out


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("use_sdpa", [False, True], ids=["explicit-attention", "sdpa"])
def test_gpt_training_steps_bitwise_identical(fusion, autocast, use_sdpa):
    off, on = run_both(gpt_steps, autocast, 3, use_sdpa)
    stats = torch.neuron.fusion_stats()
    assert stats["ops_fused"] > 0 and stats["kernels"] > 0, stats
    for i, (a, b) in enumerate(zip(off["loss"], on["loss"])):
        assert_bitwise(a, b, f"loss step {i}")
    assert_bitwise(off["logits"], on["logits"], "logits")
    for i, (ga, gb) in enumerate(zip(off["grads"], on["grads"])):
        for k in ga:
            assert_bitwise(ga[k], gb[k], f"grad {k} step {i}")
    for k in off["params"]:
        assert_bitwise(off["params"][k], on["params"][k], f"param {k}")


# ---------------------------------------------------------------------------------------------
# 2. Every fusible op, per dtype, on sizes that exercise chunk tails and threads.

FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def make(shape, dtype, seed=0, transposed=False):
    g = torch.Generator().manual_seed(seed)
    if transposed and len(shape) >= 2:
        shape = list(shape[:-2]) + [shape[-1], shape[-2]]
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dtype in (torch.int64, torch.int32):
        t = torch.randint(-5, 6, shape, generator=g, dtype=dtype)
    else:
        t = (torch.randn(shape, generator=g) * 2).to(dtype)
    t = t.to(NEURON)
    return t.transpose(-1, -2) if transposed and len(shape) >= 2 else t


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "tanh": torch.tanh, "exp": torch.exp,
    "log": lambda x: torch.log(x.abs()), "cos": torch.cos, "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs()), "reciprocal": torch.reciprocal,
    "erf": torch.erf, "relu": torch.relu, "square": torch.square, "cube": lambda x: x**3,
    "pow2": lambda x: torch.pow(x, 2), "scalar_mul": lambda x: x * 0.1,
    "scalar_add": lambda x: x + 0.3, "scalar_div": lambda x: x / 3, "rsub": lambda x: 1 - x,
    "cast_f32": lambda x: x.float(), "cast_bf16": lambda x: x.to(torch.bfloat16),
    "cast_f16": lambda x: x.half(), "cast_bool": lambda x: x.bool(), "gt0": lambda x: x > 0.25,
    "to_f64": lambda x: x.double(),
}


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_each_unary_op_bitwise(fusion, name, dtype):
    fn = UNARY[name]
    # one op feeding another, so the op is inside a group; 1000003 elements: chunk tails
    x = make([1000003], dtype, seed=3)
    xt = make([37, 29], dtype, seed=4, transposed=True)

    def chain(a):
        return fn(a * 1) if name not in ("cast_bool", "gt0") else fn(a * 1).logical_not()

    for a in (x, xt):
        off, on = run_both(chain, a)
        assert_bitwise(off, on, f"{name} {dtype} {tuple(a.shape)}")


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "where": lambda a, b: torch.where(a > b, a, b),
}


BINARY_DTYPES = [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16), (torch.bfloat16, torch.float32), (torch.int64, torch.int64),
    (torch.int64, torch.float32), (torch.bool, torch.int64),
]
# eager rejects bool subtraction (test_opinfo.py checks the error); every other pair runs
BINARY_CASES = [(n, d) for n in sorted(BINARY) for d in BINARY_DTYPES
                if not (n == "sub" and torch.bool in d)]


@pytest.mark.parametrize(("name", "dtypes"), BINARY_CASES, ids=str)
def test_each_binary_op_bitwise_with_broadcast(fusion, name, dtypes):
    fn = BINARY[name]
    a = make([64, 1, 33], dtypes[0], seed=5)
    b = make([7, 33], dtypes[1], seed=6)

    def chain(x, y):
        return fn(x * 1 if x.dtype != torch.bool else x, y)

    off, on = run_both(chain, a, b)
    assert_bitwise(off, on, f"{name} {dtypes}")


def test_tanh_gelu_chain_matches_cpu(fusion):
    x = torch.randn(4096 + 7) * 3

    def gelu(t):
        return 0.5 * t * (1.0 + torch.tanh(0.7978845608028654 * (t + 0.044715 * t * t * t)))

    torch.neuron.set_fusion_enabled(True)
    y = gelu(x.to(NEURON))
    assert_bitwise(y, gelu(x), "tanh-gelu fused vs CPU")
    assert torch.neuron.fusion_stats()["ops_fused"] >= 8


# ---------------------------------------------------------------------------------------------
# 3. Random chains (hypothesis): shapes with broadcasting, transposed inputs, mixed dtypes,
#    fusible and non-fusible ops, results kept alive or dropped at random.

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
UNARY_OPS = ["neg", "abs", "tanh", "exp", "log", "sqrt", "rsqrt", "reciprocal", "erf", "cos",
             "relu", "square", "cube", "sigmoid", "sum", "amax", "transpose", "mul_",
             "cast", "scalar"]
BINARY_OPS = ["add", "sub", "mul", "div", "lt", "ge", "eq", "where", "maximum", "iadd", "imul",
              "iadd_input", "lerp", "addcmul", "addcdiv"]


@st.composite
def programs(draw):
    ndim = draw(st.integers(1, 3))
    base = draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim))
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = [d if draw(st.booleans()) else 1 for d in base]
        shape = shape[draw(st.integers(0, ndim - 1)):]
        inputs.append((draw(st.sampled_from(DTYPES)), shape, draw(st.booleans()),
                       draw(st.integers(0, 1 << 16))))
    ops = draw(st.lists(st.tuples(
        st.sampled_from(UNARY_OPS + BINARY_OPS), st.integers(0, 99), st.integers(0, 99),
        st.integers(0, 99), st.sampled_from([0.5, -1.25, 2, 3, 0.1]),
        st.sampled_from(DTYPES)), min_size=1, max_size=14))
    keep = draw(st.lists(st.booleans(), min_size=len(ops), max_size=len(ops)))
    return inputs, ops, keep


def _float(t):
    return t if t.is_floating_point() else t.float()


def apply_op(pool, op):
    name, i, j, k, s, dt = op
    a, b, c = pool[i % len(pool)], pool[j % len(pool)], pool[k % len(pool)]
    if name in ("tanh", "exp", "erf", "cos", "sigmoid", "reciprocal"):
        return getattr(torch, name)(_float(a))
    if name in ("log", "sqrt", "rsqrt"):
        return getattr(torch, name)(_float(a).abs())
    if name in ("neg", "abs", "relu"):
        a = a if a.dtype != torch.bool else a.to(torch.int64)
        return getattr(torch, name)(a)
    if name in ("square", "cube"):
        return _float(a) ** (2 if name == "square" else 3)
    if name == "sum":
        return a.sum(-1, keepdim=True)
    if name == "amax":
        return a.amax(-1, keepdim=True) if a.dtype != torch.bool else a.any(-1, keepdim=True)
    if name == "transpose":
        return a.transpose(0, -1)
    if name == "mul_":
        t = a.clone() if a.dtype != torch.bool else a.to(torch.int64)
        return t.mul_(2)
    if name == "cast":
        if a.is_floating_point() and dt == torch.int64:
            dt = torch.float32  # float -> int of out-of-range values is undefined
        return a.to(dt)
    if name == "scalar":
        x = a if a.dtype != torch.bool else a.to(torch.int64)
        return [x * s, x + s, s - x, x / s, x > s][j % 5]
    if name in ("add", "mul"):
        return getattr(torch, name)(a, b)
    if name == "sub":
        if a.dtype == torch.bool and b.dtype == torch.bool:
            a = a.to(torch.int64)
        elif a.dtype == torch.bool or b.dtype == torch.bool:
            a, b = a.to(torch.int64), b.to(torch.int64)
        return a - b
    if name == "div":
        return torch.div(a, b)
    if name in ("lt", "ge", "eq"):
        return getattr(torch, name)(a, b)
    if name == "where":
        return torch.where(c > 0 if c.dtype != torch.bool else c, a, b)
    if name == "maximum":
        return torch.maximum(a, b)
    if name == "iadd_input":  # in-place on whatever a is (an input, a pending result, a view)
        if a.dtype == torch.bool:
            return a.logical_not_()
        return a.add_(b)
    if name in ("lerp", "addcmul", "addcdiv"):
        x, y, z = _float(a), _float(b), _float(c)
        if name == "lerp":
            return torch.lerp(x, y.to(x.dtype), s / 4)
        if name == "addcmul":
            return torch.addcmul(x, y, z, value=s)
        return torch.addcdiv(x, y, z, value=s)
    if name in ("iadd", "imul"):  # in-place on a (pending) result
        t = a * 1 if a.dtype != torch.bool else a.to(torch.int64)
        return t.add_(b) if name == "iadd" else t.mul_(b)
    raise AssertionError(name)


def run_program(prog):
    inputs, ops, keep = prog
    pool = [make(shape, dt, seed, tr) for dt, shape, tr, seed in inputs]
    kept = []
    for op, k in zip(ops, keep):
        try:
            r = apply_op(pool, op)
        except RuntimeError as e:  # shapes that do not broadcast: the same in both runs
            kept.append(("error", str(e).split("\n")[0]))
            continue
        pool.append(r)
        if k:
            kept.append(r)
        else:
            pool[-1] = r  # referenced only by the pool until overwritten below
        if len(pool) > 4 and not k:
            del pool[0]
    kept.append(pool[-1])
    return [r.cpu() if isinstance(r, torch.Tensor) else r for r in kept]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=programs())
def test_random_chains_bitwise_identical(prog):
    torch.neuron.set_fusion_enabled(False)
    try:
        off, on = run_both(run_program, prog)
    finally:
        torch.neuron.set_fusion_enabled(False)
    assert len(off) == len(on)
    for i, (a, b) in enumerate(zip(off, on)):
        if isinstance(a, tuple):
            assert a == b
        else:
            assert_bitwise(a, b, f"result {i} of {prog}")


# ---------------------------------------------------------------------------------------------
# 4. Machinery: dead intermediates, cache, stats, boundaries and their log reasons, threads.


def test_dead_intermediates_are_not_written(fusion):
    torch.neuron.set_fusion_enabled(True)
    x = torch.randn(1 << 16, device=NEURON)
    y = ((x * 2 + 1) * x - 3).exp()  # 5 results, 4 dead
    torch.neuron.synchronize()
    s = torch.neuron.fusion_stats()
    assert s["ops_fused"] == 5 and s["groups"] == 1 and s["kernels"] == 1, s
    assert s["outputs_written"] == 1 and s["outputs_dead"] == 4, s
    # eager: 5 ops x (read + write) of 256 KiB (+ one more read for * x); fused: x in, y out
    assert s["bytes_saved"] == (11 - 2) * x.numel() * 4, s
    assert_bitwise(y, ((x.cpu() * 2 + 1) * x.cpu() - 3).exp())


def test_referenced_intermediate_is_written(fusion):
    torch.neuron.set_fusion_enabled(True)
    x = torch.randn(1000, device=NEURON)
    a = x * 3
    b = a + 1
    torch.neuron.synchronize()
    assert torch.neuron.fusion_stats()["outputs_written"] == 2
    assert_bitwise(a, x.cpu() * 3)
    assert_bitwise(b, x.cpu() * 3 + 1)


def test_inplace_ops_on_pending_results_are_fused(fusion):
    x = torch.randn(1000, 7, device=NEURON)

    def f(x):
        y = x * 2
        y.add_(1)
        y.mul_(3)
        y.tanh_()  # tanh.out(y, out=y): the boxed path
        y += x
        return y

    off, on = run_both(f, x)
    assert_bitwise(off, on)
    s = torch.neuron.fusion_stats()
    assert s["ops_fused"] == 5 and s["groups"] == 1 and s["outputs_written"] == 1, s


def test_inplace_on_an_input_keeps_eager_order(fusion):
    x = torch.randn(100, device=NEURON)
    xc = x.cpu()
    torch.neuron.set_fusion_enabled(True)
    y = x * 2
    x.add_(1)  # fused (exact aliasing); y must see the old x
    z = x * 3  # and z the new one
    assert_bitwise(y, xc * 2)
    assert_bitwise(x, xc + 1)
    assert_bitwise(z, (xc + 1) * 3)
    assert torch.neuron.fusion_stats()["ops_fused"] == 3


def adamw_like(p, g, m, v, wd=0.01, lr=1e-3, b1=0.9, b2=0.999):
    """The single-tensor AdamW update, in place on p, m, v (what torch.optim runs per param)."""
    p.mul_(1 - lr * wd)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v.sqrt() / 0.3).add_(1e-8)
    p.addcdiv_(m, denom, value=-lr / 0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optimizer_update_fuses_in_place_and_is_bitwise(fusion, dtype):
    def step():
        p, g, m = (make([300, 7], dtype, seed=s) for s in (1, 2, 3))
        v = make([300, 7], dtype, seed=4).abs()
        for _ in range(3):
            adamw_like(p, g, m, v)
        return p, m, v

    off, on = run_both(step)
    for a, b in zip(off, on):
        assert_bitwise(a, b)
    # lerp/addcmul/addcdiv fuse in f32: one group per update (addcmul/lerp only where ATen's
    # kernels use fma, i.e. not under ATEN_CPU_CAPABILITY=default: see aten_ops.cpp)
    if dtype == torch.float32 and torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        s = torch.neuron.fusion_stats()
        assert s["ops_fused"] == 24 and s["kernels"] <= 4, s


def test_all_dead_group_launches_nothing(fusion):
    torch.neuron.set_fusion_enabled(True)
    x = torch.randn(1000, device=NEURON)
    (x * 3).tanh()  # result dropped at once
    torch.neuron.synchronize()
    s = torch.neuron.fusion_stats()
    assert s["groups"] == 1 and s["kernels"] == 0 and s["outputs_dead"] == 2, s


@pytest.mark.parametrize("n_ops", [200, 2000])
def test_long_groups_need_no_more_memory_than_eager(run_py, n_ops):
    # Dead results and dead inputs give their blocks back while the group is still open (a
    # reused block may only come back as an exactly aliased output): peak memory is eager's,
    # and results stay bitwise equal. In a fresh process: early release of dead inputs holds
    # only on a device whose work has all been on its default stream (earlier tests use others).
    code = f"""
        import torch
        mib = 1 << 20
        a0 = torch.rand(mib, device="neuron")

        def chain():
            a = a0.clone()
            torch.neuron.synchronize()
            base = torch.neuron.memory_allocated()
            torch.neuron.reset_peak_memory_stats()
            for _ in range({n_ops}):
                a = a * 1.0001
            torch.neuron.synchronize()
            return a.cpu(), torch.neuron.max_memory_allocated() - base

        torch.neuron.set_fusion_enabled(False)
        ref, eager_peak = chain()
        torch.neuron.set_fusion_enabled(True)
        out, fused_peak = chain()
        torch.neuron.set_fusion_enabled(False)
        assert torch.equal(ref.view(torch.int32), out.view(torch.int32))
        assert fused_peak <= eager_peak <= 4 * mib, (fused_peak, eager_peak)
        dead = torch.neuron.fusion_stats()["outputs_dead"]
        assert dead >= {n_ops} - {n_ops} // 64 - 1, dead
        print("OK")
    """
    r = run_py(code)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


def test_reused_block_of_a_dead_input_closes_the_group_unless_exactly_aliased(run_py):
    code = (
        "import torch\n"
        "x = torch.randn(64, 64, device='neuron'); torch.neuron.synchronize()\n"
        "a = x.clone(); torch.neuron.synchronize()\n"
        "y = a.t() * 2\n"      # reads a transposed; a's block dies with a
        "del a\n"
        "z = x * 3\n"          # may get a's block: not an exact alias of the transposed read
        "torch.neuron.synchronize()\n"
        "assert torch.equal(y.cpu(), x.cpu().t() * 2) and torch.equal(z.cpu(), x.cpu() * 3)\n"
        "print('OK')\n"
    )
    r = run_py(code, env={"TORCH_NEURONX_ENABLE_CONCATENATION": "1", "OPENNEURON_FUSION_LOG": "1"})
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    assert "closed by: memory reuse" in r.stderr, r.stderr


def test_kernel_cache_hits_on_repeated_structure(fusion):
    torch.neuron.set_fusion_enabled(True)
    for n in (1000, 1000, 5000, 77):  # the kernel does not depend on sizes
        x = torch.randn(n, device=NEURON)
        y = (x * 2).tanh() + 1
        torch.neuron.synchronize()
        assert_bitwise(y, (x.cpu() * 2).tanh() + 1)
    s = torch.neuron.fusion_stats()
    assert s["cache_misses"] == 1 and s["cache_hits"] == 3, s


def test_stats_and_reset(fusion):
    torch.neuron.set_fusion_enabled(True)
    x = torch.randn(100, device=NEURON)
    y = x + 1
    torch.neuron.synchronize()
    s = torch.neuron.fusion_stats()
    assert set(s) >= {"groups", "ops_fused", "cache_hits", "cache_misses", "bytes_saved"}
    assert s["ops_fused"] == 1 and s["groups"] == 1
    torch.neuron.reset_fusion_stats()
    assert all(v == 0 for v in torch.neuron.fusion_stats().values())
    del y


def test_enabled_toggle_and_context_manager(fusion):
    assert not torch.neuron.is_fusion_enabled()
    with torch.neuron.fusion_enabled():
        assert torch.neuron.is_fusion_enabled()
        x = torch.randn(10, device=NEURON)
        y = x * 2
    assert not torch.neuron.is_fusion_enabled()
    # switching off closed the pending group
    assert torch.neuron.fusion_stats()["groups"] == 1
    assert_bitwise(y, x.cpu() * 2)


BOUNDARY_SNIPPETS = {
    "aten::mm.out": "y = (x * 2).tanh(); z = torch.mm(y, y)",
    "copy": "y = x * 2; v = y.sum().item() if False else y[0, 0].item()",
    "synchronize": "y = x * 2; torch.neuron.synchronize()",
    "event record": "y = x * 2; torch.neuron.Event().record()",
    "event query": "e = torch.neuron.Event(); e.record(); y = x * 2; e.query()",
    "stream change": "s = torch.neuron.Stream()\ny = x * 2\nwith torch.neuron.stream(s):\n"
                     "    z = x + 1\ntorch.neuron.synchronize()",
    "shape change": "y = x * 2; z = x[0] + 1",
    "size limit": "torch.neuron.set_fusion_max_ops(3)\ny = x\nfor _ in range(5): y = y + 1",
    "in-place op": "y = x.t() * 2; x.tanh_()",
    "writes memory a pending op uses": "z = torch.empty_like(x); y = x * z; torch.exp(x, out=z)",
    "reads a view of a pending result": "y = x * 2; z = y.t() + 1",
    "other work enqueued": "y = x * 2; z = torch.zeros(3, device='neuron')",
    "aten::sum.IntList_out": "y = x * 2; z = y.sum(0)",
}


@pytest.mark.parametrize("reason", sorted(BOUNDARY_SNIPPETS))
def test_boundary_closes_group_with_logged_reason(run_py, reason):
    code = (
        "import torch\n"
        "x = torch.randn(8, 8, device='neuron')\n"
        "torch.neuron.synchronize()\n"
        f"{BOUNDARY_SNIPPETS[reason]}\n"
        "torch.neuron.synchronize()\n"
        "print('OK', torch.neuron.is_fusion_enabled())\n"
    )
    r = run_py(code, env={"TORCH_NEURONX_ENABLE_CONCATENATION": "1", "OPENNEURON_FUSION_LOG": "1"})
    assert r.returncode == 0, r.stderr
    assert "OK True" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[openneuron fusion] group")]
    assert lines, r.stderr
    assert any(f"closed by: {reason} |" in ln for ln in lines), "\n".join(lines)


def test_device_change_closes_group(fusion):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices (NEURON_RT_VISIBLE_CORES)")
    torch.neuron.set_fusion_enabled(True)
    x0 = torch.randn(100, device="neuron:0")
    x1 = torch.randn(100, device="neuron:1")
    y0 = x0 * 2
    y1 = x1 * 3
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(1)
    assert torch.neuron.fusion_stats()["groups"] >= 2
    assert_bitwise(y0, x0.cpu() * 2)
    assert_bitwise(y1, x1.cpu() * 3)


def test_functional_ops_on_a_second_device(fusion):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices (NEURON_RT_VISIBLE_CORES)")
    x = torch.randn(50, 3, device="neuron:1")

    def f(t):
        return torch.where(t > 0, t, t * 0.5), torch.relu(t * 2)

    off, on = run_both(f, x)
    for a, b in zip(off, on):
        assert b.device == torch.device("neuron:1")
        assert_bitwise(a, b)
    assert torch.neuron.fusion_stats()["ops_fused"] >= 5


def test_log_line_format(run_py):
    code = (
        "import torch\n"
        "x = torch.randn(1000, device='neuron')\n"
        "y = ((x * 2).tanh() + 1).cpu()\n"
    )
    r = run_py(code, env={"TORCH_NEURONX_ENABLE_CONCATENATION": "1", "OPENNEURON_FUSION_LOG": "1"})
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("[openneuron fusion]")][-1]
    assert "3 ops [mul,tanh,add]" in line and "shape [1000]" in line, line
    assert "closed by: copy" in line and "outputs written 1, dead 2" in line, line
    assert "bytes eager 24000 fused 8000 saved 16000" in line, line


def test_env_var_off_by_default(run_py):
    r = run_py("import torch; print(torch.neuron.is_fusion_enabled())",
               env={"TORCH_NEURONX_ENABLE_CONCATENATION": None})
    assert r.stdout.strip() == "False", r.stderr


def test_launch_blocking_overrides_env_switch(run_py):
    code = "import torch; print(torch.neuron.is_fusion_enabled())"
    env = {"TORCH_NEURONX_ENABLE_CONCATENATION": "1"}
    assert run_py(code, env=env).stdout.strip() == "True"
    env["NEURON_LAUNCH_BLOCKING"] = "1"
    assert run_py(code, env=env).stdout.strip() == "False"


def test_threads_record_while_another_synchronizes(fusion):
    torch.neuron.set_fusion_enabled(True)
    errors = []
    xs = [torch.randn(257, 33, device=NEURON) for _ in range(4)]
    refs = [((x.cpu() * 2).tanh() - x.cpu()) * 0.5 for x in xs]

    def worker(i):
        try:
            for _ in range(30):
                y = ((xs[i] * 2).tanh() - xs[i]) * 0.5
                torch.testing.assert_close(y.cpu(), refs[i], rtol=0, atol=0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def syncer():
        for _ in range(100):
            torch.neuron.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=syncer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert torch.neuron.fusion_stats()["ops_fused"] > 0


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
