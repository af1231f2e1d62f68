"""openneuron.nki: NKI kernels on the neuron device (DESIGN §8).

Write a kernel as for Trainium, in either public generation of NKI (Beta 1 `neuronxcc.nki` or
0.x `nki`), decorate it with `@nki.jit`, and call it on neuron tensors (queued on the current
stream), numpy arrays (run now, numpy back, as NKI's simulator does) or CPU tensors. A kernel is
traced once per (shapes, dtypes, constant arguments, grid) into a program the C++ executor
(csrc/nki) runs; `custom_op` makes it a torch.library op (torch.compile, autograd). `alias()`
lets kernel files import `neuronxcc.nki` / `nki` unchanged.

    import openneuron.nki as nki
    import openneuron.nki.language as nl
"""

from __future__ import annotations

import sys

from openneuron.nki import compiler, isa, language, typing
from openneuron.nki._kernel import BenchmarkResult, Kernel, Traced
from openneuron.nki._trace import NkiError

__all__ = [
    "BenchmarkResult",
    "Kernel",
    "NkiError",
    "Traced",
    "alias",
    "baremetal",
    "benchmark",
    "custom_op",
    "isa",
    "jit",
    "language",
    "simulate",
    "simulate_kernel",
    "trace",
]

_MODES = ("auto", "baremetal", "benchmark", "simulation", "trace", "torchxla", "jax")


def jit(func=None, mode="auto", **options):
    """@nki.jit / @nki.jit(mode=...): a kernel. mode "trace" returns the traced program
    (nki.Traced) instead of running it; "benchmark" records latencies; the others run it."""
    if mode not in _MODES:
        raise NkiError(f"nki.jit: unknown mode {mode!r} (one of {', '.join(_MODES)})")

    def wrap(f):
        if isinstance(f, Kernel):
            return Kernel(f.func, mode, f.grid, **options)
        return Kernel(f, mode, **options)

    return wrap(func) if func is not None else wrap


# Beta 1's older decorator for kernels run through nki.simulate_kernel / baremetal
trace = jit


def _as_kernel(kernel, mode="auto", **options) -> Kernel:
    if isinstance(kernel, Kernel):
        return kernel if mode == kernel.mode and not options else \
            Kernel(kernel.func, mode, kernel.grid, kernel._cache, **options)
    return Kernel(kernel, mode, **options)


def simulate_kernel(kernel, *args, **kwargs):
    """Runs a kernel now on numpy arrays and returns numpy arrays (Beta 1's simulator entry)."""
    return _as_kernel(kernel)(*args, **kwargs)


def simulate(kernel):
    """0.x: nki.simulate(kernel)(arrays...) runs it now and returns results of the inputs' kind
    (numpy arrays or torch tensors); nki.simulate(kernel[2]) for an LNC-2 launch."""
    k = _as_kernel(kernel)
    return lambda *args, **kwargs: k(*args, **kwargs)


def baremetal(kernel=None, **options):
    """nki.baremetal(kernel)(arrays...): runs it now (no hardware here: the neuron executor)."""
    if kernel is None:
        return lambda k: _as_kernel(k, "baremetal")
    return _as_kernel(kernel, "baremetal")


def benchmark(kernel=None, warmup=2, iters=10, **options):
    """nki.benchmark(kernel)(args...): runs warmup + iters launches; latencies (microseconds)
    in kernel.benchmark_result.nc_latency.get_latency_percentile(p)."""
    def wrap(k):
        k = k if isinstance(k, Kernel) else Kernel(k)
        return Kernel(k.func, "benchmark", k.grid, k._cache, warmup, iters)
    return wrap(kernel) if kernel is not None else wrap


_ALIASES = ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.language", "neuronxcc.nki.isa",
            "neuronxcc.nki.isa.constants", "neuronxcc.nki.typing", "neuronxcc.nki.compiler",
            "nki", "nki.language", "nki.isa", "nki.isa.constants", "nki.dtype")


def alias():
    """Makes `neuronxcc`, `neuronxcc.nki[.language|.isa|.isa.constants|.typing|.compiler]` and
    `nki[.language|.isa|.isa.constants|.dtype]` resolve to this package, so NKI kernel files run
    unchanged. Opt-in: nothing is installed under those names otherwise (the real Neuron
    compiler and a PyPI placeholder use them).
    Refuses to shadow a different module already imported under one of them."""
    import types

    this = sys.modules[__name__]
    root = types.ModuleType("neuronxcc")
    root.nki = this
    root.__path__ = []
    targets = {"neuronxcc": root, "neuronxcc.nki": this, "neuronxcc.nki.language": language,
               "neuronxcc.nki.isa": isa, "neuronxcc.nki.isa.constants": isa.constants,
               "neuronxcc.nki.typing": typing, "neuronxcc.nki.compiler": compiler, "nki": this,
               "nki.language": language, "nki.isa": isa, "nki.isa.constants": isa.constants,
               "nki.dtype": language}
    for name in _ALIASES:
        present = sys.modules.get(name)
        if present is not None and present is not targets[name] and \
                getattr(present, "__name__", "") != "neuronxcc":
            raise NkiError(f"nki.alias(): {name} is already imported from "
                           f"{getattr(present, '__file__', present)!r}; call alias() first")
    for name in _ALIASES:
        sys.modules[name] = targets[name]


def custom_op(name, kernel, *, mutates_args=(), num_outputs=None, grid=None):
    """A torch.library custom op `name` ("namespace::op") running `kernel`: schema from the
    kernel's parameters, fake implementation from its trace, `register_autograd` on the result.
    num_outputs: read from the kernel's return statements when not given. grid: a launch
    grid, or a callable giving one from the arguments. See _torch.py."""
    from openneuron.nki._torch import custom_op as make
    return make(name, kernel, mutates_args=mutates_args, num_outputs=num_outputs, grid=grid)


def __getattr__(name):
    if name == "tensor":  # 0.x: nki.tensor is the tensor type
        return language.NkiTensor
    if name == "dtype":  # 0.x: nki.dtype, the dtype names (nki.dtype.float8_e4m3), annotations
        return language
    raise AttributeError(name)
