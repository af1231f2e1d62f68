# The `openneuron` command as a user runs it (a subprocess): `openneuron ops-report -- python
# script.py` runs a script and reports each op's path; `openneuron ls` keeps working next to it.
# The report's counters themselves are tested through openneuron.ops_report() in test_errors.py
# and test_autograd.py; the device listing in detail in test_device.py.
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A script with one op of each path: add (native), gt (asynchronous ATen path), nonzero
# (synchronous by nature) and logcumsumexp (synchronous CPU fallback: no meta kernel).
_SCRIPT = """
import sys
import torch

x = torch.arange(-3.0, 5.0, device="neuron")
y = x + 1
mask = y > 0
idx = torch.nonzero(mask)
z = torch.logcumsumexp(y, 0)
print("script ran", idx.shape[0], round(z[-1].item(), 3), sys.argv[1:])
if sys.argv[1] == "raise":
    raise ValueError("the script failed")
sys.exit(int(sys.argv[1]))
"""


def _cli() -> list[str]:
    exe = REPO / ".venv" / "bin" / "openneuron"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "openneuron.cli"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NEURON_RT_VISIBLE_CORES", "OPENNEURON_DEVICE_MEMORY")}
    env["OPENNEURON_FALLBACK"] = "silent"
    return subprocess.run(_cli() + args, check=False, capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(_SCRIPT))
    return path


def _report_rows(stderr: str) -> dict[str, list[str]]:
    """op -> [path, calls, (waited, 'ms')] from the table printed on stderr."""
    return {cols[0]: cols[1:] for cols in (line.split() for line in stderr.splitlines())
            if cols and cols[0].startswith("aten::")}


def test_ops_report_lists_each_path_and_propagates_exit_code(script, tmp_path):
    out = tmp_path / "report.json"
    r = _run(["ops-report", "--json", str(out), "--", "python", str(script), "3"], tmp_path)
    assert r.returncode == 3, r.stderr
    assert "script ran 5 " in r.stdout and "['3']" in r.stdout  # the script saw its argv
    rows = _report_rows(r.stderr)
    assert rows["aten::nonzero"][:2] == ["sync", "1"], r.stderr
    assert rows["aten::_logcumsumexp"][:2] == ["fallback", "1"], r.stderr
    assert rows["aten::add.Tensor"][:2] == ["native", "1"], r.stderr
    assert rows["aten::nonzero"][3] == "ms" and float(rows["aten::nonzero"][2]) >= 0
    assert len(rows["aten::add.Tensor"]) == 2  # no waiting time on the native path
    assert "(exit code 3)" in r.stderr
    report = json.loads(out.read_text())
    assert report["exit_code"] == 3 and report["command"][-1] == "3"
    by_op = {row["op"]: row for row in report["ops"]}
    assert by_op["aten::nonzero"]["path"] == "sync" and by_op["aten::nonzero"]["seconds"] > 0
    assert by_op["aten::_logcumsumexp"]["path"] == "fallback"
    assert by_op["aten::_logcumsumexp"]["calls"] == 1
    assert report["ops"][0]["path"] == "fallback"  # fallbacks first: the rows to act on


def test_ops_report_after_an_exception_and_for_a_module(script, tmp_path):
    r = _run(["ops-report", "--", "python", str(script), "raise"], tmp_path)
    assert r.returncode == 1
    assert "ValueError: the script failed" in r.stderr
    assert _report_rows(r.stderr)["aten::nonzero"][0] == "sync"
    # `python -m module` runs the module as __main__ with its arguments.
    (tmp_path / "neuron_job.py").write_text(textwrap.dedent(_SCRIPT))
    r = _run(["ops-report", "--", "python", "-m", "neuron_job", "0"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "['0']" in r.stdout
    assert _report_rows(r.stderr)["aten::_logcumsumexp"][0] == "fallback"


def test_ops_report_rejects_a_command_that_is_not_python(tmp_path):
    r = _run(["ops-report", "--", "ls", "-l"], tmp_path)
    assert r.returncode == 2
    assert "expected `python script.py [args]`" in r.stderr
    assert "Traceback" not in r.stderr


def test_ls_still_works(tmp_path):
    r = _run(["ls"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "neuron:0" in r.stdout and "CAPACITY" in r.stdout
    r = _run(["--help"], tmp_path)
    assert "ops-report" in r.stdout and "ls" in r.stdout


def test_readme_lists_every_environment_variable():
    # The settings module's table (csrc/runtime/config.cpp) and the README's must agree.
    import openneuron._C as C
    from conftest import REPO

    readme = (REPO / "README.md").read_text()
    missing = [name for name, _, _ in C._settings() if f"| `{name}` |" not in readme]
    assert not missing, f"README 'Environment variables' lacks {missing}"
