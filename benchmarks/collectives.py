"""Collectives: backend "neuron" (neuron tensors, shared memory) vs Gloo (CPU tensors) in one run.

For 2 and 4 ranks on this host and message sizes 4 KiB .. 256 MiB: latency and bus bandwidth
(NCCL's definition: all_reduce moves 2(n-1)/n of the message per rank, the others (n-1)/n) of
all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single, float32.
Prints one table per world size with the neuron / Gloo ratio. `make bench-collectives`.

    python benchmarks/collectives.py [--worlds 2 4] [--max-mib 256]
"""
import argparse
import json
import sys
import time

from _ranks import run_ranks  # benchmarks/_ranks.py

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]


def rank_main(backend: str, sizes: list[int]) -> None:
    import torch
    import torch.distributed as dist

    import openneuron  # noqa: F401

    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron" if backend == "neuron" else "cpu")
    sync = torch.neuron.synchronize if dev.type == "neuron" else (lambda: None)
    results = {}
    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)  # float32 elements, divisible by world
        x = torch.ones(n, device=dev)
        out_ag = torch.empty(n * world, device=dev)
        out_rs = torch.empty(n // world, device=dev)
        out_a2a = torch.empty(n, device=dev)
        calls = {
            "all_reduce": lambda x=x: dist.all_reduce(x),
            "all_gather_into_tensor": lambda x=x, o=out_ag: dist.all_gather_into_tensor(o, x),
            "reduce_scatter_tensor": lambda x=x, o=out_rs: dist.reduce_scatter_tensor(o, x),
            "all_to_all_single": lambda x=x, o=out_a2a: dist.all_to_all_single(o, x),
        }
        for op, call in calls.items():
            iters = max(3, min(200, int(2e8 // max(nbytes, 1))))
            call()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            dt = (time.perf_counter() - t0) / iters
            # the slowest rank's time is the collective's
            t = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(t, dist.ReduceOp.MAX)
            factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
            size = n * 4 * (world if op == "all_gather_into_tensor" else 1)
            results[f"{op}/{nbytes}"] = {"us": t.item() * 1e6,
                                         "busbw": size * factor / t.item() / 1e9}
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def run(backend: str, world: int, sizes: list[int]) -> dict:
    return run_ranks([__file__, "--rank-main", backend, ",".join(map(str, sizes))], world,
                     backend)


def fmt_size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], [int(s) for s in sys.argv[3].split(",")])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-mib", type=int, default=256)
    args = ap.parse_args()
    sizes = [s for s in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20)
             if s <= args.max_mib << 20]
    for world in args.worlds:
        neuron, gloo = run("neuron", world, sizes), run("gloo", world, sizes)
        print(f"\n{world} ranks (float32; latency us, bus bandwidth GB/s; ratio = neuron speed-up)")
        print(f"{'op':<24}{'size':>9}{'neuron us':>12}{'gloo us':>12}{'neuron GB/s':>13}"
              f"{'gloo GB/s':>11}{'speed-up':>10}")
        for op in OPS:
            for b in sizes:
                a, g = neuron[f"{op}/{b}"], gloo[f"{op}/{b}"]
                print(f"{op:<24}{fmt_size(b):>9}{a['us']:>12.1f}{g['us']:>12.1f}"
                      f"{a['busbw']:>13.2f}{g['busbw']:>11.2f}{g['us'] / a['us']:>9.1f}x")


if __name__ == "__main__":
    main()
