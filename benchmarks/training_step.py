"""Tokens/s of a GPT training step on neuron against CPU eager, fp32 and bf16 autocast, one run.

The model is examples/gpt.py (the `make demo` GPT). One step is forward + cross-entropy loss +
backward + AdamW step + zero_grad(set_to_none=True), as in examples/03_train_gpt.py. Four cases,
each from the same initial weights and the same batches:

    cpu    fp32            cpu    bf16 autocast
    neuron fp32            neuron bf16 autocast

Warm-up steps are excluded; each timed repeat runs `--steps` steps and synchronizes the device
before reading the clock (the loss is read back only at the end of a repeat, so Python runs
ahead of the device as on a GPU). Repeats alternate the cases, so background load on the host
is shared fairly; the median repeat is reported. Ratios are neuron / cpu of tokens/s (higher is
better for neuron). Not a test: nothing asserts on timing.

Each repeat of each case runs in a fresh child process (round robin over the cases): a user's
CPU run has no neuron executor, and one in the process can change the CPU baseline. libgomp
shortens its idle workers' spin-wait to 100 iterations when it manages more threads than there
are CPUs, which the neuron executor's OpenMP team (next to the Python thread's) makes it do; CPU
eager then pays a futex wake-up per parallel region too (on a 2-core host CPU eager measured
~105 ms/step in a process with a neuron executor vs 61-70 ms alone). `--same-process` runs all
cases in this process instead, to see that effect.

The setting of TORCH_NEURONX_ENABLE_CONCATENATION (adaptive eager) is printed; run the script
once with it unset and once with it set to 1 to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig

CASES = [("cpu", "fp32"), ("cpu", "bf16"), ("neuron", "fp32"), ("neuron", "bf16")]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the first repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per case (median)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--device", default="neuron", help="device compared against cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads (torch.set_num_threads) in every case; 0: default. "
                        "1 compares the devices without OpenMP spin-waits, which dominate "
                        "CPU eager on a busy host")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--same-process", action="store_true",
                   help="run every case in this process (default: a fresh process per repeat)")
    p.add_argument("--child", metavar="DEVICE:PRECISION", help=argparse.SUPPRESS)
    return p.parse_args(argv)


class Trainer:
    """One (device, precision) case: its model, optimizer and batches, all made up front."""

    def __init__(self, device: str, precision: str, cfg: GPTConfig, init_state: dict,
                 batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self.device = torch.device(device)
        self.precision = precision
        self.model = GPT(cfg)
        self.model.load_state_dict(init_state)
        self.model.to(self.device).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.batches = [(x.to(self.device), y.to(self.device)) for x, y in batches]
        self.next = 0
        self.sync = torch.get_device_module(self.device).synchronize
        self.last_loss = float("nan")

    def autocast(self):
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def step(self) -> torch.Tensor:
        x, y = self.batches[self.next % len(self.batches)]
        self.next += 1
        with self.autocast():
            _, loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def timed(self, steps: int) -> float:
        """Seconds for `steps` steps, from a synchronized device to a synchronized device."""
        self.sync()
        start = time.perf_counter()
        loss = None
        for _ in range(steps):
            loss = self.step()
        self.sync()
        seconds = time.perf_counter() - start
        self.last_loss = loss.item()
        return seconds


def run_child(argv, case: tuple[str, str]) -> tuple[float, float]:
    """Runs warm-up + one timed repeat of `case` in a fresh interpreter: (seconds, loss)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = [sys.executable, __file__, *argv, "--child", f"{case[0]}:{case[1]}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("CHILD ")][-1]
    seconds, loss = line.split()[1:3]
    return float(seconds), float(loss)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    torch.manual_seed(0)
    init_state = GPT(cfg).state_dict()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen),
                torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen))
               for _ in range(4)]
    tokens_per_step = args.batch_size * args.seq_len
    if args.child:
        device, precision = args.child.rsplit(":", 1)
        t = Trainer(device, precision, cfg, init_state, batches)
        t.timed(args.warmup)
        print(f"CHILD {t.timed(args.steps)!r} {t.last_loss!r}")
        return
    concat = os.environ.get("TORCH_NEURONX_ENABLE_CONCATENATION", "")
    params = sum(v.numel() for v in init_state.values())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__} | {platform.machine()} | {os.cpu_count()} cores, load "
          f"{load:.1f} | "
          f"intra-op threads {torch.get_num_threads()} | "
          f"TORCH_NEURONX_ENABLE_CONCATENATION={concat or '(unset)'}")
    print(f"GPT {params:,} params ({args.n_layer} layers, {args.n_embd} embd, {args.n_head} "
          f"heads) | batch {args.batch_size} x seq {args.seq_len} = {tokens_per_step} tokens/step"
          f" | AdamW | {args.warmup} warm-up steps, {args.repeats} repeats x {args.steps} steps,"
          f" median | {'one process' if args.same_process else 'a fresh process per repeat'}")

    cases = [(args.device if dev == "neuron" else dev, prec) for dev, prec in CASES]
    samples: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    losses: dict[tuple[str, str], float] = {}
    if args.same_process:
        trainers = {c: Trainer(c[0], c[1], cfg, init_state, batches) for c in cases}
        for t in trainers.values():  # warm-up: allocator and meta caches, lazy init, AdamW state
            t.timed(args.warmup)
        for _ in range(args.repeats):
            for c, t in trainers.items():
                samples[c].append(t.timed(args.steps))
        losses = {c: t.last_loss for c, t in trainers.items()}
    else:
        for _ in range(args.repeats):
            for c in cases:
                seconds, loss = run_child(argv, c)
                samples[c].append(seconds)
                losses[c] = loss
    rows = {}
    for c in cases:
        med, best = statistics.median(samples[c]), min(samples[c])
        spread = (max(samples[c]) - best) / med
        rows[c] = {"device": c[0], "precision": c[1], "ms_per_step": 1e3 * med / args.steps,
                   "tokens_per_s": tokens_per_step * args.steps / med,
                   "best_tokens_per_s": tokens_per_step * args.steps / best, "spread": spread,
                   "final_loss": losses[c]}
    header = (f"{'case':<22} {'ms/step':>9} {'tokens/s':>10} {'vs cpu same prec':>17} "
              f"{'best-of ratio':>14} {'spread':>7}")
    print(header)
    print("-" * len(header))
    for c in cases:
        r = rows[c]
        ref = rows[("cpu", c[1])]
        ratio = r["tokens_per_s"] / ref["tokens_per_s"]
        r["ratio_vs_cpu"] = ratio
        r["best_ratio_vs_cpu"] = r["best_tokens_per_s"] / ref["best_tokens_per_s"]
        label = f"{c[0]} {'fp32' if c[1] == 'fp32' else 'bf16 autocast'}"
        print(f"{label:<22} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>10,.0f} "
              f"{ratio:>16.2f}x {r['best_ratio_vs_cpu']:>13.2f}x {r['spread']:>6.0%}")
    dev_bf16 = rows[cases[3]]["tokens_per_s"] / rows[cases[2]]["tokens_per_s"]
    cpu_bf16 = rows[cases[1]]["tokens_per_s"] / rows[cases[0]]["tokens_per_s"]
    print(f"bf16 autocast / fp32: cpu {cpu_bf16:.2f}x, {args.device} {dev_bf16:.2f}x")
    print("ratio = tokens/s of the case / tokens/s of cpu in the same precision (medians; "
          "best-of: fastest repeats); spread = (max - min) / median over the repeats (above "
          "~20% the host is busy and the ratios are noisy).")
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "load": load,
                "same_process": args.same_process,
                "concatenation": concat, "steps": args.steps, "warmup": args.warmup,
                "repeats": args.repeats, "tokens_per_step": tokens_per_step, "params": params,
                "config": vars(args)}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": list(rows.values())}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
