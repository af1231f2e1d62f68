"""Tokens/s of a GPT training step on neuron with DDP and FSDP2 on 2 ranks vs 1 rank, one run.

The model is examples/gpt.py (the `make demo` GPT, larger by default here). One step is forward
+ cross-entropy loss + backward (gradients all-reduced by DDP, or reduce-scattered by FSDP2 with
parameters all-gathered per block) + AdamW step. Every rank trains on `--batch-size` sequences
per step, so 2 ranks process twice the tokens of 1 per step (weak scaling, as data parallelism is
used). Cases, each in fresh processes launched with torchrun's variables:

    1 rank     (no process group)
    ddp   x2   DistributedDataParallel, backend "neuron"
    fsdp2 x2   fully_shard per block and on the model, backend "neuron"

Printed: ms/step (the slowest rank's), tokens/s over all ranks, and the speed-up of 2 ranks over
1. The software NeuronCore runs on host cores: one rank already spreads its ops over every core
(intra-op threads), so on this host 2 ranks share the same cores, and the speed-up measures what
the collectives and the second process cost (at best ~1x here; on N hosts' worth of cores the
compute would scale). `make bench-distributed`. Not a test: nothing asserts on timing.

    python benchmarks/distributed_training.py [--steps 10] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _ranks import run_ranks  # benchmarks/_ranks.py

CASES = [("single", 1), ("ddp", 2), ("fsdp2", 2)]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--rank-main", metavar="CASE", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt import GPT, GPTConfig

    case = args.rank_main
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))
    if case != "single":
        dist.init_process_group(dist.get_default_backend_for_device(device))
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=4, n_embd=args.n_embd)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    if case == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif case == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [(torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen)
                .to(device),
                torch.randint(args.vocab, (args.batch_size, args.seq_len), generator=gen)
                .to(device)) for _ in range(4)]

    def steps(n: int) -> float:
        torch.neuron.synchronize()
        if case != "single":
            dist.barrier()
        start = time.perf_counter()
        loss = None
        for i in range(n):
            x, y = batches[i % len(batches)]
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - start

    steps(args.warmup)
    seconds = steps(args.steps)
    if case != "single":
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, dist.ReduceOp.MAX)  # the slowest rank's time is the step's
        seconds = t.item()
        dist.destroy_process_group()
    if rank == 0:
        params = sum(p.numel() for p in GPT(cfg).parameters())
        print("RESULT " + json.dumps({"seconds": seconds, "params": params}), flush=True)


def run(case: str, world: int, argv: list[str]) -> dict:
    return run_ranks([__file__, *argv, "--rank-main", case], world, case)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.rank_main:
        rank_main(args)
        return
    tokens = args.batch_size * args.seq_len
    results = {}
    for case, world in CASES:
        results[case] = run(case, world, argv)
    print(f"GPT {results['single']['params']:,} params ({args.n_layer} layers, {args.n_embd} "
          f"embd, vocab {args.vocab}) | {args.batch_size} x {args.seq_len} tokens per rank per "
          f"step | AdamW | {args.warmup} warm-up + {args.steps} timed steps | "
          f"{os.cpu_count()} host cores")
    print(f"{'case':<12}{'ranks':>6}{'ms/step':>10}{'tokens/s':>11}{'vs 1 rank':>11}")
    base = tokens * args.steps / results["single"]["seconds"]
    for case, world in CASES:
        sec = results[case]["seconds"]
        tps = tokens * world * args.steps / sec
        print(f"{case:<12}{world:>6}{1e3 * sec / args.steps:>10.1f}{tps:>11,.0f}"
              f"{tps / base:>10.2f}x")
    print("2 ranks on this host share its cores with each other (one rank already uses them "
          "all): the speed-up shows what data parallelism costs here, not what it gains.")


if __name__ == "__main__":
    main()
