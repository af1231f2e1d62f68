# One rank of tests/python/test_distributed_groups.py: process groups made every way a script
# makes them on backend "neuron", on 4 ranks with the default group bound to this rank's device
# (`init_process_group(device_id=...)`, as the FSDP2 example and torchtitan do): `split_group`,
# `new_group`, `new_subgroups`, and the sub-meshes of a 2-D `init_device_mesh` (which split the
# default group when it has a bound device). Each group's collectives are checked.
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import openneuron  # noqa: F401


def check_sum(group, members):
    t = torch.full((5,), float(dist.get_rank() + 1), device="neuron")
    dist.all_reduce(t, group=group)
    want = float(sum(r + 1 for r in members))
    assert torch.equal(t.cpu(), torch.full((5,), want)), (members, t)
    assert dist.get_backend(group) == "neuron", dist.get_backend(group)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("neuron", local_rank)
    dist.init_process_group(dist.get_default_backend_for_device(device), device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    assert dist.get_default_backend_for_device("neuron") == "neuron"
    assert dist.group.WORLD.bound_device_id == device

    pairs = [[0, 1], [2, 3]]
    split = dist.split_group(split_ranks=pairs)
    mine = pairs[rank // 2]
    assert split is not None and split.size() == 2 and split.rank() == rank % 2
    check_sum(split, mine)
    # a split that leaves ranks out: they get None
    only_odd = dist.split_group(split_ranks=[[1, 3]])
    assert (only_odd is None) == (rank % 2 == 0)
    if only_odd is not None:
        check_sum(only_odd, [1, 3])

    ng = dist.new_group([0, 2, 3])
    if rank in (0, 2, 3):
        check_sum(ng, [0, 2, 3])
    sub, _ = dist.new_subgroups(group_size=2)
    check_sum(sub, mine)

    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    check_sum(dp, [rank % 2, rank % 2 + 2])
    check_sum(tp, mine)
    # a collective on the sub-mesh's group while the other dimension's runs: issue order per group
    x = torch.full((1000,), float(rank), device="neuron")
    y = torch.full((1000,), float(rank), device="neuron")
    w1 = dist.all_reduce(x, group=dp, async_op=True)
    w2 = dist.all_reduce(y, group=tp, async_op=True)
    w1.wait()
    w2.wait()
    assert torch.equal(x.cpu(), torch.full((1000,), float(2 * (rank % 2) + 2)))
    assert torch.equal(y.cpu(), torch.full((1000,), float(4 * (rank // 2) + 1)))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: groups ok", flush=True)


if __name__ == "__main__":
    main()
