# The Python line an asynchronous error names ("file.py:42 in fn") when the same lines issue ops
# again and again: origin_capture.cpp answers repeated lines from per-thread caches without the
# GIL, and must name exactly the line (and, behind torch's own frames, the user's line) that the
# first call named.
import inspect

import pytest
import torch
import torch.nn.functional as F


def _lines_then_fail(bad_at: str, via_torch: bool):
    """Gathers at line "a" and line "b" three times; the third call at bad_at fails. via_torch:
    through F.embedding (torch-internal frames between the op and the user's line)."""
    x = torch.randn(4, 3, device="neuron")
    good = torch.tensor([1], device="neuron")
    bad = torch.tensor([10], device="neuron")
    lines = {}
    for step in range(3):
        ia = bad if step == 2 and bad_at == "a" else good
        ib = bad if step == 2 and bad_at == "b" else good
        if via_torch:
            lines["a"] = inspect.currentframe().f_lineno + 1
            F.embedding(ia, x)
            lines["b"] = inspect.currentframe().f_lineno + 1
            F.embedding(ib, x)
        else:
            lines["a"] = inspect.currentframe().f_lineno + 1
            torch.index_select(x, 0, ia)
            lines["b"] = inspect.currentframe().f_lineno + 1
            torch.index_select(x, 0, ib)
    return lines[bad_at]


@pytest.mark.parametrize("via_torch", [False, True], ids=["direct", "through_torch_functional"])
@pytest.mark.parametrize("bad_at", ["a", "b"])
def test_repeated_lines_name_the_failing_one(bad_at, via_torch):
    line = _lines_then_fail(bad_at, via_torch)
    with pytest.raises(RuntimeError) as info:
        torch.neuron.synchronize()
    text = str(info.value)
    assert "index out of range" in text, text
    assert f"test_origin.py:{line} in _lines_then_fail" in text, text


def _fail_in(fn_line_holder):
    x = torch.randn(4, device="neuron")
    for _ in range(3):
        fn_line_holder.append(inspect.currentframe().f_lineno + 1)
        torch.index_select(x, 0, torch.tensor([1], device="neuron"))
    fn_line_holder.append(inspect.currentframe().f_lineno + 1)
    torch.index_select(x, 0, torch.tensor([10], device="neuron"))


def test_a_new_line_after_cached_ones_is_named():
    lines = []
    _fail_in(lines)
    with pytest.raises(RuntimeError) as info:
        torch.neuron.synchronize()
    assert f"test_origin.py:{lines[-1]} in _fail_in" in str(info.value), str(info.value)
    assert lines[-1] != lines[0]


def test_ops_from_another_thread_name_their_line():
    import threading

    lines, errors = [], []

    def worker():
        try:
            _fail_in(lines)
            torch.neuron.synchronize()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(errors) == 1 and f"test_origin.py:{lines[-1]} in _fail_in" in errors[0], errors
    torch.neuron.synchronize()


def test_origin_capture_is_gil_free_after_warm_up():
    # scripts/origin_harness/check.sh: origin_capture.cpp built alone against this Python's
    # headers; with the GIL released, captures return the lines the GIL path returns and, after
    # warm-up, never take the GIL (run by hand with CPython 3.12, 3.13 and 3.14 too: README).
    import subprocess
    import sys

    from conftest import REPO

    r = subprocess.run(["bash", str(REPO / "scripts/origin_harness/check.sh"), sys.executable],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "GIL path ran 0 times" in r.stdout and "OK:" in r.stdout, r.stdout
