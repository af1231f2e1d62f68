# torch.neuron graphs, mirroring torch.cuda.CUDAGraph / graph / graph_pool_handle: capture the
# device work a region of Python queues, then replay it with one launch. The capture and its
# memory pool live in C++ (csrc/runtime/graph.h); this file is the torch.cuda-shaped surface.
from __future__ import annotations

import gc

import torch

from openneuron import _C

from .device import _lazy_init, synchronize
from .memory import empty_cache
from .streams import Stream, is_current_stream_capturing
from .streams import stream as _stream_context

__all__ = ["NeuronGraph", "graph", "graph_pool_handle"]


def graph_pool_handle() -> int:
    """An opaque memory-pool token to share between captures (`graph(..., pool=...)`)."""
    _lazy_init()
    return _C._graph_pool_create()


class NeuronGraph(_C._NeuronGraph):
    """Captured device work, replayed with one launch (torch.cuda.CUDAGraph's counterpart).

    While the current stream captures, the ops queued on it are recorded, not run; `replay()`
    queues them again on the current stream, on the same tensors (the addresses captured):
    refill static inputs with `copy_` before a replay and read the outputs captured. Tensors
    created during the capture come from the graph's private memory pool, reserved until
    `reset()` or the graph's destruction. A capturing stream refuses what cannot be replayed —
    a synchronize, a copy between host and device, an event, a random op (its seed is taken when
    queued), a collective — with an error naming it, and the capture is invalidated.
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls)

    def __init__(self, keep_graph: bool = False):
        super().__init__()
        self._keep_graph = keep_graph

    def capture_begin(self, pool: int | None = None, capture_error_mode: str = "global") -> None:
        """Start capturing the current stream's work. `pool`: share memory with the captures
        of that pool (`graph_pool_handle()` or another graph's `pool()`). `capture_error_mode`
        is accepted for torch.cuda's signature; a capture is per stream, whatever the thread."""
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode must be 'global', 'thread_local' or 'relaxed', "
                             f"got {capture_error_mode!r}")
        _lazy_init()
        super().capture_begin(0 if pool is None else int(pool))

    def capture_end(self) -> None:
        """End the capture (raises if an op in it could not be captured)."""
        super().capture_end()

    def instantiate(self) -> None:
        """Nothing to do: a capture is ready to replay when it ends (keep_graph is accepted)."""

    def replay(self) -> None:
        """Queue the captured work on the current stream."""
        super().replay()

    def reset(self) -> None:
        """Drop the captured work and release the graph's hold on its memory pool."""
        super().reset()

    def pool(self) -> int:
        """The graph's memory-pool token (share it with `graph(..., pool=g.pool())`)."""
        return super().pool()

    def enable_debug_mode(self) -> None:
        """Accepted for torch.cuda's API; `debug_dump` lists the captured launches."""

    def debug_dump(self, debug_path: str) -> None:
        with open(debug_path, "w") as f:
            f.write(f"neuron graph: {self.num_items()} captured launches, pool {self.pool()}\n")


class graph:
    """Context manager capturing the neuron work of its body into `neuron_graph`, as
    torch.cuda.graph: synchronizes the device and empties the cache first, makes `stream` (or
    a side stream of its own) current, captures, and restores the stream on exit.

    Warm the body up once outside the capture first (lazy initialization, first-call work),
    exactly as on CUDA.
    """

    default_capture_stream: Stream | None = None

    def __init__(self, neuron_graph: NeuronGraph, pool: int | None = None,
                 stream: torch.Stream | None = None, capture_error_mode: str = "global"):
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = _stream_context(self.capture_stream)
        self.neuron_graph = neuron_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        synchronize()
        gc.collect()
        empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.neuron_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self.neuron_graph.capture_end()
        except RuntimeError:
            if exc_type is None:  # else the body's own error explains the failed capture
                raise
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


def _patch_optimizer_capture_check() -> None:
    """torch.optim's check that a captured step() is capturable covers CUDA and XPU only; without
    it, capturing a non-capturable Adam on neuron would bake its step count (a CPU tensor) into
    the graph, silently wrong on every replay. Extended to neuron with torch's message."""
    optimizer = torch.optim.Optimizer
    original = optimizer._accelerator_graph_capture_health_check
    if getattr(original, "_openneuron", False):
        return

    def _accelerator_graph_capture_health_check(self) -> None:
        if (not torch.compiler.is_compiling() and is_current_stream_capturing()
                and not all(group["capturable"] for group in self.param_groups)):
            raise RuntimeError("Attempting NEURON graph capture of step() for an instance of "
                               f"{type(self).__name__} but param_groups' capturable is False.")
        original(self)

    _accelerator_graph_capture_health_check._openneuron = True
    optimizer._accelerator_graph_capture_health_check = _accelerator_graph_capture_health_check


_patch_optimizer_capture_check()
