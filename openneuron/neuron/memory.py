# torch.neuron memory management, mirroring torch.cuda.memory. Statistics come from the caching
# allocator through torch's generic DeviceAllocator path (torch.accelerator.memory_*); device
# info, snapshots and host (pinned) statistics from openneuron._C (csrc/aten/allocator.cpp).
# Allocation stacks are interned in csrc/aten/origin_capture.cpp; snapshots pickle in the format
# of torch.cuda.memory._snapshot(), so torch.cuda._memory_viz and pytorch.org/memory_viz read them.
import os
import pickle
import sys
import time
import traceback
import warnings
from collections import OrderedDict
from typing import Any

import torch

from openneuron import _C

from .device import _check_index, _get_device_index, _lazy_init, device_count, is_initialized

__all__ = [
    "empty_cache",
    "get_per_process_memory_fraction",
    "host_memory_stats",
    "ipc_collect",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]


def _index(device) -> int:
    return _check_index(_get_device_index(device, optional=True))


def memory_stats(device=None) -> "OrderedDict[str, Any]":
    """Allocator statistics of a neuron device, flat keys as torch.cuda.memory_stats.

    E.g. "allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms".
    """
    return torch.accelerator.memory_stats(_index(device))


def memory_stats_as_nested_dict(device=None) -> dict[str, Any]:
    """memory_stats as nested dictionaries ({"allocated_bytes": {"all": {"current": ...}}})."""
    if not torch._C._accelerator_isAllocatorInitialized():
        return {}
    return torch._C._accelerator_getDeviceStats(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes of device memory occupied by tensors on a neuron device, in this process."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since start or the last reset_peak_memory_stats."""
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes of device memory held by the caching allocator (allocated plus cached)."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved since start or the last reset_peak_memory_stats."""
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    """Reset the "peak" statistics to the current values."""
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """Reset the "allocated"/"freed" totals and event counters."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def _reset_peaks_deprecated(name: str, device) -> None:
    warnings.warn(
        f"torch.neuron.{name} now calls torch.neuron.reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=3,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_allocated(device=None) -> None:
    """Deprecated (as in torch.cuda): resets every peak statistic; see reset_peak_memory_stats."""
    _reset_peaks_deprecated("reset_max_memory_allocated", device)


def reset_max_memory_cached(device=None) -> None:
    """Deprecated (as in torch.cuda): resets every peak statistic; see reset_peak_memory_stats."""
    _reset_peaks_deprecated("reset_max_memory_cached", device)


def memory_cached(device=None) -> int:
    """Deprecated alias of memory_reserved (as in torch.cuda)."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated alias of max_memory_reserved (as in torch.cuda)."""
    return max_memory_reserved(device)


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Limit this process's device memory (cached blocks included) to fraction * capacity.

    As torch.cuda's: past the limit an allocation releases the cache, retries, then raises
    torch.OutOfMemoryError naming the limit. fraction must be a float in [0, 1].
    """
    _lazy_init()
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(fraction, _index(device))


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction set by set_per_process_memory_fraction (1.0 until set)."""
    _lazy_init()
    return _C._memory_fraction(_index(device))


def ipc_collect() -> None:
    """torch.cuda.ipc_collect's counterpart: nothing to collect.

    Neuron memory is never shared with another process through IPC handles (torch.multiprocessing
    moves neuron tensors by value), so no block waits for a consumer process to release it.
    """


def empty_cache() -> None:
    """Return the allocator's cached, unused blocks of every neuron device to the device."""
    torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of a neuron device's memory capacity."""
    return tuple(_C._mem_get_info(_index(device)))


def _segment(seg: dict[str, Any]) -> dict[str, Any]:
    # The keys torch.cuda.memory._snapshot() gives a segment, next to ours (is_large).
    blocks = seg["blocks"]
    seg["segment_type"] = "large" if seg["is_large"] else "small"
    seg["active_size"] = sum(b["size"] for b in blocks if b["active"])
    seg["requested_size"] = sum(b["requested_size"] for b in blocks if b["allocated"])
    seg["segment_pool_id"] = (0, 0)
    seg["is_expandable"] = False
    seg["frames"] = []
    return seg


def memory_snapshot() -> list[dict[str, Any]]:
    """The allocator's segments on every neuron device, as torch.cuda.memory_snapshot.

    Each segment: device, address, total_size, allocated_size, active_size, requested_size,
    stream, is_large, segment_type, blocks. Each block: address, size, requested_size, state
    ("active_allocated", "active_pending_free", "inactive"), allocated, active, and frames
    (the allocation's Python stack, innermost first, while _record_memory_history is on).
    """
    if not is_initialized():
        return []
    return [_segment(seg) for d in range(device_count()) for seg in _C._memory_snapshot(d)]


def _record_memory_history(
    enabled: str | bool | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device=None,
    clear_history: bool = False,
) -> None:
    """Record the Python stack of every neuron allocation, as torch.cuda.memory's.

    enabled: "all" or "state" (or True) turns recording on, None (or False) off. Recording
    applies to every neuron device (device is accepted for compatibility). Stacks of live
    blocks are kept, deduplicated, until the blocks are freed; max_entries caps how many
    distinct stacks are kept at once (later allocations then get no frames). clear_history
    forgets every recorded stack. context and stacks are accepted for compatibility: the stack
    of the allocation is always the Python one. Costs one stack walk per allocation while on;
    nothing but a flag check while off.
    """
    if enabled not in ("all", "state", True, None, False):
        raise ValueError(f'enabled must be "all", "state" or None, not {enabled!r}')
    if max_entries <= 0:
        raise ValueError(f"max_entries must be positive, not {max_entries}")
    del context, stacks, device
    on = enabled not in (None, False)
    _C._record_memory_history(on, min(max_entries, 2**63 - 1), clear_history)


def _snapshot(device=None) -> dict[str, Any]:
    """The allocator's state in the format of torch.cuda.memory._snapshot().

    {"segments": memory_snapshot() (of one device when device is given), "device_traces": one
    (empty) list per device, "allocator_settings": {}}. Blocks allocated while
    _record_memory_history was on carry "frames": [{"filename", "line", "name"}, ...].
    """
    segments = memory_snapshot()
    if device is not None:
        idx = _index(device)
        segments = [s for s in segments if s["device"] == idx]
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(device_count())],
        "allocator_settings": {},
    }


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle _snapshot() to filename, readable by torch.cuda._memory_viz and
    https://pytorch.org/memory_viz."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _dump_oom_snapshot(filename: str, device: int, size: int) -> None:
    # Called by the allocator (csrc/aten/allocator.cpp) on out-of-memory when
    # OPENNEURON_OOM_SNAPSHOT is set, before torch.OutOfMemoryError propagates. The failed
    # request is an "oom" trace entry, with the stack that asked for it.
    snapshot = _snapshot()
    free, _ = mem_get_info(device)
    frames = [
        {"filename": f.filename, "line": f.lineno or 0, "name": f.name}
        for f in reversed(traceback.extract_stack())
    ]
    snapshot["device_traces"][device].append(
        {
            "action": "oom",
            "addr": 0,
            "size": size,
            "stream": 0,
            "device_free": free,
            "frames": frames,
            "time_us": time.time_ns() // 1000,
        }
    )
    tmp = f"{filename}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    os.replace(tmp, filename)


