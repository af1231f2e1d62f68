"""torch.compile on neuron through TorchInductor (DESIGN §6).

Registered lazily, so `import torch` stays fast and no import of ours runs inside someone else's
import cycle: an import hook installed at autoload acts right after a module has executed —
`torch._dynamo`: the device interface; `torch._inductor.codegen.common`: Inductor's registration
runs at its first `init_backend_registration()` (every compile calls it before code generation);
`torch._inductor.compile_fx`: the background compile of OPENNEURON_COMPILE_ASYNC=1
(async_compile.py); the flex-attention modules: their neuron patches (flex_attention.py). `register()` does it all
at once.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

_inductor_registered = False


def register() -> None:
    """The neuron device for Dynamo and Inductor. Idempotent."""
    import importlib

    for name, action in _ON_IMPORT.items():
        action(importlib.import_module(name))  # hooks may have acted already: each is idempotent
    _register_inductor()


def _register_dynamo(_module) -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.device_interface import register_interface_for_device

    from openneuron._inductor.interface import NeuronInterface

    register_interface_for_device("neuron", NeuronInterface)
    # torch.neuron's Python functions (RNG state, streams, memory, devices) run eagerly inside a
    # compiled function, as torch.cuda's do: Dynamo skips torch's own files but would inline
    # ours, and cannot trace device state (a generator's set_state on FakeTensors).
    trace_rules.add("openneuron.neuron")


def _wrap_init_backend_registration(common) -> None:
    original = common.init_backend_registration
    if getattr(original, "_openneuron", False):
        return

    @functools.wraps(original)
    def init_backend_registration():
        original()
        _register_inductor()

    init_backend_registration._openneuron = True
    common.init_backend_registration = init_backend_registration


def _register_inductor() -> None:
    """Device op overrides, C++ scheduling and the neuron wrapper, the cache-key pass, the
    flex-attention lowering."""
    global _inductor_registered
    if _inductor_registered:
        return
    _inductor_registered = True
    from torch._inductor.codegen.common import (
        register_backend_for_device,
        register_device_op_overrides,
    )

    from openneuron._inductor import codegen, flex_attention, graphs

    register_device_op_overrides("neuron", codegen.NeuronDeviceOpOverrides())
    register_backend_for_device("neuron", codegen.NeuronScheduling,
                                codegen.NeuronWrapperCodegen,
                                device_custom_pass=codegen.NeuronPostGradPass())
    codegen._patch_current_backend()
    codegen._patch_scheduler()
    flex_attention.patch_lowering()
    graphs.install()


def _async_compile(module) -> None:
    from openneuron._inductor import async_compile

    async_compile.patch(module)


def _flex_validate(module) -> None:
    from openneuron._inductor import flex_attention

    flex_attention.patch_validate_device(module)


def _flex_autograd(module) -> None:
    from openneuron._inductor import flex_attention

    flex_attention.patch_autograd(module)


# module -> what runs right after it has executed (or at install(), if it already has)
_ON_IMPORT = {
    "torch._dynamo": _register_dynamo,
    "torch._inductor.codegen.common": _wrap_init_backend_registration,
    "torch._inductor.compile_fx": _async_compile,
    "torch._higher_order_ops.flex_attention": _flex_autograd,
    "torch.nn.attention.flex_attention": _flex_validate,
}


def _run(action, module) -> None:
    try:
        action(module)
    except Exception as err:  # noqa: BLE001 - never breaks the user's import
        import warnings

        warnings.warn(f"openneuron: registering 'neuron' with torch.compile failed: {err}",
                      RuntimeWarning, stacklevel=3)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs _ON_IMPORT[name] right after module `name` has executed."""

    def find_spec(self, fullname, path, target=None):
        action = _ON_IMPORT.get(fullname)
        if action is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_act(module):
            exec_module(module)
            _run(action, module)

        spec.loader.exec_module = exec_then_act
        return spec


def install() -> None:
    """Acts now for the modules already imported, and on import for the rest. Points Inductor's
    caches at TORCH_NEURONX_NEFF_CACHE_DIR (unless TORCHINDUCTOR_CACHE_DIR is set)."""
    import os

    from openneuron import _C

    cache_dir = _C._compile_settings()[1]
    if cache_dir:
        # NOTE: before anything asks Inductor for its cache folder: it stores its default in the
        # environment on first use.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir)
    for name, action in _ON_IMPORT.items():
        if name in sys.modules:
            _run(action, sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
