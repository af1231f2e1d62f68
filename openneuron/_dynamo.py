# The torch.compile backend "neuron" (DESIGN §6), found by Dynamo through the
# `torch_dynamo_backends` entry point (pyproject.toml), so torch.compile(..., backend="neuron")
# works without importing anything first. Transformers also selects it by itself: generate()
# with a static (compileable) KV cache on a "neuron" model compiles the decoding step with
# backend=model.device.type.
#
# It is TorchInductor (the neuron device is registered with it: openneuron/_inductor/), as the
# default backend is, with TorchNeuron's behaviour on failure: a graph Inductor cannot compile
# runs eagerly (AOTAutograd's graphs op by op on the device), with a warning naming why, unless
# TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1.
from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("openneuron.compile")


def _fallback_disabled() -> bool:
    from openneuron import _C

    return not _C._compile_settings()[0]  # TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION


def _run_as_captured(gm, example_inputs):
    """fw/bw compiler of the eager fallback: the graph itself, boxed."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def _eager(gm, example_inputs, **kwargs):
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_run_as_captured, bw_compiler=_run_as_captured)(
        gm, example_inputs, **kwargs)


def _dynamo_handles() -> tuple[type[BaseException], ...]:
    """What Dynamo itself handles when a backend raises it (output_graph's call_user_compiler):
    a restart of the analysis (not a failure), a frame to skip, the user's IndexError, the
    FakeTensor limits it turns into a graph break. Never caught by the eager fallback."""
    from torch._dynamo import exc

    return (exc.RestartAnalysis, exc.ShortenTraceback, exc.SkipFrame, IndexError,
            *exc.exceptions_allowed_to_be_fallback)


def neuron_backend(gm, example_inputs, **kwargs: Any):
    """Dynamo backend "neuron": TorchInductor (forward + backward), eager on failure."""
    from torch._inductor.compile_fx import compile_fx

    from openneuron import _inductor

    _inductor.register()
    mode = kwargs.pop("mode", None)
    options = kwargs.pop("options", None) or {}
    config_patches = dict(options)
    if mode is not None:
        from torch._inductor import list_mode_options

        config_patches = {**list_mode_options(mode), **config_patches}
    try:
        return compile_fx(gm, example_inputs, config_patches=config_patches or None, **kwargs)
    except Exception as err:
        if _fallback_disabled() or isinstance(err, _dynamo_handles()):
            raise
        message = (f"openneuron: torch.compile(backend='neuron') could not compile a graph "
                   f"({type(err).__name__}: {err}); it runs eagerly instead. Set "
                   f"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1 to raise the error.")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return _eager(gm, example_inputs)
