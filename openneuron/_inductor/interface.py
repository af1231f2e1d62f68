"""Dynamo's view of the neuron device. Kept apart from codegen.py: it is registered while
`torch._dynamo` is being imported, when importing Inductor could close an import cycle."""
from __future__ import annotations

import torch
from torch._dynamo.device_interface import CpuInterface, DeviceInterface


class NeuronInterface(DeviceInterface):
    """Dynamo's view of the neuron device (streams, events, properties)."""

    device = torch.neuron.device
    Event = torch.neuron.Event
    Stream = torch.neuron.Stream

    class Worker(CpuInterface.Worker):
        @staticmethod
        def set_device(device: int) -> None:
            pass

        @staticmethod
        def current_device() -> int:
            return 0

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    stream = staticmethod(torch.neuron.stream)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    synchronize = staticmethod(torch.neuron.synchronize)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        prev = torch.neuron.current_device()
        if device != prev:
            torch.neuron.set_device(device)
        return prev

    exchange_device = maybe_exchange_device

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def get_device_properties(device=None):
        return CpuInterface.Worker.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device=None) -> int:
        return torch.neuron.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False
