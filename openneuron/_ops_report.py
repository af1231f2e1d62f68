# openneuron.ops_report(): which ATen ops ran on which path in this process (native kernel,
# asynchronous ATen path, "sync" for ops that need device values on the host by nature such as
# nonzero, "fallback" for ops with no asynchronous path) and what the synchronous ones cost. The
# counters live in C++ (csrc/aten/ops/ops_report.cpp); this file only formats them.
from __future__ import annotations

from typing import NamedTuple

_PATH_ORDER = {"fallback": 0, "sync": 1, "async": 2, "native": 3}


class OpRow(NamedTuple):
    op: str
    path: str  # "native", "async", "sync" or "fallback"
    calls: int
    seconds: float  # time spent in the synchronous paths (0 for native and async)


def ops_report(print_table: bool = True, reset: bool = False) -> list[OpRow]:
    """Rows (op, path, calls, seconds) for every op that ran on neuron so far.

    Fallback rows come first, costliest first, then sync, async and native rows. With print_table
    the rows are also printed as a table; with reset the counters are zeroed afterwards.
    """
    from openneuron import _C

    rows = [OpRow(*r) for r in _C._ops_report()]
    rows.sort(key=lambda r: (_PATH_ORDER.get(r.path, 3), -r.seconds, -r.calls, r.op))
    if print_table:
        print(format_table(rows))
    if reset:
        _C._ops_report_reset()
    return rows


def format_table(rows: list[OpRow]) -> str:
    """The rows as a fixed-width table with a totals line."""
    if not rows:
        return "openneuron ops report: no ops ran on neuron yet."
    width = max(len("op"), *(len(r.op) for r in rows))
    lines = [f"{'op':<{width}}  {'path':<8}  {'calls':>9}  {'waited':>13}"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        cost = f"{r.seconds * 1e3:10.2f} ms" if r.path in ("fallback", "sync") else ""
        lines.append(f"{r.op:<{width}}  {r.path:<8}  {r.calls:>9}  {cost:>13}")
    fallback = [r for r in rows if r.path == "fallback"]
    sync = [r for r in rows if r.path == "sync"]
    total = sum(r.calls for r in rows)
    lines.append("-" * len(lines[0]))
    lines.append(
        f"{total} calls in {len(rows)} op/path rows; {sum(r.calls for r in fallback)} fallback "
        f"calls took {sum(r.seconds for r in fallback) * 1e3:.2f} ms, "
        f"{sum(r.calls for r in sync)} sync calls {sum(r.seconds for r in sync) * 1e3:.2f} ms"
    )
    return "\n".join(lines)


def ops_report_reset() -> None:
    """Zeroes every counter."""
    from openneuron import _C

    _C._ops_report_reset()
