# torch.neuron: the device module registered with torch._register_device_module("neuron", ...).
# Mirrors torch.cuda's names and behaviour; FSDP2, DeviceMesh, DDP, checkpointing and
# torch.random look it up as getattr(torch, "neuron"). Pieces: device.py (selection, lazy init),
# streams.py, memory.py, random.py. Registration itself is in openneuron/__init__.py.
import sys as _sys

import torch as _torch

from . import _utils as _utils
from . import amp as amp
from . import nvtx as nvtx
from . import profiler as profiler
from .device import _get_device_index as _get_device_index
from .device import _is_in_bad_fork as _is_in_bad_fork
from .device import _lazy_call as _lazy_call
from .device import _lazy_init as _lazy_init
from .device import (
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    synchronize,
)
from .fusion import (
    fusion_enabled,
    fusion_flush,
    fusion_stats,
    is_fusion_enabled,
    reset_fusion_stats,
    set_fusion_enabled,
    set_fusion_log,
    set_fusion_max_ops,
)
from .graphs import NeuronGraph, graph, graph_pool_handle, make_graphed_callables
from .memory import (
    empty_cache,
    get_per_process_memory_fraction,
    host_memory_stats,
    ipc_collect,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    is_current_stream_capturing,
    set_stream,
    stream,
)

# As torch.cuda.OutOfMemoryError: `except torch.neuron.OutOfMemoryError` catches a neuron OOM.
OutOfMemoryError = _torch.OutOfMemoryError

# NOTE: `import torch.neuron.amp` (or `from torch.neuron.amp import autocast`) must find these
# modules, not import a second copy of them under the torch.neuron name.
for _name in ("amp", "graphs", "memory", "profiler", "random", "streams"):
    _sys.modules.setdefault(f"torch.neuron.{_name}", _sys.modules[f"{__name__}.{_name}"])
del _name

__all__ = [
    "Event",
    "NeuronGraph",
    "OutOfMemoryError",
    "Stream",
    "StreamContext",
    "amp",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "fusion_enabled",
    "fusion_flush",
    "fusion_stats",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "host_memory_stats",
    "init",
    "initial_seed",
    "ipc_collect",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_fusion_enabled",
    "is_initialized",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
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
    "nvtx",
    "reset_accumulated_memory_stats",
    "reset_fusion_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_fusion_enabled",
    "set_fusion_log",
    "set_fusion_max_ops",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]
