"""torch.compile on neuron through TorchInductor (DESIGN §6).

Registered lazily: `import torch` stays fast, and the registration runs when `torch._dynamo`
is first imported (torch.compile imports it), through an import hook installed at autoload.
`register()` does it at once.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_registered = False


def register() -> None:
    """The neuron device for Dynamo and Inductor: device interface, device op overrides, C++
    scheduling and the neuron wrapper, the cache-key pass. Idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    from torch._dynamo.device_interface import register_interface_for_device
    from torch._inductor.codegen.common import (
        register_backend_for_device,
        register_device_op_overrides,
    )

    from openneuron._inductor import codegen

    register_interface_for_device("neuron", codegen.NeuronInterface)
    register_device_op_overrides("neuron", codegen.NeuronDeviceOpOverrides())
    register_backend_for_device("neuron", codegen.NeuronScheduling,
                                codegen.NeuronWrapperCodegen,
                                device_custom_pass=codegen.NeuronPostGradPass())
    codegen._patch_current_backend()
    codegen._patch_scheduler()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs register() right after `torch._dynamo` has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
            try:
                register()
            except Exception as err:  # noqa: BLE001 - never breaks `import torch._dynamo`
                import warnings

                warnings.warn(f"openneuron: registering 'neuron' with torch.compile failed: "
                              f"{err}", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Registers now if torch._dynamo is loaded, else when it is. Points Inductor's caches at
    TORCH_NEURONX_NEFF_CACHE_DIR (unless TORCHINDUCTOR_CACHE_DIR is set)."""
    import os

    from openneuron import _C

    cache_dir = _C._compile_settings()[1]
    if cache_dir:
        # NOTE: before anything asks Inductor for its cache folder: it stores its default in the
        # environment on first use.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir)
    if "torch._dynamo" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
