# torch.neuron._utils: the device-index helper torch looks up by this name (torch.serialization
# calls device_module._utils._get_device_index(location, True), as for torch.cuda._utils).
# The implementation is device.py's; this only gives it cuda's signature.
import torch

from .device import _get_device_index as _neuron_device_index


def _get_device_index(device, optional: bool = False, allow_cpu: bool = False) -> int:
    """Index of a neuron device given as int, str or torch.device; None/no index -> current
    device when optional. With allow_cpu, a CPU device gives -1."""
    is_device = isinstance(device, (str, torch.device))
    if allow_cpu and is_device and torch.device(device).type == "cpu":
        return -1
    return _neuron_device_index(device, optional=optional)
