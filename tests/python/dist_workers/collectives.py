# One rank of tests/python/test_distributed_collectives.py: every torch.distributed collective
# on backend "neuron" (chosen by get_default_backend_for_device, as a device-agnostic script
# does), on neuron tensors (argv[1] == "neuron") or CPU tensors ("cpu") in that group, checked
# against the result computed here from every rank's inputs (each rank can make them all).
# Exact where the backend promises it: integer/bool results, MIN/MAX, float SUM reduced in rank
# order (bf16/fp16: in float32, rounded once; their AVG and PREMUL_SUM too) on one host. A group
# spanning hosts (argv[2] == "hosts") reduces per host, then across hosts: float sums,
# products and averages there agree to rounding.
import os
import sys

import torch
import torch.distributed as dist

import openneuron  # noqa: F401

DEV = sys.argv[1] if len(sys.argv) > 1 else "neuron"
SPANS_HOSTS = len(sys.argv) > 2 and sys.argv[2] == "hosts"
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def make(r, n, dtype, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + r)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 5, (n,), generator=g, dtype=dtype)
    return torch.randint(-5, 6, (n,), generator=g, dtype=dtype)


def reduce_ref(xs, op, dtype):
    if dtype == torch.bool:
        s = torch.stack(xs)
        if op in ("sum", "max", "bor"):
            return s.any(0)
        if op in ("product", "min", "band"):
            return s.all(0)
        return (s.to(torch.int64).sum(0) % 2).bool()  # bxor
    if op in ("band", "bor", "bxor"):
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = {"band": torch.bitwise_and, "bor": torch.bitwise_or,
                   "bxor": torch.bitwise_xor}[op](acc, x)
        return acc
    if op in ("min", "max"):
        s = torch.stack(xs)
        return s.amin(0) if op == "min" else s.amax(0)
    wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    acc = xs[0].to(wide)
    for x in xs[1:]:
        acc = acc * x.to(wide) if op == "product" else acc + x.to(wide)
    return acc.to(dtype)


OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR}


def same(got, want, what, exact=True):
    got = got.cpu()
    if exact and SPANS_HOSTS and want.dtype.is_floating_point and any(
            k in what for k in ("sum", "product", "AVG", "PREMUL_SUM")):
        # one more rounding per host sum: a few ulps of the result's dtype
        eps = torch.finfo(want.dtype).eps
        torch.testing.assert_close(got, want, rtol=4 * eps, atol=4 * eps, msg=what)
        return
    if exact:
        assert got.dtype == want.dtype and torch.equal(got, want), (
            f"{what}: got {got[:8]} want {want[:8]}")
    else:
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2, msg=what)


