# Adaptive eager (DESIGN §5): torch.neuron's controls for the C++ recorder in csrc/aten/fusion.
# Switched on by TORCH_NEURONX_ENABLE_CONCATENATION=1 (read when the extension loads) or at run
# time by set_fusion_enabled(). OPENNEURON_FUSION_LOG=1 prints one line per fused group.
# Nothing here is on the per-op path.
from __future__ import annotations

import contextlib

import torch

_STAT_NAMES = (
    "groups",
    "ops_fused",
    "kernels",
    "cache_hits",
    "cache_misses",
    "bytes_saved",
    "outputs_written",
    "outputs_dead",
)


def _ops():
    import openneuron._C  # noqa: F401  (registers torch.ops.openneuron_fusion)

    return torch.ops.openneuron_fusion


def set_fusion_enabled(enabled: bool) -> None:
    """Turns adaptive eager on or off for the process; off closes the pending group first."""
    _ops().set_enabled(bool(enabled))


def is_fusion_enabled() -> bool:
    return bool(_ops().is_enabled())


@contextlib.contextmanager
def fusion_enabled(enabled: bool = True):
    """Context manager: adaptive eager on (or off) inside the block, restored after."""
    before = is_fusion_enabled()
    set_fusion_enabled(enabled)
    try:
        yield
    finally:
        set_fusion_enabled(before)


def set_fusion_log(enabled: bool) -> None:
    """Same as OPENNEURON_FUSION_LOG=1: one line per fused group on stderr."""
    _ops().set_log(bool(enabled))


def set_fusion_max_ops(n: int) -> None:
    """Group size limit (default 64, env OPENNEURON_FUSION_MAX_OPS)."""
    _ops().set_max_ops(int(n))


def fusion_flush() -> None:
    """Closes the pending group now (enqueues its kernel); synchronize() does this too."""
    _ops().flush()


def fusion_stats() -> dict[str, int]:
    """Counters since start or reset_fusion_stats(): groups closed, ops fused, kernels
    enqueued, kernel cache hits/misses, bytes of memory traffic saved versus eager, results
    written and results never written (dead intermediates)."""
    return dict(zip(_STAT_NAMES, (int(v) for v in _ops().stats())))


def reset_fusion_stats() -> None:
    _ops().reset_stats()
