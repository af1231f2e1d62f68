# Errors a user sees from neuron ops: asynchronous failures surface at the next sync point naming
# the op and the Python line that enqueued it; cpu/neuron mixing gives PyTorch's standard
# device-mismatch error; the synchronous fallback is warned once / silent / an error
# (OPENNEURON_FALLBACK) and counted in openneuron.ops_report.
import inspect
import re

import pytest
import torch

import openneuron
from openneuron import _C


def _bad_gather(device):
    x = torch.randn(4, device=device)
    idx = torch.tensor([10], device=device)
    line = inspect.currentframe().f_lineno + 1
    out = torch.index_select(x, 0, idx)  # the CPU kernel checks the index only when it runs
    return out, line


def test_async_error_names_op_and_line(device):
    _, line = _bad_gather(device)
    with pytest.raises(RuntimeError) as info:
        torch.neuron.synchronize()
    text = str(info.value)
    assert "aten::index_select" in text
    assert f"test_errors.py:{line} in _bad_gather" in text
    assert "index out of range" in text
    assert "failed asynchronously" in text


def test_async_error_at_item_and_process_keeps_working(device):
    out, _ = _bad_gather(device)
    with pytest.raises(RuntimeError, match="aten::index_select"):
        out.sum().item()
    torch.neuron.synchronize()  # the error was reported once; the device is usable again
    x = torch.arange(6.0, device=device).reshape(2, 3)
    torch.testing.assert_close((x * 2 + 1).sum(0).cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0))


@pytest.mark.parametrize("fn", [
    lambda a, b: a + b,
    lambda a, b: torch.mm(a, b),
    lambda a, b: torch.cat([a, b]),
    lambda a, b: torch.where(a > 0, a, b),
    lambda a, b: torch.addcmul(a, a, b),
], ids=["add", "mm", "cat", "where", "addcmul"])
def test_device_mismatch_is_pytorch_standard_error(device, fn):
    a = torch.randn(3, 3, device=device)
    b = torch.randn(3, 3)
    # PyTorch's two standard texts: TensorIterator's "... but found at least two devices, ..."
    # and c10::impl::check_and_update_common_device's "... but got <arg> is on cpu, ...".
    pattern = re.escape("Expected all tensors to be on the same device, but ")
    with pytest.raises(RuntimeError, match=pattern):
        fn(a, b)
    with pytest.raises(RuntimeError, match=pattern):
        fn(b, a)


def test_cpu_scalar_tensor_and_cpu_indices_are_allowed(device):
    a = torch.arange(5.0, device=device)
    torch.testing.assert_close((a * torch.tensor(3.0)).cpu(), torch.arange(5.0) * 3)
    idx = torch.tensor([4, 0, 2])
    torch.testing.assert_close(a[idx].cpu(), torch.arange(5.0)[idx])
    b = a.clone()
    b[idx] = torch.tensor([9.0, 8.0, 7.0], device=device)
    torch.testing.assert_close(b.cpu(), torch.tensor([8.0, 1.0, 7.0, 3.0, 9.0]))


def test_fallback_and_sync_ops_are_counted(device):
    _C._ops_report_reset()
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device=device)
    nz = torch.nonzero(x)  # a sync point by nature: its shape depends on values
    torch.testing.assert_close(nz.cpu(), torch.tensor([[1], [3]]))
    assert nz.device.type == "neuron"
    lse = torch.logcumsumexp(x, 0)  # no meta kernel: the synchronous fallback
    torch.testing.assert_close(lse.cpu(), torch.logcumsumexp(x.cpu(), 0))
    y = x + 1
    y.cpu()
    rows = {(r[0], r[1]): r for r in _C._ops_report()}
    assert rows[("aten::nonzero", "sync")][2] == 1 and rows[("aten::nonzero", "sync")][3] > 0
    assert rows[("aten::_logcumsumexp", "fallback")][2] == 1
    assert ("aten::nonzero", "fallback") not in rows
    assert any(p in ("async", "native") and op.startswith("aten::add") for op, p in rows)
    report = openneuron.ops_report(print_table=False)
    assert ("aten::_logcumsumexp", "fallback") in {(r.op, r.path) for r in report}
    _C._ops_report_reset()
    assert not any(r[0] == "aten::nonzero" for r in _C._ops_report())


