"""torch.compile on neuron (TorchInductor) vs neuron eager, CPU eager and Inductor on CPU, one run.

A GPT training step (examples/gpt.py: forward + cross-entropy + backward + AdamW), each case in a
fresh process, all from the same weights and batches:

    cpu eager | cpu inductor (torch.compile, cold cache) | neuron eager |
    neuron compiled (cold cache) | neuron compiled (warm: a second process, same cache) |
    neuron async (OPENNEURON_COMPILE_ASYNC=1, cold cache of its own: eager steps while Inductor
    compiles in a background process, then the compiled graph)

Printed per case: the first step's time (compilation included: the cold start a user waits
for), steady-state ms/step and tokens/s (median of the timed steps after warm-up), and ratios
against Inductor on CPU. Then, with --mfu, a 15M-parameter GPT's achieved GFLOP/s (6 x params x
tokens + attention) in fp32 and bf16 autocast on neuron (compiled), as a fraction of this host's
matmul rate in the same precision (a 2048 x 2048 matmul, the faster of CPU's and neuron's,
measured in the same run).
`make bench-compile`. Not a test: nothing asserts on timing.

    python benchmarks/compile.py [--steps 20] [--mfu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _ranks import result  # benchmarks/_ranks.py

CASES = [("cpu", "eager"), ("cpu", "inductor"), ("neuron", "eager"), ("neuron", "compiled"),
         ("neuron", "compiled-warm"), ("neuron", "async")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up steps)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mfu", action="store_true", help="also the 15M-parameter GPT's GFLOP/s")
    p.add_argument("--child", metavar="DEVICE:MODE", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt import GPT, GPTConfig

    device, mode = args.child.split(":")
    dev = torch.device(device)
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=max(1, args.n_embd // 64), n_embd=args.n_embd)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fn = model if mode == "eager" else torch.compile(model)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen).to(dev),
             torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen).to(dev))
            for _ in range(4)]
    sync = torch.neuron.synchronize if dev.type == "neuron" else (lambda: None)
    bf16 = args.precision == "bf16"

    def step(i):
        x, y = data[i % len(data)]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            _, loss = fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    start = time.perf_counter()
    step(0).item()
    first = time.perf_counter() - start
    switched, eager_steps = None, 0
    if mode == "async":  # eager steps until both graphs are compiled
        from openneuron._inductor import async_compile

        while True:
            s = async_compile.stats()
            if s["finished"] + s["failed"] >= s["started"]:
                break
            eager_steps += 1
            step(eager_steps).item()
        switched = time.perf_counter() - start
    for i in range(1, 4):
        step(i)
    sync()
    times = []
    for i in range(args.steps):
        t = time.perf_counter()
        step(i).item()
        times.append(time.perf_counter() - t)
    params = sum(p.numel() for p in model.parameters())
    print("RESULT " + json.dumps({"first": first, "step": statistics.median(times),
                                  "params": params, "switched": switched,
                                  "eager_steps": eager_steps}), flush=True)


def run(argv, case, env) -> dict:
    cmd = [sys.executable, __file__, *argv, "--child", f"{case[0]}:{case[1].split('-')[0]}"]
    env = {k: v for k, v in env.items() if k != "OPENNEURON_COMPILE_ASYNC"}
    if case[1] == "async":
        env["OPENNEURON_COMPILE_ASYNC"] = "1"
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return result(out)


def matmul_gflops(dtype_name: str, device: str = "cpu") -> float:
    import torch

    if device.startswith("neuron"):
        import openneuron  # noqa: F401  (registers the device)
    sync = torch.neuron.synchronize if device.startswith("neuron") else (lambda: None)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(2048, 2048, dtype=dtype, device=device)
    b = torch.randn(2048, 2048, dtype=dtype, device=device)
    t = time.perf_counter()
    a @ b
    sync()
    # Five products, fewer where one takes seconds (ATen's scalar bf16 loop on a CPU without
    # AVX512BW/VL/DQ: ~1 GFLOP/s).
    n = max(1, min(5, int(2.0 / max(time.perf_counter() - t, 1e-9))))
    t = time.perf_counter()
    for _ in range(n):
        a @ b
    sync()
    return 2 * 2048**3 * n / (time.perf_counter() - t) / 1e9


def table(argv, args) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as neuron_cache, \
            tempfile.TemporaryDirectory() as cpu_cache, \
            tempfile.TemporaryDirectory() as async_cache:
        for case in CASES:
            env = dict(os.environ)
            env["TORCHINDUCTOR_CACHE_DIR"] = (async_cache if case[1] == "async" else
                                              neuron_cache if case[0] == "neuron" else cpu_cache)
            results[case] = run(argv, case, env)
    tokens = args.batch_size * args.seq_len
    ind = results[("cpu", "inductor")]
    print(f"GPT {ind['params']:,} params ({args.n_layer} layers, {args.n_embd} wide, vocab "
          f"{args.vocab}) | batch {args.batch_size} x {args.seq_len} | {args.precision} | "
          f"AdamW | {args.steps} timed steps, median | {os.cpu_count()} cores")
    print(f"{'case':<26}{'first step s':>13}{'ms/step':>10}{'tokens/s':>11}"
          f"{'vs cpu inductor':>17}{'first vs inductor cold':>24}")
    for case in CASES:
        r = results[case]
        tps = tokens / r["step"]
        print(f"{case[0] + ' ' + case[1]:<26}{r['first']:>13.2f}{1e3 * r['step']:>10.1f}"
              f"{tps:>11,.0f}{tps * ind['step'] / tokens:>16.2f}x"
              f"{r['first'] / ind['first']:>23.2f}x")
    a, c = results[("neuron", "async")], results[("neuron", "compiled")]
    print(f"neuron async: first step {a['first']:.2f} s (cold compile: {c['first']:.2f} s), "
          f"{a['eager_steps']} steps eagerly while Inductor compiled, compiled from "
          f"{a['switched']:.1f} s on")
    for n in (10, 100, 1000):
        sync_s = c["first"] + (n - 1) * c["step"]
        async_s = (a["first"] + (n - 1) * (a["switched"] - a["first"]) / max(a["eager_steps"], 1)
                   if n <= a["eager_steps"] + 1 else
                   a["switched"] + (n - 1 - a["eager_steps"]) * a["step"])
        print(f"  {n} steps from a cold cache: {async_s:.1f} s async vs {sync_s:.1f} s waiting "
              f"for the compile")
    return results


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    table([a for a in argv if a != "--mfu"], args)
    if not args.mfu:
        return
    print("\n15M-parameter GPT (8 layers, 384 wide, vocab 4096, 8 x 256 tokens), neuron compiled:")
    for precision in ("fp32", "bf16"):
        big = ["--n-layer", "8", "--n-embd", "384", "--vocab", "4096", "--seq-len", "256",
               "--batch-size", "8", "--steps", "5", "--precision", precision]
        r = run(big, ("neuron", "compiled"), dict(os.environ))
        tokens, seq, n_layer, d = 8 * 256, 256, 8, 384
        flops = 6 * r["params"] * tokens + 12 * n_layer * d * seq * tokens  # + attention
        achieved = flops / r["step"] / 1e9
        # This host's peak in the precision: the faster of CPU's and neuron's 2048^2 matmul
        # (neuron's bf16 products run in float32 where CPU's bf16 kernel is a scalar loop).
        cpu_peak, neuron_peak = matmul_gflops(precision), matmul_gflops(precision, "neuron")
        peak = max(cpu_peak, neuron_peak)
        print(f"  {precision}: {r['params'] / 1e6:.1f} M params, {achieved:.1f} GFLOP/s of a "
              f"2048^2 matmul's {peak:.1f} GFLOP/s (CPU {cpu_peak:.1f}, neuron "
              f"{neuron_peak:.1f}): {100 * achieved / peak:.0f}%")


if __name__ == "__main__":
    main()
