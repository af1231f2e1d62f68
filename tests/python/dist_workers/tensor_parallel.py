# One rank of tests/python/test_distributed_tensor_parallel.py. argv[1]:
#   dtensor: distribute_tensor / redistribute / full_tensor / DTensor ops against plain tensors,
#       random DTensors (the RNG tracker on the neuron generator);
#   tp: a Llama-style block (attention + SwiGLU MLP) under parallelize_module (colwise/rowwise),
#       forward and backward against the same block in one process;
#   tp_dt: the same with q/k/v as DTensors through attention (SDPA on DTensors);
#   sp: the same with sequence parallelism (SequenceParallel norms, sharded sequence);
#   fsdp_tp: FSDP2 over the data dimension and TP over the model dimension of a 2-D mesh.
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import openneuron  # noqa: F401

VARIANT = sys.argv[1]
DIM, HEADS, SEQ = 32, 4, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.RMSNorm(DIM)
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.mlp_norm = nn.RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w3 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    @staticmethod
    def heads(t):  # [b, s, -1] -> [b, heads, s, hd]; under TP each rank holds heads / tp
        return t.view(t.shape[0], t.shape[1], -1, DIM // HEADS).transpose(1, 2)

    def forward(self, x):
        h = self.attn_norm(x)
        q, k, v = (self.heads(w(h)) for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        x = x + self.wo(a.reshape(a.shape[0], a.shape[1], -1))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


TP_PLAN = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
           "wo": RowwiseParallel(), "w1": ColwiseParallel(), "w3": ColwiseParallel(),
           "w2": RowwiseParallel()}
# q/k/v stay DTensors (sharded over heads) through attention, as torchtitan's plan: SDPA then
# runs on DTensors (openneuron/_dtensor.py's sharding rules for neuron's SDPA op).
DT_PLAN = dict(TP_PLAN, wq=ColwiseParallel(use_local_output=False),
               wk=ColwiseParallel(use_local_output=False),
               wv=ColwiseParallel(use_local_output=False))
SP_PLAN = {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
           "wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
           "wo": RowwiseParallel(output_layouts=Shard(1)),
           "w1": ColwiseParallel(), "w3": ColwiseParallel(),
           "w2": RowwiseParallel(output_layouts=Shard(1))}


def check_grads(model, ref, tol):
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(g.cpu(), r.grad, **tol, msg=n)


def main():
    dist.init_process_group(dist.get_default_backend_for_device("neuron"))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    tol = {"rtol": 1e-4, "atol": 1e-5}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, SEQ, DIM, generator=g)

    if VARIANT == "dtensor":
        mesh = init_device_mesh("neuron", (world,))
        a = torch.randn(world * 3, 5, generator=g)
        d = distribute_tensor(a.to(device), mesh, [Shard(0)])
        assert d.to_local().shape == (3, 5)
        torch.testing.assert_close(d.full_tensor().cpu(), a)
        r = d.redistribute(mesh, [Replicate()])
        torch.testing.assert_close(r.to_local().cpu(), a)
        s1 = d.redistribute(mesh, [Shard(1)]) if 5 % world == 0 else d
        torch.testing.assert_close(s1.full_tensor().cpu(), a)
        w = distribute_tensor(torch.randn(5, 4, generator=g).to(device), mesh, [Replicate()])
        out = (d @ w).relu().sum(0)  # DTensor ops: partial sums reduced across ranks
        torch.testing.assert_close(out.full_tensor().cpu(), (a @ w.full_tensor().cpu()).relu()
                                   .sum(0), rtol=1e-5, atol=1e-5)
        # random ops through DTensor's RNG tracker (the neuron generator's seed + offset): the
        # shards of a sharded tensor differ, a replicated one is the same on every rank, and
        # the same seed replays both
        import torch.distributed.tensor as dt

        def draw():
            torch.manual_seed(5)
            return (dt.rand((world * 4, 3), device_mesh=mesh, placements=[Shard(0)]),
                    dt.randn((4, 3), device_mesh=mesh, placements=[Replicate()]))

        sharded, replicated = draw()
        shards = [torch.empty(4, 3, device=device) for _ in range(world)]
        dist.all_gather(shards, sharded.to_local())
        assert all(not torch.equal(shards[0], s) for s in shards[1:]), "shards repeat"
        reps = [torch.empty(4, 3, device=device) for _ in range(world)]
        dist.all_gather(reps, replicated.to_local())
        assert all(torch.equal(reps[0], r) for r in reps[1:]), "replicated values differ"
        again = draw()
        assert torch.equal(again[0].to_local().cpu(), sharded.to_local().cpu())
        assert torch.equal(again[1].to_local().cpu(), replicated.to_local().cpu())
    elif VARIANT in ("tp", "tp_dt", "sp"):
        mesh = init_device_mesh("neuron", (world,))
        torch.manual_seed(0)
        ref = Block()
        model = copy.deepcopy(ref).to(device)
        plan = {"tp": TP_PLAN, "tp_dt": DT_PLAN, "sp": SP_PLAN}[VARIANT]
        if VARIANT == "sp":
            # the block takes and returns its sequence shard (plain tensors, dim 1)
            model = parallelize_module(model, mesh, {"": PrepareModuleInput(
                input_layouts=Shard(1), desired_input_layouts=Shard(1), use_local_output=True)})
        parallelize_module(model, mesh, plan)
        xin = x.to(device)
        if VARIANT == "sp":
            xin = distribute_tensor(xin, mesh, [Shard(1)]).to_local()
        out = model(xin)
        ref_out = ref(x)
        full = out.full_tensor() if hasattr(out, "full_tensor") else out
        if VARIANT == "sp":
            parts = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(parts, out.detach().contiguous())
            full = torch.cat(parts, 1)
        torch.testing.assert_close(full.cpu(), ref_out, **tol)
        out.sum().backward()  # sp: each rank's shard; the parameter grads sum over ranks
        ref_out.sum().backward()
        check_grads(model, ref, tol)
    elif VARIANT == "fsdp_tp":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("neuron", (2, world // 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        ref = Block()
        model = copy.deepcopy(ref).to(device)
        parallelize_module(model, mesh["tp"], TP_PLAN)
        fully_shard(model, mesh=mesh["dp"])
        dp_rank = mesh.get_local_rank("dp")
        xs = torch.randn(4, SEQ, DIM, generator=g)
        out = model(xs.chunk(2)[dp_rank].to(device))
        out.sum().backward()
        ref(xs).sum().backward()
        # the dp ranks' gradients are averaged; the reference summed both halves
        for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad.full_tensor().cpu() * 2, r.grad, **tol, msg=n)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {VARIANT} ok", flush=True)


if __name__ == "__main__":
    main()
