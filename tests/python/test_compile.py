"""torch.compile on neuron through TorchInductor (DESIGN §6): the default backend and
backend="neuron", compiled against eager on neuron (and CPU): GPT training (fp32, bf16 autocast),
inference in half precision, fullgraph and graph breaks, every mode, dynamic shapes (one compile
over several lengths, int and float scalars as kernel arguments), two streams, kernels that read
what queued work writes, the on-disk caches across processes (a hit, a corrupt entry), and the
eager fallback on a compile failure. The compile cache is shared by the whole test run
(conftest.py: TORCHINDUCTOR_CACHE_DIR)."""
import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo

import openneuron._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt import GPT, GPTConfig

DEV = torch.device("neuron:0")
CFG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)


class Counting:
    """backend="neuron", counting the graphs it compiles; any fallback warning fails the test."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs, **kwargs):
        # counted once compiled: a restart of Dynamo's analysis (it may ask the backend to
        # start over, e.g. to turn a float scalar into a tensor) is not a second graph
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "openneuron: torch.compile", RuntimeWarning)
            compiled = openneuron._dynamo.neuron_backend(gm, example_inputs, **kwargs)
        self.graphs += 1
        return compiled


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def batches(n, seq=32, batch=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(64, (batch, seq), generator=g),
             torch.randint(64, (batch, seq), generator=g)) for _ in range(n)]


def train(model, device, steps, compile_kwargs=None, autocast=False):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fn = torch.compile(model, **compile_kwargs) if compile_kwargs is not None else model
    losses = []
    for x, y in batches(steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, loss = fn(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_gpt_training_20_steps_matches_eager(backend):
    torch.manual_seed(0)
    ref = GPT(CFG)
    eager, _ = train(ref, DEV, 20)
    counting = Counting()
    compiled, model = train(ref, DEV, 20, {"backend": counting if backend == "neuron"
                                           else "inductor"})
    cpu, _ = train(ref, torch.device("cpu"), 20)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=0)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(cpu), rtol=1e-3, atol=0)
    assert compiled[-1] < compiled[0]
    if backend == "neuron":
        assert counting.graphs == 1, counting.graphs
    assert all(p.device == DEV for p in model.parameters())


def test_gpt_bf16_autocast_training_matches_eager():
    torch.manual_seed(0)
    ref = GPT(CFG)
    eager, _ = train(ref, DEV, 8, autocast=True)
    compiled, _ = train(ref, DEV, 8, {}, autocast=True)
    # NOTE: bf16 matmul outputs rounded where eager and Inductor's fused kernels round in
    # different places: a few bf16 ulps in the loss
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=2e-2, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inference_matches_eager(dtype):
    torch.manual_seed(0)
    model = GPT(CFG).to(DEV, dtype).eval()
    x = batches(1)[0][0].to(DEV)
    with torch.no_grad():
        ref = model(x)[0].float()
        got = torch.compile(model)(x)[0].float()
    torch.testing.assert_close(got.cpu(), ref.cpu(), rtol=2e-2, atol=2e-2)


def _pointwise(x, y):
    return torch.nn.functional.gelu(x * y + 1).softmax(-1) - x.mean(0)


def test_fullgraph_and_graph_breaks():
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    want = _pointwise(x, y)
    got = torch.compile(_pointwise, fullgraph=True)(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)

    def with_break(a, b):
        c = _pointwise(a, b)
        print("graph break", end="")
        return _pointwise(c, b)

    counting = Counting()
    got = torch.compile(with_break, backend=counting)(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), _pointwise(want, y), rtol=1e-5, atol=1e-6)
    assert counting.graphs == 2
    torch._dynamo.reset()
    with pytest.raises(Exception, match="graph break|Unsupported|print"):
        torch.compile(with_break, fullgraph=True)(x.to(DEV), y.to(DEV))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs"])
def test_every_mode(mode):
    x, y = torch.randn(8, 16), torch.randn(16, 8)

    def f(a, b):
        return (a @ b).relu() + 1

    got = torch.compile(f, mode=mode)(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), f(x, y), rtol=1e-5, atol=1e-5)


def test_dynamic_true_compiles_once_for_every_length():
    torch.manual_seed(0)
    model = GPT(CFG).to(DEV).eval()
    counting = Counting()
    compiled = torch.compile(model, backend=counting, dynamic=True)
    with torch.no_grad():
        for seq in (8, 13, 21, 32):
            x = torch.randint(64, (2, seq), generator=torch.Generator().manual_seed(seq))
            torch.testing.assert_close(compiled(x.to(DEV))[0].cpu(), model(x.to(DEV))[0].cpu(),
                                       rtol=1e-5, atol=1e-5)
    assert counting.graphs == 1, counting.graphs


def test_automatic_dynamic_recompiles_once():
    counting = Counting()

    def f(x):
        return (x.sin() * x.shape[0]).cumsum(0)

    compiled = torch.compile(f, backend=counting)
    for n in (5, 9, 17, 33):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), f(x), rtol=1e-4, atol=1e-4)
    assert counting.graphs == 2, counting.graphs  # static, then dynamic


def test_int_and_float_scalars_reach_the_kernel():
    # Dynamo does not specialize floats (torch._dynamo.config.specialize_float is False): a
    # Python float reaches the kernel as a 0-d CPU tensor, read at launch (the kernel runs
    # later, when that tensor is gone), an int as a symbolic size.
    counting = Counting()

    def f(x, scale, shift):
        return x * scale + shift

    compiled = torch.compile(f, backend=counting, dynamic=True)
    x = torch.randn(64)
    for scale, shift in ((0.5, 3), (-2.25, 7), (1e-3, -11)):
        got = compiled(x.to(DEV), scale, shift)
        torch.testing.assert_close(got.cpu(), f(x, scale, shift), rtol=1e-6, atol=1e-6)
    assert counting.graphs == 1, counting.graphs


def test_kernels_read_what_queued_work_wrote():
    # The compiled kernel is queued behind the matmul that produces its input; run on the
    # Python thread it would read the buffer before the matmul wrote it.
    a = torch.randn(512, 512)
    f = torch.compile(lambda t: (t * 2).tanh().sum(1))
    for _ in range(3):
        big = a.to(DEV) @ a.to(DEV)  # queued, takes a while
        got = f(big)
        torch.testing.assert_close(got.cpu(), ((a @ a) * 2).tanh().sum(1), rtol=1e-4, atol=1e-3)


def test_two_streams_run_compiled_kernels_at_once():
    f = torch.compile(lambda t: (t.exp() + 1).log().cumsum(0))
    xs = [torch.randn(4096, 64) for _ in range(2)]
    f(xs[0].to(DEV))  # compile outside the streams
    streams = [torch.neuron.Stream(), torch.neuron.Stream()]
    outs = []
    for s, x in zip(streams, xs):
        with torch.neuron.stream(s):
            outs.append(f(x.to(DEV, non_blocking=True)))
    torch.neuron.synchronize()
    for o, x in zip(outs, xs):
        torch.testing.assert_close(o.cpu(), (x.exp() + 1).log().cumsum(0), rtol=1e-4, atol=1e-3)


CACHE_SCRIPT = """
import json, sys, torch
from torch._dynamo.utils import counters
import openneuron
def f(x, y):
    return (x @ y).softmax(-1).mul(3).sum(0)
