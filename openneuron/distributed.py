"""The "neuron" torch.distributed backend (DESIGN §7), registered at import.

`dist.init_process_group()` / `init_process_group("neuron")`, `init_device_mesh("neuron", ...)`,
`new_group` and `get_default_backend_for_device("neuron")` pick it for neuron tensors (and for
CPU tensors in a group created with backend "neuron"). The collectives are C++
(csrc/aten/distributed, csrc/collectives); this module only agrees, through the group's store,
on what each group runs over: one shared-memory segment when every rank is on this host
(host ids: OPENNEURON_HOST_ID, else hostname + boot id), else a Gloo group of the same ranks.
"""
from __future__ import annotations

import os
import secrets

import torch
import torch.distributed as dist

BACKEND = "neuron"


def _create_backend(opts, pg_options=None):
    """torch.distributed's factory (extended API): called once per group on every member."""
    from openneuron import _C

    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    group = opts.group_id or "default"
    # NOTE: a group re-created on the same store prefix (destroy + init again) gets new keys:
    # every member adds 1, so each creation has its own epoch.
    epoch = (store.add("neuron/joined", 1) - 1) // size
    key = f"neuron/{epoch}"
    store.set(f"{key}/host/{rank}", _C._host_id())
    hosts = {store.get(f"{key}/host/{r}").decode() for r in range(size)}
    gloo, shm = None, ""
    if len(hosts) > 1:
        gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{key}/gloo/", store), rank, size, timeout)
    elif rank == 0:
        shm = f"/openneuron-{os.getpid()}-{secrets.token_hex(6)}"
        store.set(f"{key}/shm", shm)
    else:
        shm = store.get(f"{key}/shm").decode()
    return _C._neuron_backend(rank, size, timeout_ms, group, shm, gloo)


def _is_neuron(group) -> bool:
    return dist.is_initialized() and dist.get_backend(group) == BACKEND


def _patch_torch() -> None:
    """What torch 2.13's Python layer allows only for Gloo/NCCL, also for "neuron":
    monitored_barrier (C++: a barrier whose timeout error names the ranks that did not arrive),
    _set_pg_timeout, and torch.distributed.set_timeout (newer torch; torchtitan calls it)."""
    c10d = dist.distributed_c10d
    monitored_barrier, set_pg_timeout = c10d.monitored_barrier, c10d._set_pg_timeout

    def neuron_monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if not _is_neuron(group):
            return monitored_barrier(group, timeout, wait_all_ranks)
        g = c10d._get_default_group() if group is None else group
        if timeout is None:
            timeout = c10d._get_default_timeout(BACKEND)
        return g.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    def neuron_set_pg_timeout(timeout, group=None):
        g = c10d._get_default_group() if group is None else group
        done = False
        for device in ("neuron", "cpu"):
            try:
                backend = g._get_backend(torch.device(device))
            except RuntimeError:  # no backend for that device in this group
                continue
            if backend.name() == BACKEND:
                backend.set_timeout(timeout)
                done = True
        if not done:
            set_pg_timeout(timeout, group)

    neuron_monitored_barrier.__doc__ = monitored_barrier.__doc__
    neuron_set_pg_timeout.__doc__ = set_pg_timeout.__doc__
    c10d.monitored_barrier = dist.monitored_barrier = neuron_monitored_barrier
    c10d._set_pg_timeout = neuron_set_pg_timeout
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = neuron_set_pg_timeout


def register() -> None:
    """Registers the backend with torch.distributed; idempotent."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        BACKEND, _create_backend, extended_api=True, devices=[BACKEND, "cpu"]
    )
    _patch_torch()
