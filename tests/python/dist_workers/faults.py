# One rank of tests/python/test_distributed_faults.py. argv[1] is what goes wrong on the last
# rank: exit | kill | hang | mismatch. The group timeout is 5 s; every other rank must raise (at
# the collective's wait or the next sync) naming the collective, group, its rank and the peer,
# then still run neuron ops and destroy the process group. Prints a result line per rank.
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import openneuron  # noqa: F401

FAULT = sys.argv[1]
DEV = sys.argv[2] if len(sys.argv) > 2 else "neuron"
TIMEOUT = 5.0


def main():
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=TIMEOUT))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(DEV)
    t = torch.ones(1000, device=dev)
    dist.all_reduce(t)  # a healthy collective first
    assert t.cpu()[0].item() == world
    dist.barrier()
    faulty = rank == world - 1
    if faulty:
        if FAULT == "exit":
            os._exit(3)
        if FAULT == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if FAULT == "hang":
            time.sleep(TIMEOUT + 15)
            os._exit(0)
    n = 12 if (FAULT == "mismatch" and faulty) else 10
    t = torch.ones(n, device=dev)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        t.cpu()  # neuron: the error arrives at the sync (the stream waits for the work)
    except Exception as e:  # noqa: BLE001 - reported below
        took = time.monotonic() - start
        print(f"rank {rank}: raised after {took:.1f}s: {type(e).__name__}: {e}", flush=True)
    else:
        print(f"rank {rank}: NO ERROR", flush=True)
        sys.exit(1)
    # still usable: neuron ops and tearing the group down
    x = torch.arange(4.0, device="neuron") * 2
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    dist.destroy_process_group()
    print(f"rank {rank}: survived", flush=True)


if __name__ == "__main__":
    main()
