# One rank of tests/python/test_distributed_pipeline.py: pipeline parallelism with
# torch.distributed.pipelining on backend "neuron" (stages exchange activations and gradients
# with isend/irecv, batch_isend_irecv), as a CUDA script with the device string changed. Each
# rank is one stage of an MLP split by layers; after two training steps every stage's
# parameters are compared with the same model trained in one process on the same micro-batches.
# argv[1]: gpipe | 1f1b
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import openneuron  # noqa: F401

SCHEDULE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[sys.argv[1]]
LAYERS, DIM, BATCH, MICRO, STEPS = 8, 32, 16, 4, 2


def full_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(DIM, DIM), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(DIM, 10))


def loss_fn(out, target):
    return nn.functional.cross_entropy(out, target)


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(STEPS)]


def main():
    dist.init_process_group(dist.get_default_backend_for_device("neuron"))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    ref = full_model()
    mods = list(ref.children())
    per = len(mods) // world
    lo, hi = rank * per, (len(mods) if rank == world - 1 else (rank + 1) * per)
    stage_mod = copy.deepcopy(nn.Sequential(*mods[lo:hi])).to(device)
    stage = PipelineStage(stage_mod, rank, world, device)
    schedule = SCHEDULE(stage, n_microbatches=MICRO, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=1e-2)
    losses_per_step = []
    for x, y in data():
        opt.zero_grad()
        losses = []
        if rank == 0:
            schedule.step(x.to(device))
        elif rank == world - 1:
            schedule.step(target=y.to(device), losses=losses)
        else:
            schedule.step()
        opt.step()
        losses_per_step.append([float(v) for v in losses])

    # The reference: one process, the same micro-batches, gradients summed over them (as the
    # schedule does), the same optimizer.
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref_losses = []
    for x, y in data():
        ref_opt.zero_grad()
        step_losses = []
        for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
            loss = loss_fn(ref(xm), ym)
            (loss / MICRO).backward()  # the schedule scales gradients by 1 / micro-batches
            step_losses.append(loss.item())
        ref_opt.step()
        ref_losses.append(step_losses)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    if rank == world - 1:
        torch.testing.assert_close(torch.tensor(losses_per_step), torch.tensor(ref_losses), **tol)
    ref_stage = nn.Sequential(*list(ref.children())[lo:hi])
    for (n, p), (_, r) in zip(stage_mod.named_parameters(), ref_stage.named_parameters()):
        torch.testing.assert_close(p.grad.cpu(), r.grad, **tol, msg=f"{n}.grad")
        torch.testing.assert_close(p.detach().cpu(), r.detach(), **tol, msg=n)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: pipeline {sys.argv[1]} ok", flush=True)


if __name__ == "__main__":
    main()
