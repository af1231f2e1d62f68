"""What a replayed graph saves where host work bounds a step: a small MLP's inference step (16
layers of Linear(64, 64) + GELU on a batch of 4: ~50 tiny launches), timed per step in the same
process and run as CPU eager, neuron eager, neuron with the step captured once in a
torch.neuron.NeuronGraph and replayed, and torch.compile on neuron with mode="default" and
mode="reduce-overhead" (the compiled graph replayed). Ratios are against CPU eager (higher is
faster). Results are checked against CPU before timing. Not a test: nothing asserts on timing
(`make bench-graphs` runs it).
"""
from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time

import torch

LAYERS, WIDTH, BATCH = 16, 64, 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).eval()


def per_step(step, sync, steps: int, repeats: int) -> float:
    """Median seconds per step over `repeats` timed batches of `steps` steps."""
    for _ in range(steps):
        step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps per timed batch")
    ap.add_argument("--repeats", type=int, default=7, help="timed batches (median)")
    args = ap.parse_args()
    import openneuron  # noqa: F401  (registers the device)

    dev = torch.device("neuron")
    model = make_model()
    x = torch.randn(BATCH, WIDTH)
    with torch.no_grad():
        ref = model(x)
        cpu_model = copy.deepcopy(model)
        neuron_model = copy.deepcopy(model).to(dev)
        static_x = x.to(dev)
        # eager, then the same step captured: warm up on a side stream, capture, replay
        s = torch.neuron.Stream()
        s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            neuron_model(static_x)
        torch.neuron.current_stream().wait_stream(s)
        g = torch.neuron.NeuronGraph()
        with torch.neuron.graph(g):
            static_y = neuron_model(static_x)
        g.replay()
        compiled = {mode: torch.compile(copy.deepcopy(model).to(dev), mode=mode)
                    for mode in ("default", "reduce-overhead")}
        outputs = {"neuron eager": neuron_model(static_x), "neuron graph replay": static_y}
        for mode, f in compiled.items():
            for _ in range(3):  # compile, warm-up, capture
                outputs[f"neuron compiled {mode}"] = f(static_x)
        for name, out in outputs.items():
            torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5, msg=name)

        sync = torch.neuron.synchronize
        cases = {
            "cpu eager": (lambda: cpu_model(x), lambda: None),
            "neuron eager": (lambda: neuron_model(static_x), sync),
            "neuron graph replay": (g.replay, sync),
        }
        for mode, f in compiled.items():
            cases[f"neuron compiled {mode}"] = (lambda f=f: f(static_x), sync)
        results = {name: per_step(step, sy, args.steps, args.repeats)
                   for name, (step, sy) in cases.items()}
    print(f"host: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"MLP {LAYERS} x Linear({WIDTH}, {WIDTH}) + GELU, batch {BATCH}: inference step, "
          f"median of {args.repeats} x {args.steps} steps")
    cpu = results["cpu eager"]
    for name, t in results.items():
        print(f"{name:<34}{t * 1e6:>10.1f} us/step   {cpu / t:>5.2f}x CPU eager")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