def host_memory_stats() -> dict[str, int]:
    """Pinned host memory statistics: allocated_bytes, reserved_bytes, num_allocs, num_frees."""
    return dict(_C._host_memory_stats())


def _format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _format_count(n: int) -> str:
    return str(n)


_ROWS = [
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "Reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "Device reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
]
_POOLS = [("all", ""), ("large_pool", "  from large pool"), ("small_pool", "  from small pool")]
_COLUMNS = ("Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics of a neuron device.

    Like torch.cuda.memory_summary: current, peak, total allocated and total freed for each
    metric, split by pool unless abbreviated.
    """
    idx = _index(device)
    stats = memory_stats(idx)
    width = 25
    col = 12
    inner = width + 4 * (col + 3) + 1
    line = "|" + "=" * inner + "|"
    thin = "|" + "-" * inner + "|"

    def row(label: str, cells: list[str]) -> str:
        return "| " + label.ljust(width) + "".join(f"| {c:>{col}} " for c in cells) + "|"

    lines = [
        line,
        "| " + f"neuron:{idx} memory summary (this process)".ljust(inner - 1) + "|",
        line,
        row("Metric", list(_COLUMNS)),
        thin,
    ]
    for key, label, fmt in _ROWS:
        pools = _POOLS[:1] if abbreviated else _POOLS
        for pool, suffix in pools:
            cells = [
                fmt(int(stats.get(f"{key}.{pool}.{metric}", 0)))
                for metric in ("current", "peak", "allocated", "freed")
            ]
            lines.append(row(label if not suffix else suffix, cells))
        lines.append(thin)
    free, total = mem_get_info(idx)
    for label, value in (
        ("Device capacity", _format_size(total)),
        ("Device free", _format_size(free)),
        ("Allocation retries", _format_count(int(stats.get("num_alloc_retries", 0)))),
        ("Out-of-memory errors", _format_count(int(stats.get("num_ooms", 0)))),
    ):
        lines.append("| " + label.ljust(width) + f"| {value:>{col}}".ljust(4 * (col + 3)) + "|")
    lines.append(line)
    return "\n".join(lines) + "\n"
