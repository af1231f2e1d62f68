# torch.neuron.profiler: the device side of the PyTorch profiler on neuron. Profiling itself is
# PyTorch's own API: torch.profiler.profile(activities=[ProfilerActivity.CPU,
# ProfilerActivity.PrivateUse1]) records each device work item (op name, device, stream, start,
# duration) through a kineto activity profiler registered by the C++ extension
# (csrc/aten/profiler.cpp, runtime trace in csrc/runtime/trace.cpp). This module only reports
# on that machinery and picks the device events out of a finished profile.
from __future__ import annotations

from typing import Any

import torch

from openneuron import _C

__all__ = ["device_events", "is_available", "trace_stats"]

# ProfilerActivity.NEURON is ProfilerActivity.PrivateUse1, so a CUDA script's
# `activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]` reads as it should after "cuda" ->
# "neuron" (nanoGPT's bench.py with profile=True).
if not hasattr(torch.profiler.ProfilerActivity, "NEURON"):
    torch.profiler.ProfilerActivity.NEURON = torch.profiler.ProfilerActivity.PrivateUse1


def is_available() -> bool:
    """True when the neuron device profiler is registered with PyTorch's kineto, so that
    ProfilerActivity.PrivateUse1 records device ops."""
    return bool(_C._profiler_kineto_registered())


def trace_stats() -> dict[str, int]:
    """State of the device trace buffer: `records` held now (0 outside a profiling session),
    `dropped` records since the outermost session began (buffer full; raise
    OPENNEURON_PROFILER_MAX_EVENTS), and active `sessions`."""
    return {
        "records": int(_C._profiler_trace_size()),
        "dropped": int(_C._profiler_trace_dropped()),
        "sessions": int(_C._profiler_sessions()),
    }


def device_events(prof: Any) -> list[Any]:
    """The device-side events (FunctionEvent, device_type PrivateUse1) of a finished
    torch.profiler.profile or torch.autograd.profiler.profile, ordered by start time."""
    events = prof.events() if hasattr(prof, "events") else prof.function_events
    if events is None:
        return []
    out = [e for e in events if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    return sorted(out, key=lambda e: e.time_range.start)
