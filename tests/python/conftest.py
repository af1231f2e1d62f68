# Shared pytest fixtures for the Python tests: a subprocess runner (for anything that depends on
# environment variables read once per process: NEURON_RT_VISIBLE_CORES, OPENNEURON_DEVICE_MEMORY,
# NEURON_LAUNCH_BLOCKING, autoload) and a per-test synchronize so asynchronous errors are
# reported by the test that caused them. Test files are one per capability (test_device.py ...).
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

# One warm torch.compile cache for the whole run (xdist workers and fresh interpreters too);
# kept in the build folder, so a second `make test` starts warm.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / "build" / "torchinductor-tests"))

# Variables a test subprocess must not inherit from the developer's shell.
_CONFIG_VARS = (
    "NEURON_RT_VISIBLE_CORES",
    "OPENNEURON_DEVICE_MEMORY",
    "NEURON_LAUNCH_BLOCKING",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)


def run_python(code: str, env: dict[str, str | None] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter of this venv with a clean neuron configuration.
    env adds variables; a None value removes one the test process has (e.g. the adaptive-eager
    switch that `make test-fusion` sets for the whole suite)."""
    full_env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARS}
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, cwd=REPO, check=False, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def run_py() -> Callable[..., subprocess.CompletedProcess]:
    """run_py(code, env=None) -> CompletedProcess; see run_python."""
    return run_python


@pytest.fixture
def device() -> torch.device:
    """The first neuron device."""
    return torch.device("neuron:0")


@pytest.fixture(autouse=True)
def _synchronize_neuron():
    yield
    neuron = getattr(torch, "neuron", None)
    if neuron is not None and neuron.is_initialized():
        for i in range(neuron.device_count()):
            neuron.synchronize(i)


def pytest_configure(config):
    config.pluginmanager.register(_DatabaseSummary(), "openneuron_database_summary")
    config.addinivalue_line(
        "markers", "subprocess: runs code in a fresh interpreter (the run_py fixture); added "
        "automatically. `make test-isa` deselects these: they test logging, configuration and "
        "process lifetime, which no SIMD or ATen code path changes.")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "run_py" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.subprocess)


def tally(counts: dict, report, skipped_key: str | None = None) -> None:
    """Adds one test report to counts ({"passed", "xfailed", "failed", ...}): a strict xfail that
    passed counts as failed; a plain skip counts under skipped_key when given."""
    if hasattr(report, "wasxfail"):
        counts["xfailed" if report.skipped else "failed"] += 1
    elif report.skipped and skipped_key:
        counts[skipped_key] += 1
    elif report.outcome in counts:
        counts[report.outcome] += 1


def summarize(request, title: str, row: str, skipped_key: str | None = None) -> None:
    """Counts this test in the pass-count summary of a database test (OpInfo, ModuleInfo,
    OptimizerInfo): `title` names the table, `row` the line (a dtype, ...). Through the test's
    report (user_properties), so the counts reach pytest-xdist's controller."""
    request.node.user_properties.append(("db_summary", (title, row, skipped_key)))


class _DatabaseSummary:
    """The database tests' pass counts, printed in pytest's terminal summary (one table per
    title, one line per row, and a total); extra counts a test reports as ("db_extra", {name:
    n}) (ModuleInfo's samples) are summed per row."""

    def __init__(self):
        self.tables: dict[str, dict[str, dict]] = {}
        self.extras: dict[tuple[str, str], dict[str, int]] = {}

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        if "db_summary" not in props:
            return
        title, row, skipped_key = props["db_summary"]
        if report.when == "call" or (report.when == "setup" and report.skipped):
            keys = ["passed", "xfailed", "failed"] + ([skipped_key] if skipped_key else [])
            counts = self.tables.setdefault(title, {}).setdefault(row, dict.fromkeys(keys, 0))
            tally(counts, report, skipped_key)
        if report.when == "call" and "db_extra" in props:
            extra = self.extras.setdefault((title, row), {})
            for k, n in props["db_extra"].items():
                extra[k] = extra.get(k, 0) + n

    def pytest_terminal_summary(self, terminalreporter):
        for title, rows in sorted(self.tables.items()):
            terminalreporter.write_line(title)
            total: dict[str, int] = {}
            for row, c in sorted(rows.items()):
                for k, n in c.items():
                    total[k] = total.get(k, 0) + n
                terminalreporter.write_line(f"  {self._line(row, c, self.extras.get((title, row)))}")
            if len(rows) > 1:
                terminalreporter.write_line(f"  {self._line('total', total, None)}")

    @staticmethod
    def _line(row: str, c: dict, extra: dict | None) -> str:
        ran = c["passed"] + c["xfailed"] + c["failed"]
        pct = 100.0 * c["passed"] / ran if ran else 0.0
        line = (f"{row:<28} {c['passed']}/{ran} pass ({pct:.1f}%), {c['xfailed']} xfail, "
                f"{c['failed']} fail")
        line += "".join(f", {n} {k}" for k, n in c.items()
                        if k not in ("passed", "xfailed", "failed"))
        if extra:
            line += "; " + ", ".join(f"{n} {k}" for k, n in extra.items())
        return line
