"""OPENNEURON_COMPILE_ASYNC=1 (openneuron/_inductor/async_compile.py): a graph runs eagerly while
Inductor compiles it in a background process, then switches to the compiled code; the same
results throughout; the compiled graph reaches the cache; a failed background compile stays eager
(or raises with TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1); exit does not wait for a compile
and leaves no process behind. Each case is a fresh interpreter with a cold cache of its own (a
warm one would skip the background compile)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO, run_python

pytestmark = pytest.mark.subprocess  # fresh interpreters (make test-isa leaves them out)

# A small model's training steps: the losses of the compiled model (in the background, then
# switched) and of the same model run eagerly, step by step; then the counters.
TRAIN = """
import json, sys, time, warnings, torch, openneuron
from openneuron._inductor import async_compile
torch.manual_seed(0)
def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4)).to("neuron")
CHECK
compiled, eager = make(), make()
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (compiled, eager)]
fn = torch.compile(compiled)
x = torch.randn(64, 16, device="neuron"); y = torch.randint(4, (64,), device="neuron")
def step(f, opt):
    loss = torch.nn.functional.cross_entropy(f(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    return loss.item()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t0 = time.perf_counter()
    first = step(fn, opts[0])
    first_s = time.perf_counter() - t0
    losses = [(first, step(eager, opts[1]))]
    deadline = time.monotonic() + STEPS_FOR
    while time.monotonic() < deadline:
        losses.append((step(fn, opts[0]), step(eager, opts[1])))
        s = async_compile.stats()
        if s["finished"] + s["failed"] >= s["started"]:
            break
        time.sleep(0.05)
    if STEPS_FOR:
        losses += [(step(fn, opts[0]), step(eager, opts[1])) for _ in range(3)]
print(json.dumps({"losses": losses, "stats": async_compile.stats(), "first_s": first_s,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _train(tmp_path, steps_for=240, check="", env=None, timeout=400):
    code = TRAIN.replace("STEPS_FOR", str(steps_for)).replace("CHECK", check)
    r = run_python(code, env={"OPENNEURON_COMPILE_ASYNC": "1",
                              "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), **(env or {})},
                   timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _assert_same_losses(losses):
    for i, (c, e) in enumerate(losses):
        assert abs(c - e) <= 1e-4 * max(1.0, abs(e)), (i, c, e)


def test_runs_eagerly_then_switches_to_the_compiled_graph_and_caches_it(tmp_path):
    out, _ = _train(tmp_path)
    s = out["stats"]
    assert s["started"] == 2, s  # forward and backward, both in the background
    assert s["finished"] == 2 and s["failed"] == 0, s
    assert s["eager_calls"] >= 2 and s["compiled_calls"] >= 3, s
    _assert_same_losses(out["losses"])
    # The next process finds both graphs in the cache: compiled from its first call.
    again, _ = _train(tmp_path, steps_for=0)
    assert again["stats"]["started"] == 0 and again["stats"]["eager_calls"] == 0, again["stats"]
    _assert_same_losses(again["losses"])


def test_a_failed_background_compile_keeps_the_graph_eager(tmp_path):
    # the compile process gets Inductor's configuration: a C++ compiler that does not exist
    bad_cxx = 'torch._inductor.config.cpp.cxx = ("/nonexistent/g++",)'
    out, _ = _train(tmp_path, check=bad_cxx, steps_for=240)
    s = out["stats"]
    assert s["failed"] == s["started"] == 2 and s["compiled_calls"] == 0, s
    assert any("background Inductor compile" in w and "keeps running eagerly" in w
               for w in out["warnings"]), out["warnings"]
    _assert_same_losses(out["losses"])


def test_a_failed_background_compile_raises_when_fallback_is_disabled(tmp_path):
    code = TRAIN.replace("STEPS_FOR", "240").replace(
        "CHECK", 'torch._inductor.config.cpp.cxx = ("/nonexistent/g++",)')
    r = run_python(code, env={"OPENNEURON_COMPILE_ASYNC": "1",
                              "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
                              "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1"}, timeout=400)
    assert r.returncode != 0
    assert "background Inductor compile of" in r.stderr, r.stderr[-3000:]
    assert "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1" in r.stderr


def _session_processes(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                pids.append(int(entry))
    return pids


def test_exit_while_compiling_does_not_wait_and_leaves_no_process(tmp_path):
    code = TRAIN.replace("STEPS_FOR", "0").replace("CHECK", "")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NEURONX_ENABLE_CONCATENATION"}
    env.update(OPENNEURON_COMPILE_ASYNC="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["stats"]["started"] == 2 and out["stats"]["finished"] == 0, out["stats"]
        deadline = time.monotonic() + 10
        while _session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_processes(proc.pid) == []
    finally:
        for pid in _session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