x, y = torch.randn(16, 32), torch.randn(32, 8)
out = torch.compile(f)(x.to("neuron"), y.to("neuron"))
torch.testing.assert_close(out.cpu(), f(x, y), rtol=1e-5, atol=1e-5)
print(json.dumps(dict(counters["inductor"])))
"""


def _inductor_counters(run_py, env):
    import json

    r = run_py(CACHE_SCRIPT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_cache_hit_in_a_second_process(run_py, tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": None}
    first, _ = _inductor_counters(run_py, env)
    assert first.get("fxgraph_cache_miss", 0) >= 1, first
    second, _ = _inductor_counters(run_py, env)
    assert second.get("fxgraph_cache_hit", 0) >= 1 and not second.get("fxgraph_cache_miss"), second


def test_corrupt_cache_entry_is_recompiled(run_py, tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": None}
    _inductor_counters(run_py, env)
    corrupted = 0
    for p in tmp_path.rglob("*"):
        if p.is_file() and "fxgraph" in p.parts:
            p.write_bytes(b"\x00garbage")
            corrupted += 1
    assert corrupted
    counts, stderr = _inductor_counters(run_py, env)  # the script checks its result
    assert counts.get("fxgraph_cache_miss", 0) >= 1 and not counts.get("fxgraph_cache_hit"), counts
    assert "UnpicklingError" in stderr  # Inductor's warning on the entry it could not load


def test_compile_failure_runs_eagerly_with_a_warning(monkeypatch):
    from torch._inductor import compile_fx

    def broken(*args, **kwargs):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(compile_fx, "compile_fx", broken)
    x = torch.randn(8, 8)
    with pytest.warns(RuntimeWarning, match="injected compile failure.*runs eagerly"):
        got = torch.compile(_pointwise, backend="neuron")(x.to(DEV), x.to(DEV))
    torch.testing.assert_close(got.cpu(), _pointwise(x, x), rtol=1e-5, atol=1e-6)


def test_compile_failure_raises_when_fallback_is_disabled(run_py):
    r = run_py("""
        import torch, torch._inductor.compile_fx as cf
        import openneuron
        def broken(*a, **k):
            raise RuntimeError("injected compile failure")
        cf.compile_fx = broken
        try:
            torch.compile(lambda x: x.sin() + 1, backend="neuron")(torch.ones(4, device="neuron"))
        except Exception as e:
            print("raised:", e)
    """, env={"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1"})
    assert "raised:" in r.stdout and "injected compile failure" in r.stdout, r.stdout + r.stderr


def test_save_and_load_cache_artifacts(run_py, tmp_path):
    # torch.compiler's portable cache: saved in one process, loaded into another's empty cache.
    art = tmp_path / "artifacts.bin"
    save = f"""
        import torch
        import openneuron
        torch.compile(lambda x: (x.sin() * 3).cumsum(0))(torch.randn(64, device="neuron"))
        blob, info = torch.compiler.save_cache_artifacts()
        open({str(art)!r}, "wb").write(blob)
        print("saved", sorted(info.artifacts))
    """
    r = run_py(save, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "a")})
    assert r.returncode == 0 and "inductor" in r.stdout, r.stdout + r.stderr[-3000:]
    load = f"""
        import json, torch
        from torch._dynamo.utils import counters
        import openneuron
        torch.compiler.load_cache_artifacts(open({str(art)!r}, "rb").read())
        x = torch.randn(64)
        out = torch.compile(lambda x: (x.sin() * 3).cumsum(0))(x.to("neuron"))
        torch.testing.assert_close(out.cpu(), (x.sin() * 3).cumsum(0), rtol=1e-5, atol=1e-4)
        print(json.dumps(dict(counters["inductor"])))
    """
    r = run_py(load, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "b")})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert '"fxgraph_cache_hit": 1' in r.stdout, r.stdout


def test_neuron_rng_state_calls_inside_a_compiled_function():
    # torch.neuron's functions run eagerly inside compiled code (a graph break), as torch.cuda's
    def fn(x):
        state = torch.neuron.get_rng_state()
        a = torch.rand(4, device=x.device)
        torch.neuron.set_rng_state(state)
        b = torch.rand(4, device=x.device)
        return x + a, x + b

    x = torch.zeros(4, device=DEV)
    a, b = torch.compile(fn)(x)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
