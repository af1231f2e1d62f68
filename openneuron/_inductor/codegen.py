"""The neuron device for TorchInductor (DESIGN §6): Inductor's C++ code generation
(`CppScheduling`) produces the kernels, and the Python wrapper launches them on the current
neuron stream (codecache.py) instead of calling them on the Python thread. Extern kernels
(matmuls, convolutions) and ATen fallbacks dispatch to neuron as in eager mode, so the native
kernels (flash SDPA, norms, fused optimizers) stay in use.
"""
from __future__ import annotations

import functools
import hashlib

import torch
from torch._inductor.codegen.common import DeviceOpOverrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass

# Part of the FX-graph and AOTAutograd cache keys (NeuronPostGradPass.uuid): bump it whenever
# what this package generates changes, so no artifact of an older one ever loads.
CODEGEN_VERSION = "openneuron-inductor-1"


class NeuronWrapperCodegen(PythonWrapperCodegen):
    """The Python wrapper of a compiled graph on neuron: CPU-style kernels, launched on the
    neuron stream (`neuron_pybinding` in place of `async_compile.cpp_pybinding`)."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return PythonWrapperCodegen.create(is_subgraph, subgraph_name, parent_wrapper,
                                               partition_signatures)
        return NeuronWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(
            "from openneuron._inductor.codecache import pybinding as neuron_pybinding")

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True,
                      cpp_definition=None):
        from torch._inductor.virtualized import V

        device = V.graph.get_current_device_or_throw()
        if device.type == "neuron":  # a CPU kernel of a mixed graph stays a CPU call
            kernel_body = kernel_body.replace(
                "async_compile.cpp_pybinding(",
                f"neuron_pybinding(async_compile, {kernel_name!r}, ", 1)
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True,
                                     **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        if not triton and device.type == "neuron":
            # a C++ kernel: its launcher queues it on the current stream (codecache.py)
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                             triton=triton, **kwargs)


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """What the Python wrapper writes for device and stream handling on neuron."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(_):\n    return 0\n"

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


# A neuron kernel's loops go parallel only with at least this many elements per thread (Inductor's
# CPU default is 512), as the device's own kernels and ATen ops do (runtime::kMinParallelWork in
# csrc/runtime/parallel.h): the kernels run on a stream's executor thread next to the Python
# thread, libgomp is then throttled (more threads than cores) and a parallel region wakes its
# team with a futex, up to ~60 us on the project machine. Measured (GPT training step, ms):
# 512 55.7-57.8, 8192 54.1-54.2, 131072 58.7-60.4; decode's kernels (a few thousand elements)
# run on one thread. TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE, when set, decides instead.
NEURON_MIN_CHUNK_SIZE = 8192


class NeuronScheduling(CppScheduling):
    """Inductor's C++ scheduling; the kernels it defines are launched by the neuron wrapper.
    Loops are parallel only above NEURON_MIN_CHUNK_SIZE elements per thread."""

    def codegen_node(self, node):
        with _neuron_chunk_size():
            return super().codegen_node(node)

    def codegen_template(self, *args, **kwargs):
        with _neuron_chunk_size():
            return super().codegen_template(*args, **kwargs)


def _neuron_chunk_size():
    import contextlib
    import os

    from torch._inductor import config

    if "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE" in os.environ:
        return contextlib.nullcontext()
    return config.patch({"cpp.min_chunk_size": NEURON_MIN_CHUNK_SIZE})


def _patch_scheduler() -> None:
    """Three scheduler passes (loop reordering and reindexing across fusions) are validated for
    Triton only and skip nodes whose `is_cpu()`; neuron's nodes are C++ code like the CPU's."""
    from torch._inductor.scheduler import BaseSchedulerNode

    if getattr(BaseSchedulerNode.is_cpu, "_openneuron", False):
        return

    def is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", "neuron")

    is_cpu._openneuron = True
    BaseSchedulerNode.is_cpu = is_cpu


def _patch_current_backend() -> None:
    """Inductor maps a device it does not know to its GPU backend ("triton"): masked loads and
    shape propagation then take the Triton paths and crash. neuron generates C++."""
    from torch._inductor import scheduler, utils
    from torch._inductor.codegen import common
    from torch._inductor.kernel import mm_common

    original = utils.get_current_backend
    if getattr(original, "_openneuron", False):
        return

    @functools.wraps(original)
    def get_current_backend(device_type=None):
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == "neuron" else original(device_type)

    get_current_backend._openneuron = True
    for module in (utils, common, scheduler, mm_common):
        module.get_current_backend = get_current_backend


class NeuronPostGradPass(CustomGraphModulePass):
    """Runs on graphs with neuron tensors after AOTAutograd; changes nothing yet. Its uuid keys
    Inductor's FX-graph and AOTAutograd caches with this package's code generation (the source
    of codegen.py, codecache.py, flex_attention.py, graphs.py and CODEGEN_VERSION), so an
    artifact built by another version never loads."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        return None

    def uuid(self) -> str:
        return _codegen_hash()


@functools.cache
def _codegen_hash() -> str:
    from pathlib import Path

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(CODEGEN_VERSION.encode())
    for name in ("codegen.py", "codecache.py", "flex_attention.py", "graphs.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()
