"""Native kernels (csrc/kernels) against the path the same op takes without them, in one run.

For each case: time per call on neuron with the native kernels, on neuron with them switched off
(torch.ops.openneuron._set_native_kernels(False): the asynchronous ATen path, i.e. ATen's CPU
kernel in a work item; for SDPA the composite math path), and CPU eager. SDPA also shows the
other overrideable implementation: ATen's CPU flash kernel in one work item. Prints a table with
the ratios native/off and native/cpu (lower is better). Not a test: nothing asserts on timing.

    .venv/bin/python benchmarks/kernels.py [--quick] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import openneuron  # noqa: F401  (registers the device)


def set_native(on: bool) -> None:
    torch.ops.openneuron._set_native_kernels(on)


def sync(device: torch.device) -> None:
    if device.type == "neuron":
        torch.neuron.synchronize()


def time_op(fn: Callable[[], object], device: torch.device, iters: int, repeats: int) -> float:
    """Best-of-repeats mean seconds per call (the host is shared: the minimum is the signal)."""
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


# Each case: name, build(device, dtype) -> zero-arg callable, dtype.
def layer_norm_case(rows: int, n: int, backward: bool):
    def build(device, dtype):
        x = torch.randn(rows, n, device=device, dtype=dtype, requires_grad=backward)
        w = torch.randn(n, device=device, dtype=dtype, requires_grad=backward)
        b = torch.randn(n, device=device, dtype=dtype, requires_grad=backward)
        g = torch.randn(rows, n, device=device, dtype=dtype)
        if not backward:
            return lambda: F.layer_norm(x, (n,), w, b)
        return lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), (x, w, b), g)
    return f"layer_norm {'fwd+bwd' if backward else 'fwd'} [{rows}, {n}]", build


def sdpa_case(b: int, h: int, l: int, e: int, causal: bool, backward: bool, s: int = 0):
    """s: keys when not l (a decode step: l query rows against an s-long KV cache)."""
    def build(device, dtype):
        q, k, v = (torch.randn(b, h, n, e, device=device, dtype=dtype, requires_grad=backward)
                   for n in (l, s or l, s or l))
        g = torch.randn(b, h, l, e, device=device, dtype=dtype)
        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if not backward:
            return f
        return lambda: torch.autograd.grad(f(), (q, k, v), g)
    tag = "causal " if causal else ""
    rows = f"{l}x{s}" if s else f"{l}"
    return f"sdpa {tag}{'fwd+bwd' if backward else 'fwd'} [{b},{h},{rows},{e}]", build


def embedding_backward_case(n: int, vocab: int, dim: int):
    def build(device, dtype):
        g = torch.randn(n, dim, device=device, dtype=dtype)
        idx = torch.randint(0, vocab, (n,), device=device)
        return lambda: torch.ops.aten.embedding_dense_backward(g, idx, vocab, -1, False)
    return f"embedding backward {n} rows -> [{vocab}, {dim}]", build


def adamw_case(sizes: list[int], fused: bool | None):
    def build(device, dtype):
        params = [torch.nn.Parameter(torch.randn(s, device=device, dtype=dtype)) for s in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, fused=fused)
        return opt.step
    total = sum(sizes)
    mode = "fused=True" if fused else "default foreach"
    return f"AdamW {mode} {len(sizes)} tensors {total / 1e6:.1f}M", build


def gpt_param_sizes(d: int, layers: int, vocab: int) -> list[int]:
    per_layer = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    return [vocab * d, 128 * d] + per_layer * layers + [d, d]


def rms_norm_case(rows: int, n: int, backward: bool):
    def build(device, dtype):
        x = torch.randn(rows, n, device=device, dtype=dtype, requires_grad=backward)
        w = torch.randn(n, device=device, dtype=dtype, requires_grad=backward)
        g = torch.randn(rows, n, device=device, dtype=dtype)
        if not backward:
            return lambda: F.rms_norm(x, (n,), w)
        return lambda: torch.autograd.grad(F.rms_norm(x, (n,), w), (x, w), g)
    return f"rms_norm {'fwd+bwd' if backward else 'fwd'} [{rows}, {n}]", build


def cross_entropy_case(rows: int, classes: int):
    def build(device, dtype):
        x = torch.randn(rows, classes, device=device, dtype=dtype, requires_grad=True)
        t = torch.randint(0, classes, (rows,), device=device)
        return lambda: torch.autograd.grad(F.cross_entropy(x, t), (x,))
    return f"cross_entropy fwd+bwd [{rows}, {classes}]", build


def few_rows_case(rows: int, k: int, n: int, conv1d: bool):
    """A decode step's weight product: nn.Linear's [n, k] weight, or GPT-2 Conv1D's [k, n]."""
    def build(device, dtype):
        a = torch.randn(rows, k, device=device, dtype=dtype)
        b = torch.randn(n, device=device, dtype=dtype)
        if conv1d:
            w = torch.randn(k, n, device=device, dtype=dtype)
            return lambda: torch.addmm(b, a, w)
        w = torch.randn(n, k, device=device, dtype=dtype)
        return lambda: F.linear(a, w, b)
    return f"{'addmm (Conv1D)' if conv1d else 'linear'} [{rows}, {k}] -> {n}", build


