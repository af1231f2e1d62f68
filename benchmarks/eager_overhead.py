"""Eager-mode cost of the neuron device against CPU eager, measured in the same process and run.

Four cases, each printed as a ratio with its goal: per-op host overhead (100-element add, which
has a native kernel, and 100-element relu, which takes the generic asynchronous ATen path),
memory-bound throughput (4M-element add) and compute-bound throughput (1024x1024 matmul).
Not a test: nothing here asserts on timing (`make bench` runs it; tests live in tests/python).
`--device cpu` compares CPU with itself: the ratios then show the host's noise floor.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Case:
    name: str
    unit: str  # unit of `value` below, e.g. "us/op" or "GFLOP/s"
    lower_is_better: bool
    goal: float  # ratio goal: neuron/cpu of the measured value
    ops_per_repeat: int
    make: Callable[[torch.device], Callable[[], object]]  # device -> one op
    work_per_op: float  # elements or FLOPs per op, to turn time into throughput (0: time only)
    scale: float  # divides time- or work-per-second into `unit`


def small_add(device: torch.device):
    a, b = torch.rand(100, device=device), torch.rand(100, device=device)
    return lambda: a + b


def small_relu(device: torch.device):
    a = torch.rand(100, device=device)
    return lambda: torch.relu(a)


def big_add(device: torch.device):
    n = 4 * 1024 * 1024
    a, b = torch.rand(n, device=device), torch.rand(n, device=device)
    return lambda: a + b


def matmul(device: torch.device):
    a, b = torch.rand(1024, 1024, device=device), torch.rand(1024, 1024, device=device)
    return lambda: a @ b


def cases(scale_ops: float) -> list[Case]:
    n = lambda k: max(1, int(k * scale_ops))
    return [
        Case("small op: add, 100 elements", "us/op", True, 1.5, n(20_000), small_add, 0, 1e-6),
        Case("small op: relu, 100 (generic)", "us/op", True, 1.5, n(20_000), small_relu, 0,
             1e-6),
        Case("throughput: add, 4M float32", "Gelem/s", False, 0.95, n(50), big_add,
             4 * 1024 * 1024, 1e9),
        Case("throughput: matmul 1024x1024", "GFLOP/s", False, 0.95, n(20), matmul,
             2 * 1024**3, 1e9),
    ]


def time_loop(op: Callable[[], object], count: int, sync: Callable[[], None]) -> float:
    """Seconds per op for `count` back-to-back ops, including the final synchronize."""
    sync()
    start = time.perf_counter()
    for _ in range(count):
        op()
    sync()
    return (time.perf_counter() - start) / count


def measure(case: Case, devices: list[torch.device], repeats: int):
    """(median seconds per op, spread) per device; spread = (max - min) / median of the repeats.
    Repeats alternate devices so background load on the host is shared fairly between them."""
    ops = [case.make(d) for d in devices]
    syncs = [torch.get_device_module(d).synchronize for d in devices]
    for op, sync in zip(ops, syncs):  # warm-up: allocator caches, lazy init, first dispatch
        time_loop(op, max(1, case.ops_per_repeat // 10), sync)
    samples: list[list[float]] = [[] for _ in devices]
    for _ in range(repeats):
        for i, (op, sync) in enumerate(zip(ops, syncs)):
            samples[i].append(time_loop(op, case.ops_per_repeat, sync))
    medians = [statistics.median(v) for v in samples]
    return medians, [(max(v) - min(v)) / m for v, m in zip(samples, medians)]


def to_value(case: Case, seconds_per_op: float) -> float:
    if case.work_per_op:
        return case.work_per_op / seconds_per_op / case.scale
    return seconds_per_op / case.scale


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="neuron", help="device compared against cpu")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats per case (median)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies ops per repeat")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    dev = torch.device(args.device)
    devices = [torch.device("cpu"), dev]
    print(f"torch {torch.__version__} | {platform.machine()} | intra-op threads "
          f"{torch.get_num_threads()} | {args.repeats} repeats, median | baseline: cpu eager")
    header = (f"{'case':<30} {'cpu':>16} {dev.type:>16} {'ratio':>7} {'goal':>8}  result"
              f"  {'spread':>6}")
    print(header)
    print("-" * len(header))
    results = []
    for case in cases(args.scale):
        (cpu_s, dev_s), spreads = measure(case, devices, args.repeats)
        cpu_v, dev_v = to_value(case, cpu_s), to_value(case, dev_s)
        ratio = dev_v / cpu_v
        ok = ratio <= case.goal if case.lower_is_better else ratio >= case.goal
        goal = f"{'<=' if case.lower_is_better else '>='}{case.goal:.2f}x"
        print(f"{case.name:<30} {cpu_v:>8.2f} {case.unit:<7} {dev_v:>8.2f} {case.unit:<7} "
              f"{ratio:>6.2f}x {goal:>8}  {'PASS' if ok else 'MISS'}  {max(spreads):>6.0%}")
        results.append({"case": case.name, "unit": case.unit, "cpu": cpu_v, "device": dev_v,
                        "ratio": ratio, "goal": goal, "pass": ok, "cpu_s_per_op": cpu_s,
                        "device_s_per_op": dev_s, "spread": spreads,
                        "ops_per_repeat": case.ops_per_repeat})
    print(f"ratio = {dev.type} / cpu of the value shown (time: lower is better; throughput: "
          "higher).\nspread = (max - min) / median over the repeats, the worse of the two devices; "
          "above ~20% the host is busy and the ratios are noisy.")
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                "repeats": args.repeats, "device": str(dev)}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
