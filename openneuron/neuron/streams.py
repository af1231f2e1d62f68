# torch.neuron streams and events, mirroring torch.cuda.Stream / Event / stream(). They are thin
# subclasses of the generic torch.Stream / torch.Event, which work through the device guard
# (csrc/aten/guard.cpp); current/default stream queries go through openneuron._C.
import torch

from openneuron import _C

from .device import _check_index, _get_device_index, _lazy_init, device

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "is_current_stream_capturing",
    "set_stream",
    "stream",
]


def _neuron_device(dev) -> torch.device:
    _lazy_init()
    return torch.device("neuron", _check_index(_get_device_index(dev, optional=True)))


class Stream(torch.Stream):
    """An in-order queue of work on one neuron device, like torch.cuda.Stream.

    Args:
        device: the device of the stream (default: the current device).
        priority: 0 (default) or negative for higher priority.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # wrapping an existing stream: stream_id, device_index, device_type
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, _neuron_device(device), priority=priority)

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record an event on this stream (a new one if not given) and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device={self.device} stream_id={self.stream_id}>"


class _NeuronEventMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(torch.Event, metaclass=_NeuronEventMeta):
    """A marker in a neuron stream, like torch.cuda.Event.

    Args:
        enable_timing: record timestamps so elapsed_time() works.
        blocking: synchronize() blocks the calling thread (always true on the software core).
        interprocess: shareable between processes (not supported on neuron; accepted for
            compatibility).
    """

    # NOTE: returns a plain torch.Event on the neuron device, not an instance of this class:
    # torch.Event.elapsed_time accepts only an exact torch.Event as its argument (a type check
    # in torch/csrc/Event.cpp), so a subclass instance could never be timed against another.
    # isinstance(e, torch.neuron.Event) still holds for every neuron event (metaclass).
    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, device=None):
        dev = torch.device("neuron") if device is None else _neuron_device(device)
        return torch.Event(dev, enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def _wrap(stream_tuple: tuple[int, int, int]) -> Stream:
    stream_id, device_index, device_type = stream_tuple
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None) -> Stream:
    """The stream ops on a neuron device are currently queued on (default: current device)."""
    _lazy_init()
    return _wrap(_C._current_stream(_check_index(_get_device_index(device, optional=True))))


def default_stream(device=None) -> Stream:
    """The default stream of a neuron device (default: current device)."""
    _lazy_init()
    return _wrap(_C._default_stream(_check_index(_get_device_index(device, optional=True))))


def set_stream(stream: torch.Stream | None) -> None:
    """Make `stream` the current stream of its device. None is a no-op."""
    if stream is None:
        return
    _lazy_init()
    _C._set_stream(stream.stream_id, stream.device_index, stream.device_type)


class StreamContext:
    """Context manager that makes a stream current for its body, like torch.cuda.StreamContext.

    Ops in the body are queued on `stream`; on exit the previous stream of the stream's device
    (and of the current device, if different) is restored. None is a no-op.
    """

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.src_prev_stream: Stream | None = None
        self.dst_prev_stream: Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        cur = self.stream
        if cur is None:
            return None
        self.src_prev_stream = current_stream(None)
        if self.src_prev_stream.device != cur.device:
            with device(cur.device):
                self.dst_prev_stream = current_stream(cur.device)
        set_stream(cur)
        return cur

    def __exit__(self, *exc: object) -> bool:
        cur = self.stream
        if cur is None:
            return False
        if self.dst_prev_stream is not None:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    """Select a stream for the body of a `with` block (see StreamContext)."""
    return StreamContext(stream)


def is_current_stream_capturing() -> bool:
    """Whether the current stream is capturing a graph (torch.neuron.graph / NeuronGraph).

    Libraries ask this before work that capture forbids (a sync, an allocation outside the
    graph's pool, a host copy).
    """
    if not torch.neuron.is_initialized():
        return False
    return _C._stream_capturing(current_stream().stream_id, -1)
