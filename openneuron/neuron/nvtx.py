# torch.neuron.nvtx, mirroring torch.cuda.nvtx: a CUDA script's NVTX annotations keep working
# after "cuda" -> "neuron". There is no Nsight on neuron; each range is a torch.profiler
# record_function range instead, so it shows in torch.profiler traces (host row) around the
# device rows of the work it enqueued. Annotations are per call and cheap when no profiler runs.
import threading
from contextlib import contextmanager

import torch

__all__ = ["mark", "range", "range_end", "range_pop", "range_push", "range_start"]

_tls = threading.local()
_open: dict[int, object] = {}  # range_start handles by id
_lock = threading.Lock()
_next_id = 1


def _enter(msg: str) -> object:
    return torch.ops.profiler._record_function_enter_new(str(msg), None)


def _exit(record: object) -> None:
    torch.ops.profiler._record_function_exit._RecordFunction(record)


def _stack() -> list:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def range_push(msg) -> int:
    """Push a range onto this thread's stack of nested ranges; returns its zero-based depth."""
    stack = _stack()
    stack.append(_enter(msg))
    return len(stack) - 1


def range_pop() -> int:
    """Pop this thread's innermost range; returns the depth it had, or -1 with none open."""
    stack = _stack()
    if not stack:
        return -1
    _exit(stack.pop())
    return len(stack)


def range_start(msg) -> int:
    """Start a range that may end on any thread and out of nesting order; returns its handle."""
    global _next_id
    record = _enter(msg)
    with _lock:
        handle, _next_id = _next_id, _next_id + 1
        _open[handle] = record
    return handle


def range_end(range_id) -> None:
    """End the range range_start returned range_id for."""
    with _lock:
        record = _open.pop(range_id, None)
    if record is None:
        raise ValueError(f"torch.neuron.nvtx.range_end: no open range with id {range_id!r}")
    _exit(record)


def mark(msg) -> None:
    """An instantaneous event: an empty range named msg."""
    _exit(_enter(msg))


@contextmanager
def range(msg, *args, **kwargs):
    """Context manager / decorator: a range named msg.format(*args, **kwargs) around the body."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
