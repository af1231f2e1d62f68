# torch.neuron device management: availability, lazy initialization, device selection and
# properties, mirroring torch.cuda. Streams are in streams.py, memory in memory.py, RNG in
# random.py. All device work goes through the extension openneuron._C (csrc/aten/device.cpp).
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch._utils import _LazySeedTracker

from openneuron import _C

__all__ = [
    "current_device",
    "device",
    "device_count",
    "device_of",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "init",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "set_device",
    "synchronize",
]

_DeviceLike = torch.device | str | int | None

_initialized = False
_in_bad_fork = False
_tls = threading.local()
_init_lock = threading.Lock()
_queued_calls: list[tuple[Callable[[], None], list[str]]] = []
_lazy_seed_tracker = _LazySeedTracker()


def _set_initialized(value: bool) -> None:
    """Set the initialized flag here and as torch.neuron._initialized.

    NOTE: torch.utils.checkpoint reads `torch.<device>._initialized` (torch.cuda has it) to
    decide whether to save and restore the device RNG state; without it a checkpointed dropout
    recomputes with different masks.
    """
    global _initialized
    _initialized = value
    package = sys.modules.get(__package__ or "")
    if package is not None:
        package._initialized = value  # type: ignore[attr-defined]


_set_initialized(False)


def _is_in_bad_fork() -> bool:
    """True in a child process forked after the neuron runtime was initialized in the parent.

    torch.manual_seed / torch.seed consult this before seeding the device (torch/random.py).
    """
    return _in_bad_fork or _C._is_in_bad_fork()


def _after_fork_in_child() -> None:
    global _in_bad_fork
    if _initialized:
        _in_bad_fork = True
        _set_initialized(False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def is_available() -> bool:
    """True if at least one neuron device is usable. Never raises and never initializes."""
    return device_count() > 0


def device_count() -> int:
    """The number of visible neuron devices (NEURON_RT_VISIBLE_CORES; default 4).

    0 when the configuration is invalid; torch.neuron.init() then raises the reason.
    """
    return _C._device_count()


def is_initialized() -> bool:
    """True once the neuron runtime has been initialized in this process."""
    return _initialized and not _is_in_bad_fork()


def init() -> None:
    """Initialize the neuron runtime now (it is otherwise initialized on first use).

    Raises RuntimeError naming the environment variable if the configuration is invalid.
    """
    _lazy_init()


def _lazy_call(callable: Callable[[], None], **kwargs: Any) -> None:
    if is_initialized():
        callable()
    elif kwargs.get("seed_all", False):
        _lazy_seed_tracker.queue_seed_all(callable, traceback.format_stack())
    elif kwargs.get("seed", False):
        _lazy_seed_tracker.queue_seed(callable, traceback.format_stack())
    else:
        _queued_calls.append((callable, traceback.format_stack()))


def _lazy_init() -> None:
    """Validate the configuration, create the devices and run calls queued before init.

    Also called by torch itself (torch::utils::device_lazy_init) before the first neuron tensor.
    """
    global _lazy_seed_tracker
    if is_initialized() or getattr(_tls, "is_initializing", False):
        return
    with _init_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize neuron in a forked subprocess: the parent had already "
                "initialized it. Use the 'spawn' start method with multiprocessing "
                "(torch.multiprocessing.set_start_method('spawn'))."
            )
        _tls.is_initializing = True
        try:
            _C._init()
            _queued_calls.extend(call for call in _lazy_seed_tracker.get_calls() if call)
            for queued_call, origin in _queued_calls:
                try:
                    queued_call()
                except Exception as err:
                    raise RuntimeError(
                        "neuron: a call deferred until initialization failed: "
                        f"{err}\nIt was made from:\n{''.join(origin)}"
                    ) from err
            _queued_calls.clear()
            _lazy_seed_tracker = _LazySeedTracker()
        finally:
            _tls.is_initializing = False
        _set_initialized(True)


def _check_index(idx: int) -> int:
    count = device_count()
    if not 0 <= idx < count:
        # NOTE: the value the runtime read (its settings module reads each variable once).
        visible = {n: v for n, v, _ in _C._settings()}.get("NEURON_RT_VISIBLE_CORES")
        source = f"NEURON_RT_VISIBLE_CORES={visible}" if visible else "the default of 4"
        raise RuntimeError(
            f"Invalid device index neuron:{idx}: this process sees {count} neuron device(s) "
            f"(valid indices 0..{count - 1}, from {source}). Pick an index in that range or "
            "change NEURON_RT_VISIBLE_CORES."
        )
    return idx


def _get_device_index(device: _DeviceLike, optional: bool = False) -> int:
    """The neuron device index of an int, "neuron[:N]" string or torch.device.

    With optional=True, None or a device without an index means the current device.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device index, but got None")
        return current_device()
    if not isinstance(device, int):
        raise TypeError(f"Expected a neuron device (int, str or torch.device), got {device!r}")
    return device


def current_device() -> int:
    """The index of the currently selected neuron device."""
    _lazy_init()
    return _C._get_device()


def set_device(device: _DeviceLike) -> None:
    """Select the current neuron device. A negative index is a no-op, as in torch.cuda."""
    idx = _get_device_index(device)
    if idx < 0:
        return
    _lazy_init()
    _C._set_device(_check_index(idx))


class device:
    """Context manager that selects a neuron device for its body, like torch.cuda.device.

    Accepts an int, "neuron:N" or torch.device; None or a negative index is a no-op.
    """

    def __init__(self, device: _DeviceLike):
        if isinstance(device, (str, torch.device)) and torch.device(device).index is None:
            device = None
        self.idx = -1 if device is None else _get_device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx < 0:
            return
        _lazy_init()
        self.prev_idx = _C._exchange_device(_check_index(self.idx))

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0 and self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that selects the device of a tensor or storage (no-op for CPU ones)."""

    def __init__(self, obj: torch.Tensor | torch.UntypedStorage):
        on_neuron = obj.device.type == "neuron"
        super().__init__(obj.device.index if on_neuron else -1)


def get_device_properties(device: _DeviceLike = None) -> Any:
    """Properties of a neuron device: .name, .total_memory (bytes), .cores."""
    _lazy_init()
    return _C._get_device_properties(_check_index(_get_device_index(device, optional=True)))


def get_device_name(device: _DeviceLike = None) -> str:
    """The name of a neuron device."""
    return get_device_properties(device).name


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all work queued on every stream of a neuron device (default: current).

    Errors from asynchronous work on that device are raised here.
    """
    _lazy_init()
    _C._synchronize(_check_index(_get_device_index(device, optional=True)))


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The lower-precision dtypes torch.autocast(device_type="neuron") accepts."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is supported on every neuron device."""
    return True
