# torch.neuron graphs, mirroring torch.cuda.CUDAGraph / graph / graph_pool_handle: capture the
# device work a region of Python queues, then replay it with one launch. The capture and its
# memory pool live in C++ (csrc/runtime/graph.h); this file is the torch.cuda-shaped surface.
from __future__ import annotations

import gc
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree

from openneuron import _C

from .device import _lazy_init, synchronize
from .memory import empty_cache
from .streams import Stream, is_current_stream_capturing
from .streams import stream as _stream_context

__all__ = ["NeuronGraph", "graph", "graph_pool_handle", "make_graphed_callables"]


def graph_pool_handle() -> int:
    """An opaque memory-pool token to share between captures (`graph(..., pool=...)`)."""
    _lazy_init()
    return _C._graph_pool_create()


class NeuronGraph(_C._NeuronGraph):
    """Captured device work, replayed with one launch (torch.cuda.CUDAGraph's counterpart).

    While the current stream captures, the ops queued on it are recorded, not run; `replay()`
    queues them again on the current stream, on the same tensors (the addresses captured):
    refill static inputs with `copy_` before a replay and read the outputs captured. Tensors
    created during the capture come from the graph's private memory pool, reserved until
    `reset()` or the graph's destruction. A capturing stream refuses what cannot be replayed —
    a synchronize, a copy between host and device, a wait on an event recorded outside the
    capture, a random op with its own generator, a collective — with an error naming it, and
    the capture is invalidated. A stream waiting on an event recorded in the capture joins it
    (CUDA's fork and join) until capture_end.
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls)

    def __init__(self, keep_graph: bool = False):
        super().__init__()
        self._keep_graph = keep_graph

    def capture_begin(self, pool: int | None = None, capture_error_mode: str = "global") -> None:
        """Start capturing the current stream's work. `pool`: share memory with the captures
        of that pool (`graph_pool_handle()` or another graph's `pool()`). `capture_error_mode`
        is accepted for torch.cuda's signature; a capture is per stream, whatever the thread."""
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode must be 'global', 'thread_local' or 'relaxed', "
                             f"got {capture_error_mode!r}")
        _lazy_init()
        super().capture_begin(0 if pool is None else int(pool))

    def capture_end(self) -> None:
        """End the capture (raises if an op in it could not be captured)."""
        super().capture_end()

    def instantiate(self) -> None:
        """Nothing to do: a capture is ready to replay when it ends (keep_graph is accepted)."""

    def replay(self) -> None:
        """Queue the captured work on the current stream."""
        super().replay()

    def reset(self) -> None:
        """Drop the captured work and release the graph's hold on its memory pool."""
        super().reset()

    def pool(self) -> int:
        """The graph's memory-pool token (share it with `graph(..., pool=g.pool())`)."""
        return super().pool()

    def enable_debug_mode(self) -> None:
        """Accepted for torch.cuda's API; `debug_dump` lists the captured launches."""

    def debug_dump(self, debug_path: str) -> None:
        with open(debug_path, "w") as f:
            f.write(f"neuron graph: {self.num_items()} captured launches, pool {self.pool()}\n")


