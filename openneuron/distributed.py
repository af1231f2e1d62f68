"""The "neuron" torch.distributed backend (DESIGN §7), registered at import.

`dist.init_process_group()` / `init_process_group("neuron")`, `init_device_mesh("neuron", ...)`,
`new_group`, `split_group` and `get_default_backend_for_device("neuron")` pick it for neuron
tensors (and for CPU tensors in a group created with backend "neuron"). The collectives are C++
(csrc/aten/distributed, csrc/collectives); this module only agrees, through the group's store,
on what each group runs over: one shared-memory segment when every rank is on this host (host
ids: OPENNEURON_HOST_ID, else hostname + boot id); across hosts, shared memory inside each host
and Gloo between them.
"""
from __future__ import annotations

import datetime
import os
import secrets

import torch
import torch.distributed as dist

BACKEND = "neuron"


def _segment_name() -> str:
    return f"/openneuron-{os.getpid()}-{secrets.token_hex(6)}"


def _build(store, rank: int, size: int, timeout, group: str):
    """Every member of a group calls this with its group rank and the group's own store; it
    returns once all have joined. Also called by the C++ backend's split() (split_group, and
    DeviceMesh sub-meshes when the default group has a bound device)."""
    from openneuron import _C

    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    # NOTE: a group re-created on the same store prefix (destroy + init again) gets new keys:
    # every member adds 1, so each creation has its own epoch.
    epoch = (store.add("neuron/joined", 1) - 1) // size
    key = f"neuron/{epoch}"
    store.set(f"{key}/host/{rank}", _C._host_id())
    ids = [store.get(f"{key}/host/{r}").decode() for r in range(size)]
    hosts = list(dict.fromkeys(ids))  # in order of first appearance
    if len(hosts) == 1:
        if rank == 0:
            store.set(f"{key}/shm", _segment_name())
        shm = store.get(f"{key}/shm").decode()
        return _C._neuron_backend(rank, size, timeout_ms, group, shm=shm)
    # Spanning hosts. Hierarchical (shared memory inside each host, Gloo between one leader per
    # host) when each host holds the same number of consecutive ranks, as torchrun assigns them;
    # else every collective over a Gloo group of all ranks.
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{key}/gloo/", store), rank, size, timeout)
    per_host = size // len(hosts)
    hierarchical = per_host > 1 and all(ids[r] == hosts[r // per_host] for r in range(size))
    if not hierarchical:
        return _C._neuron_backend(rank, size, timeout_ms, group, gloo=gloo)
    host, local_rank = rank // per_host, rank % per_host
    if local_rank == 0:
        store.set(f"{key}/shm/{host}", _segment_name())
    shm = store.get(f"{key}/shm/{host}").decode()
    leaders = None
    if local_rank == 0:
        leaders = dist.ProcessGroupGloo(dist.PrefixStore(f"{key}/leaders/", store), host,
                                        len(hosts), timeout)
    return _C._neuron_backend(rank, size, timeout_ms, group, shm=shm, local_size=per_host,
                              gloo=gloo, leaders=leaders)


def _split(store, rank: int, size: int, timeout_ms: int, group: str):
    """NeuronBackend::split (C++): this rank's part of a subgroup, on the subgroup's store."""
    return _build(store, rank, size, datetime.timedelta(milliseconds=timeout_ms), group)


def _create_backend(opts, pg_options=None):
    """torch.distributed's factory (extended API): called once per group on every member."""
    from openneuron import _dtensor

    _dtensor.register()
    return _build(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                  opts.group_id or "default")


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
    from openneuron import _C

    dist.Backend.register_backend(
        BACKEND, _create_backend, extended_api=True, devices=[BACKEND, "cpu"]
    )
    _C._set_split_factory(_split)
    _patch_torch()