def test_ops_report_prints_table(device, capsys):
    _C._ops_report_reset()
    torch.unique(torch.tensor([3.0, 1.0, 3.0], device=device))
    torch.logcumsumexp(torch.tensor([3.0, 1.0], device=device), 0)
    rows = openneuron.ops_report()
    out = capsys.readouterr().out
    assert "fallback" in out and "sync" in out and "calls" in out
    assert any(r.path == "sync" and "unique" in r.op for r in rows)


_FALLBACK_SCRIPT = """
import warnings
import torch, openneuron
x = torch.tensor([0.0, 1.0, 2.0], device="neuron")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print("NONZERO", torch.nonzero(x).cpu().flatten().tolist(), x[x > 0].tolist())
    print(x)
    try:
        a = torch.logcumsumexp(x, 0)
        b = torch.logcumsumexp(x, 0)
        print("RESULT", [round(v, 4) for v in a.cpu().tolist()], b.device.type)
    except RuntimeError as e:
        print("ERROR", e)
print("WARNINGS", sum("synchronous CPU fallback" in str(w.message) for w in caught))
"""


def test_fallback_warns_once_by_default(run_py):
    r = run_py(_FALLBACK_SCRIPT)
    assert r.returncode == 0, r.stderr
    assert "RESULT [0.0, 1.3133, 2.4076] neuron" in r.stdout
    assert "WARNINGS 1" in r.stdout  # once, for logcumsumexp; sync points never warn


def test_fallback_silent(run_py):
    r = run_py(_FALLBACK_SCRIPT, env={"OPENNEURON_FALLBACK": "silent"})
    assert r.returncode == 0, r.stderr
    assert "RESULT [0.0, 1.3133, 2.4076] neuron" in r.stdout
    assert "WARNINGS 0" in r.stdout


def test_fallback_error_mode_raises_clear_error(run_py):
    r = run_py(_FALLBACK_SCRIPT, env={"OPENNEURON_FALLBACK": "error"})
    assert r.returncode == 0, r.stderr
    assert "NONZERO [1, 2] [1.0, 2.0]" in r.stdout  # sync points are not fallbacks
    line = next(l for l in r.stdout.splitlines() if l.startswith("ERROR"))
    assert "aten::_logcumsumexp" in line
    assert "synchronous CPU fallback" in line
    assert "OPENNEURON_FALLBACK" in line


def test_async_ops_still_work_in_error_mode(run_py):
    r = run_py("""
import torch, openneuron
x = torch.arange(4.0, device="neuron")
print("SUM", (x * x).sum().item())
""", env={"OPENNEURON_FALLBACK": "error"})
    assert r.returncode == 0, r.stderr
    assert "SUM 14.0" in r.stdout


def test_launch_blocking_raises_at_the_failing_call(run_py):
    r = run_py("""
import torch, openneuron
x = torch.randn(4, device="neuron"); idx = torch.tensor([10], device="neuron")
try:
    torch.index_select(x, 0, idx)
    print("NO ERROR AT CALL")
except RuntimeError as e:
    print("AT CALL:", e)
print("OK", (x * 2).sum().item() == (x.cpu() * 2).sum().item())
""", env={"NEURON_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert "AT CALL:" in r.stdout and "aten::index_select" in r.stdout
    assert "<string>:5" in r.stdout
    assert "OK True" in r.stdout


def test_sync_fallback_keeps_the_cpu_error_type(device):
    x = torch.tensor([1.0, 2.0], device=device)
    with pytest.raises(IndexError):
        x[torch.tensor([True, False, True], device=device)]