def main():
    backend = dist.get_default_backend_for_device("neuron")
    assert backend == "neuron", backend
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if DEV == "neuron":
        assert torch.neuron.current_device() == int(os.environ["LOCAL_RANK"]), "LOCAL_RANK"
    dev = torch.device(DEV)
    checked = 0

    # all_reduce: every op x dtype; sizes across the staging slots (chunked transfers)
    for dtype in FLOATS + INTS + [torch.bool]:
        for op, red in OPS.items():
            if op.startswith("b") and dtype.is_floating_point:
                continue
            for n in (1, 1000) + ((1_500_000,) if dtype in (torch.float32, torch.bfloat16)
                                  and op == "sum" else ()):
                xs = [make(r, n, dtype, seed=n) for r in range(world)]
                t = xs[rank].to(dev, copy=True)
                dist.all_reduce(t, red)
                same(t, reduce_ref(xs, op, dtype), f"all_reduce {op} {dtype} n={n}")
                checked += 1
    # AVG and PREMUL_SUM
    for dtype in (torch.float32, torch.bfloat16):
        xs = [make(r, 777, dtype, seed=3) for r in range(world)]
        t = xs[rank].to(dev, copy=True)
        dist.all_reduce(t, dist.ReduceOp.AVG)
        # bf16: summed and divided in float32, rounded once
        same(t, (sum(x.float() for x in xs) / world).to(dtype), f"all_reduce AVG {dtype}")
        t = xs[rank].to(dev, copy=True)
        dist.all_reduce(t, dist._make_nccl_premul_sum(0.5))
        same(t, (sum(x.float() * 0.5 for x in xs)).to(dtype), f"PREMUL_SUM {dtype}")
        checked += 2
    xi = [make(r, 50, torch.int64, seed=4) for r in range(world)]
    t = xi[rank].to(dev, copy=True)
    dist.all_reduce(t, dist.ReduceOp.AVG)
    same(t, torch.div(sum(xi), world, rounding_mode="trunc"), "all_reduce AVG int64")
    # complex
    xc = [torch.complex(make(r, 64, torch.float32), make(r, 64, torch.float32, 9))
          for r in range(world)]
    t = xc[rank].to(dev, copy=True)
    dist.all_reduce(t)
    same(t, xc[0] + sum(xc[1:]) if world > 1 else xc[0], "all_reduce complex64", exact=False)

    # broadcast from every root
    for root in range(world):
        for dtype in (torch.float32, torch.int64, torch.bool):
            t = make(rank, 333, dtype, seed=5).to(dev, copy=True)
            dist.broadcast(t, src=root)
            same(t, make(root, 333, dtype, seed=5), f"broadcast root={root} {dtype}")
            checked += 1

    # all_gather: list and into one tensor; 2-D
    x = make(rank, 6 * 5, torch.float32, seed=6).view(6, 5).to(dev, copy=True)
    outs = [torch.empty(6, 5, device=dev) for _ in range(world)]
    dist.all_gather(outs, x)
    for r in range(world):
        same(outs[r], make(r, 30, torch.float32, seed=6).view(6, 5), f"all_gather [{r}]")
    big = torch.empty(world * 6, 5, device=dev)
    dist.all_gather_into_tensor(big, x)
    same(big, torch.cat([make(r, 30, torch.float32, seed=6).view(6, 5) for r in range(world)]),
         "all_gather_into_tensor")
    checked += 2

    # reduce_scatter: list and tensor, SUM / MAX / AVG
    for op in ("sum", "max"):
        full = [make(r, world * 100, torch.float32, seed=7) for r in range(world)]
        out = torch.empty(100, device=dev)
        dist.reduce_scatter_tensor(out, full[rank].to(dev, copy=True), OPS[op])
        same(out, reduce_ref(full, op, torch.float32)[rank * 100:(rank + 1) * 100],
             f"reduce_scatter_tensor {op}")
        out2 = torch.empty(100, device=dev)
        dist.reduce_scatter(out2, list(full[rank].to(dev, copy=True).chunk(world)), OPS[op])
        same(out2, reduce_ref(full, op, torch.float32)[rank * 100:(rank + 1) * 100],
             f"reduce_scatter list {op}")
        checked += 2
    full = [make(r, world * 64, torch.bfloat16, seed=8) for r in range(world)]
    out = torch.empty(64, dtype=torch.bfloat16, device=dev)
    dist.reduce_scatter_tensor(out, full[rank].to(dev, copy=True), dist.ReduceOp.AVG)
    same(out, (sum(f.float() for f in full) / world)[rank * 64:(rank + 1) * 64].bfloat16(),
         "reduce_scatter_tensor AVG bf16")

    # all_to_all_single with uneven splits; all_to_all with lists
    # rank r sends (r + p + 1) rows of width 3 to peer p
    send_splits = [rank + p + 1 for p in range(world)]
    recv_splits = [p + rank + 1 for p in range(world)]
    inp = torch.cat([torch.full((s, 3), float(100 * rank + p)) for p, s in enumerate(send_splits)])
    out = torch.empty(sum(recv_splits), 3, device=dev)
    dist.all_to_all_single(out, inp.to(dev, copy=True), recv_splits, send_splits)
    same(out, torch.cat([torch.full((s, 3), float(100 * p + rank))
                         for p, s in enumerate(recv_splits)]), "all_to_all_single uneven")
    ins = [torch.full((p + 1,), rank * 10 + p, dtype=torch.int32, device=dev) for p in range(world)]
    outs = [torch.empty(rank + 1, dtype=torch.int32, device=dev) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for p in range(world):
        same(outs[p], torch.full((rank + 1,), p * 10 + rank, dtype=torch.int32), f"all_to_all {p}")
    checked += 2

    # gather / scatter / reduce to a root
    root = world - 1
    x = make(rank, 40, torch.float32, seed=9).to(dev, copy=True)
    gl = [torch.empty(40, device=dev) for _ in range(world)] if rank == root else None
    dist.gather(x, gl, dst=root)
    if rank == root:
        for r in range(world):
            same(gl[r], make(r, 40, torch.float32, seed=9), f"gather [{r}]")
    sl = [make(r, 40, torch.float32, seed=10).to(dev, copy=True) for r in range(world)] if rank == root \
        else None
    so = torch.empty(40, device=dev)
    dist.scatter(so, sl, src=root)
    same(so, make(rank, 40, torch.float32, seed=10), "scatter")
    xs = [make(r, 40, torch.int32, seed=11) for r in range(world)]
    t = xs[rank].to(dev, copy=True)
    dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
    if rank == root:
        same(t, reduce_ref(xs, "sum", torch.int32), "reduce")
    else:
        same(t, xs[rank], "reduce leaves non-root inputs")
    checked += 3

    # point to point: tags out of order, isend/irecv, batch_isend_irecv around a ring
    if world > 1:
        peer = rank ^ 1 if (rank ^ 1) < world else None
        if peer is not None:
            a = torch.full((5,), float(rank), device=dev)
            b = torch.full((2000,), float(rank + 10), device=dev)
            if rank % 2 == 0:
                dist.send(a, peer, tag=1)
                dist.send(b, peer, tag=2)
            else:
                rb = torch.empty(2000, device=dev)
                ra = torch.empty(5, device=dev)
                w2 = dist.irecv(rb, peer, tag=2)
                w1 = dist.irecv(ra, peer, tag=1)
                w1.wait()
                w2.wait()
                same(ra, torch.full((5,), float(peer)), "recv tag 1")
                same(rb, torch.full((2000,), float(peer + 10)), "recv tag 2 (posted first)")
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        s = torch.full((1000,), float(rank), device=dev)
        r = torch.empty(1000, device=dev)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt),
                                        dist.P2POp(dist.irecv, r, prv)])
        for w in works:
            w.wait()
        same(r, torch.full((1000,), float(prv)), "batch_isend_irecv ring")
        checked += 2

    # async work, futures, barrier, monitored barrier, object collectives
    t = torch.ones(10, device=dev) * (rank + 1)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    w.wait()
    same(t, torch.full((10,), float(world * (world + 1) // 2)), "async all_reduce")
    fut.wait()
    assert w.is_completed()
    dist.barrier()
    dist.monitored_barrier()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(world)], objs
    bl = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(bl, src=0)
    assert bl == ["from 0", 0], bl
    checked += 3

    # a subgroup: ranks 0 and 1 only
    if world >= 3:
        sub = dist.new_group([0, 1])
        if rank in (0, 1):
            t = torch.full((4,), float(rank + 1), device=dev)
            dist.all_reduce(t, group=sub)
            same(t, torch.full((4,), 3.0), "subgroup all_reduce")
        checked += 1

    # timeouts: torch's private setter and torch.distributed.set_timeout (which torch 2.13 lacks)
    import datetime

    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=90))
    dist.set_timeout(datetime.timedelta(seconds=60))
    t = torch.ones(3, device=dev)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(world)), "all_reduce after set_timeout")

    if DEV == "neuron":
        torch.neuron.synchronize()
    dist.destroy_process_group()
    print(f"rank {rank}: {checked} checks passed")


if __name__ == "__main__":
    main()