def cases(quick: bool):
    out = [
        layer_norm_case(8 * 128, 256, backward=False),
        layer_norm_case(8 * 128, 256, backward=True),
        layer_norm_case(64, 128, backward=False),
        sdpa_case(8, 4, 128, 32, causal=True, backward=False),
        sdpa_case(8, 4, 128, 32, causal=True, backward=True),
        sdpa_case(8, 8, 128, 32, causal=False, backward=True),
        sdpa_case(1, 8, 1, 64, causal=False, backward=False, s=1024),
        embedding_backward_case(8 * 128, 1000, 256),
        adamw_case(gpt_param_sizes(128, 4, 1000), fused=True),
        adamw_case(gpt_param_sizes(128, 4, 1000), fused=None),
        rms_norm_case(8 * 128, 256, backward=False),
        rms_norm_case(8 * 128, 256, backward=True),
        cross_entropy_case(512, 256),
        cross_entropy_case(2048, 1000),
        few_rows_case(1, 256, 768, conv1d=True),
        few_rows_case(1, 1024, 256, conv1d=True),
        few_rows_case(1, 256, 1024, conv1d=False),
    ]
    if not quick:
        out += [
            layer_norm_case(8 * 512, 1024, backward=True),
            sdpa_case(4, 8, 512, 64, causal=True, backward=True),
            embedding_backward_case(8 * 512, 50257, 768),
            adamw_case(gpt_param_sizes(512, 8, 8192), fused=True),
            adamw_case(gpt_param_sizes(512, 8, 8192), fused=None),
            few_rows_case(4, 4096, 4096, conv1d=False),
        ]
    return out



Variant = tuple[Callable[[], object], torch.device, Callable[[], None]]  # fn, device, setup


def measure_interleaved(fns: dict[str, Variant], iters: int, repeats: int) -> dict[str, float]:
    """Best-of-repeats seconds per call for each variant, measured round-robin (ABCABC...) so
    that load from other processes on a shared host hits every variant alike."""
    best = {k: float("inf") for k in fns}
    for name, (fn, device, setup) in fns.items():  # warm-up
        setup()
        fn()
        sync(device)
    for _ in range(repeats):
        for name, (fn, device, setup) in fns.items():
            setup()
            sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync(device)
            best[name] = min(best[name], (time.perf_counter() - t0) / iters)
    set_native(True)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="typical GPT shapes only")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--budget", type=float, default=0.02, help="seconds per timed batch")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    neuron, cpu = torch.device("neuron"), torch.device("cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"best of {args.repeats} interleaved batches")
    print(f"{'case':44s} {'native us':>10s} {'off us':>10s} {'cpu us':>10s} "
          f"{'native/off':>10s} {'native/cpu':>10s}")
    rows = []
    for name, build in cases(args.quick):
        if args.filter not in name:
            continue
        torch.manual_seed(0)
        fn_cpu = build(cpu, dtype)
        fn_neuron = build(neuron, dtype)
        t = time_op(fn_cpu, cpu, 1, 1)
        iters = max(1, min(2000, int(args.budget / max(t, 1e-6))))
        variants = {
            "cpu": (fn_cpu, cpu, lambda: None),
            "native": (fn_neuron, neuron, lambda: set_native(True)),
            "off": (fn_neuron, neuron, lambda: set_native(False)),
        }
        if name.startswith("sdpa"):
            variants["native"] = (fn_neuron, neuron, lambda: (
                set_native(True), torch.ops.openneuron._sdpa_kernel("hand")))
            variants["flash"] = (fn_neuron, neuron, lambda: (
                set_native(True), torch.ops.openneuron._sdpa_kernel("aten_flash")))
        best = measure_interleaved(variants, iters, args.repeats)
        if name.startswith("sdpa"):
            torch.ops.openneuron._sdpa_kernel("auto")
        row = {"case": name, **{f"{k}_us": v * 1e6 for k, v in best.items()},
               "native_over_off": best["native"] / best["off"],
               "native_over_cpu": best["native"] / best["cpu"]}
        rows.append(row)
        extra = (f"  (ATen flash in one work item: {row['flash_us']:.1f} us)"
                 if "flash_us" in row else "")
        print(f"{name:44s} {row['native_us']:10.1f} {row['off_us']:10.1f} {row['cpu_us']:10.1f} "
              f"{row['native_over_off']:10.2f} {row['native_over_cpu']:10.2f}{extra}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