class graph:
    """Context manager capturing the neuron work of its body into `neuron_graph`, as
    torch.cuda.graph: synchronizes the device and empties the cache first, makes `stream` (or
    a side stream of its own) current, captures, and restores the stream on exit.

    Warm the body up once outside the capture first (lazy initialization, first-call work),
    exactly as on CUDA.
    """

    default_capture_stream: Stream | None = None

    def __init__(self, neuron_graph: NeuronGraph, pool: int | None = None,
                 stream: torch.Stream | None = None, capture_error_mode: str = "global"):
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = _stream_context(self.capture_stream)
        self.neuron_graph = neuron_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        synchronize()
        gc.collect()
        empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.neuron_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self.neuron_graph.capture_end()
        except RuntimeError:
            if exc_type is None:  # else the body's own error explains the failed capture
                raise
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: int | None = None):
    """torch.cuda.make_graphed_callables on neuron: each callable (a function or an nn.Module)
    becomes one whose forward and backward each replay a graph captured from `sample_args`
    (a tuple of tensors per callable; a tuple of callables takes a tuple of those). Warm-up
    iterations run on a side stream first; forwards are captured in order, backwards in reverse,
    all in one memory pool. Call the result with arguments of the sample's shapes, dtypes and
    order; a module graphed in training mode runs its original forward in eval mode (and the
    other way round). The same limits as on CUDA: no module hooks when graphed, buffers must not
    require grad, no double backward, autocast only with `cache_enabled=False`."""
    if torch.is_autocast_enabled("neuron") and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    flat_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise AssertionError(
                    "Modules must not have hooks registered at the time they are passed. However, "
                    "registering hooks on modules after passing them through "
                    "make_graphed_callables is allowed.")
            if any(b.requires_grad for b in c.buffers()):
                raise AssertionError(
                    "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                    "only parameters may be trainable. All buffers must have "
                    "``requires_grad=False``.")
        leaves = tuple(pytree.arg_tree_leaves(*args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise AssertionError("In the beta API, sample_args for each callable must contain "
                                 "only Tensors. Other types are not allowed.")
        flat_args.append(leaves)
    # A module's graph reads its parameters too: they are part of its static input surface.
    params = [tuple(c.parameters()) if isinstance(c, torch.nn.Module) else () for c in callables]
    surfaces = [a + p for a, p in zip(flat_args, params)]
    pool = graph_pool_handle() if pool is None else pool

    def backward_of(outputs, surface, grad_outputs):
        needs_grad = tuple(o for o in outputs if o.requires_grad)
        if not needs_grad:
            return None
        return torch.autograd.grad(needs_grad, tuple(i for i in surface if i.requires_grad),
                                   grad_outputs=grad_outputs, only_inputs=True,
                                   allow_unused=allow_unused_input)

    synchronize()
    with _stream_context(Stream()):
        for c, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outputs = pytree.tree_leaves(c(*args))
                backward_of(outputs, surface,
                            tuple(torch.empty_like(o) for o in outputs if o.requires_grad))
    synchronize()

    n = len(callables)
    fwd_graphs = [NeuronGraph() for _ in range(n)]
    bwd_graphs = [NeuronGraph() for _ in range(n)]
    static_outputs, specs = [], []
    for c, args, g in zip(callables, sample_args, fwd_graphs):
        with graph(g, pool=pool):
            outputs = c(*args)
        flat, spec = pytree.tree_flatten(outputs)
        static_outputs.append(tuple(flat))
        specs.append(spec)
    # Backwards in reverse order, as they run: replays in one pool never overwrite live memory.
    grad_outputs, grad_inputs = [()] * n, [()] * n
    for i in reversed(range(n)):
        outs = static_outputs[i]
        grad_outputs[i] = tuple(torch.empty_like(o) if o.requires_grad else None for o in outs)
        grads = None
        if any(o.requires_grad for o in outs):
            with graph(bwd_graphs[i], pool=pool):
                grads = backward_of(outs, surfaces[i],
                                    tuple(g for g in grad_outputs[i] if g is not None))
        it = iter(grads or ())
        grad_inputs[i] = tuple(next(it) if grads is not None and x.requires_grad else None
                               for x in surfaces[i])

    results = []
    for i, c in enumerate(callables):
        graphed = _graphed_function(fwd_graphs[i], bwd_graphs[i], params[i], len(flat_args[i]),
                                    specs[i], surfaces[i], static_outputs[i], grad_outputs[i],
                                    grad_inputs[i])
        if isinstance(c, torch.nn.Module):
            c.forward = _graphed_forward(c, c.training, graphed, c.forward)
            results.append(c)
        else:
            results.append(graphed)
    return results[0] if just_one else tuple(results)


def _graphed_function(fwd_graph, bwd_graph, module_params, num_user_args, spec, surface,
                      static_outputs, static_grad_outputs, static_grad_inputs) -> Callable:
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for i in range(num_user_args):  # only user arguments may be new tensors
                if surface[i].data_ptr() != inputs[i].data_ptr():
                    surface[i].copy_(inputs[i])
            fwd_graph.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            for g, grad in zip(static_grad_outputs, grads):
                if g is not None and g.data_ptr() != grad.data_ptr():
                    g.copy_(grad)
            bwd_graph.replay()
            return tuple(b.detach() if b is not None else None for b in static_grad_inputs)

    def functionalized(*user_args):
        out = Graphed.apply(*(tuple(pytree.arg_tree_leaves(*user_args)) + module_params))
        return pytree.tree_unflatten(out, spec)

    return functionalized


def _graphed_forward(module: torch.nn.Module, training: bool, graphed: Callable,
                     original: Callable) -> Callable:
    def forward(*args, **kwargs):
        # The graph holds the training or eval behaviour it was captured in.
        if module.training == training:
            return graphed(*args, **kwargs)
        return original(*args, **kwargs)
    return forward


def _patch_optimizer_capture_check() -> None:
    """torch.optim's check that a captured step() is capturable covers CUDA and XPU only; without
    it, capturing a non-capturable Adam on neuron would bake its step count (a CPU tensor) into
    the graph, silently wrong on every replay. Extended to neuron with torch's message."""
    optimizer = torch.optim.Optimizer
    original = optimizer._accelerator_graph_capture_health_check
    if getattr(original, "_openneuron", False):
        return

    def _accelerator_graph_capture_health_check(self) -> None:
        if (not torch.compiler.is_compiling() and is_current_stream_capturing()
                and not all(group["capturable"] for group in self.param_groups)):
            raise RuntimeError("Attempting NEURON graph capture of step() for an instance of "
                               f"{type(self).__name__} but param_groups' capturable is False.")
        original(self)

    _accelerator_graph_capture_health_check._openneuron = True
    optimizer._accelerator_graph_capture_health_check = _accelerator_graph_capture_health_check


_patch_optimizer_capture_check()
