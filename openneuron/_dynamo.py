# The torch.compile backend "neuron" (DESIGN §6), found by Dynamo through the
# `torch_dynamo_backends` entry point (pyproject.toml), so torch.compile(..., backend="neuron")
# works without importing anything first. Transformers also selects it by itself: generate()
# with a static (compileable) KV cache on a "neuron" model compiles the decoding step with
# backend=model.device.type.
#
# For now the backend is AOTAutograd with graphs that run op by op: forward and backward FX
# graphs (ATen ops) are executed as captured, each op dispatched to the device like eager mode
# (same kernels, same results). The graph compiler of DESIGN §6 plugs in as fw/bw compilers here.
from __future__ import annotations

from typing import Any


def _run_as_captured(gm, example_inputs):
    """fw/bw compiler: the graph itself, boxed (AOTAutograd calls it with a list of args)."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def neuron_backend(gm, example_inputs, **kwargs: Any):
    """Dynamo backend "neuron": AOTAutograd (forward + backward graphs), graphs run on device."""
    from torch._dynamo.backends.common import aot_autograd

    # torch.compile's mode/options tune Inductor; nothing here to tune yet.
    kwargs.pop("mode", None)
    kwargs.pop("options", None)
    backend = aot_autograd(fw_compiler=_run_as_captured, bw_compiler=_run_as_captured)
    return backend(gm, example_inputs, **kwargs)
