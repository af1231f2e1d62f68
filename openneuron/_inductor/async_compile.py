"""Eager while Inductor compiles (OPENNEURON_COMPILE_ASYNC=1, DESIGN §6).

A cold Inductor compile of a small GPT's training step takes ~16 s on two cores, almost all of it
g++; the step itself takes 50 ms. With this setting a graph Inductor has not compiled before
(an FX-graph cache miss) is handed to a compile process, and until that process is done each
call runs AOTAutograd's graph op by op on the device, as eager mode does: the first step starts
after Dynamo's and AOTAutograd's tracing (~2 s), and the calls switch to the compiled code at
the first call after it is ready. A cache hit is used at once, as without the setting; the
compiled graph is written to the FX-graph cache when the switch happens, so the next process
starts compiled.

The compile process is Inductor's own (`_SubprocessFxCompile`: the graph and its fake inputs go
over a pipe with GraphPickler; the process imports openneuron through the `torch.backends`
entry point). A compile that fails leaves the graph eager with a warning, or raises at the next
call with TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1. At exit a compile still running is
abandoned (its process killed), not waited for.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import time
import warnings
from typing import Any

import torch

log = logging.getLogger("openneuron.compile")

# started / finished / failed background compiles; calls run eagerly / compiled
_stats: collections.Counter = collections.Counter()
_pending: set = set()


def stats() -> dict[str, int]:
    """Counts since the process started: background compiles started, finished and failed,
    and calls of their graphs that ran eagerly and compiled."""
    return {k: _stats[k] for k in ("started", "finished", "failed", "eager_calls",
                                   "compiled_calls")}


def enabled() -> bool:
    from openneuron import _C

    return bool(_C._compile_settings()[2])


class AsyncOutputCode:
    """What AOTAutograd calls for a graph compiling in the background: the graph itself until
    the compile process answers, then Inductor's compiled graph. Boxed calling convention."""

    _fx_graph_cache_key: str | None = None
    _fx_graph_cache_debug_lines: list[str] | None = None
    _time_taken_ns: int | None = None

    def __init__(self, gm, future, callback, name: str) -> None:
        # NOTE: an instance attribute: wrappers (torch._dynamo.disable) copy __dict__ only
        self._boxed_call = True
        self._gm = gm
        self._future = future
        self._callback = callback
        self._name = name
        self._compiled = None
        self._post_compile_args = None
        self._deferred_save = None
        self._started = time.perf_counter()
        _pending.add(future)

    def __call__(self, args):
        if self._future is not None and self._future.done():
            self._switch()
        if self._compiled is None:
            _stats["eager_calls"] += 1
            return self._gm(*args)
        _stats["compiled_calls"] += 1
        return self._compiled(args)

    # OutputCode's interface, as _compile_fx_inner uses it
    def set_triton_bundle(self, triton_bundle: Any) -> None:
        del triton_bundle  # no Triton on neuron

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        # NOTE: applied to the compiled graph when it arrives (it needs the real object)
        self._post_compile_args = (example_inputs, constants, graph_kwargs)

    def prepare_for_serialization(self) -> None:
        raise NotImplementedError("a graph still compiling is never serialized")

    def defer_save(self, save, key, example_inputs, local, shape_env) -> None:
        self._deferred_save = (save, key, example_inputs, local, shape_env)

    def _switch(self) -> None:
        future, self._future = self._future, None
        _pending.discard(future)
        try:
            compiled = self._callback(future.result())
            if self._post_compile_args is not None:
                compiled.post_compile(*self._post_compile_args)
        except Exception as err:  # reported below, or raised
            _stats["failed"] += 1
            from openneuron._dynamo import _fallback_disabled

            if _fallback_disabled():
                raise RuntimeError(
                    f"neuron: the background Inductor compile of {self._name} failed: {err} "
                    "(TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1; unset it to keep running the "
                    "graph eagerly)") from err
            warnings.warn(f"neuron: the background Inductor compile of {self._name} failed; "
                          f"it keeps running eagerly: {err}", RuntimeWarning, stacklevel=3)
            self._post_compile_args = self._deferred_save = None
            return
        _stats["finished"] += 1
        elapsed = time.perf_counter() - self._started
        compiled._fx_graph_cache_key = self._fx_graph_cache_key
        compiled._fx_graph_cache_debug_lines = self._fx_graph_cache_debug_lines
        compiled._time_taken_ns = int(elapsed * 1e9)
        self._save(compiled)
        log.info("neuron: %s switched to Inductor's compiled code after %.1f s in the "
                 "background", self._name, elapsed)
        # boxed, as this object is called: decided once, not per call
        self._compiled = compiled if getattr(compiled, "_boxed_call", False) else \
            (lambda args: compiled(*args))
        self._gm, self._post_compile_args = None, None

    def _save(self, compiled) -> None:
        if self._deferred_save is None:
            return
        save, key, example_inputs, local, shape_env = self._deferred_save
        self._deferred_save = None
        from unittest import mock

        from torch._inductor.codecache import FxGraphCache

        # NOTE: _save_graph reads the shape environment of the compile that produced the
        # graph (its guards) from the tracing context, gone by now: the one saved then.
        with mock.patch.object(FxGraphCache, "_get_shape_env", staticmethod(lambda: shape_env)):
            save(key, compiled, example_inputs, local, None)


def _on_neuron(example_inputs) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in example_inputs)


def _pool_process():
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

    return _SubprocessFxCompile.process_pool()


def _abandon_pending() -> None:
    """At exit: kill the compile process if a compile is still running (instead of the pool's
    shutdown waiting up to 300 s for it)."""
    if not any(not f.done() for f in _pending):
        return
    pool = _pool_process()
    with pool.write_lock:
        if not pool.running:
            return
        pool.running = False
        with contextlib.suppress(Exception):  # best effort at exit
            pool.running_waitcounter.__exit__()
    # NOTE: with its own workers (a process pool of Inductor's): orphans otherwise. Not its
    # multiprocessing resource tracker: once the others are gone it unlinks the semaphores
    # they left in /dev/shm, then exits; waited for here, so none outlives this process.
    trackers, others = [], []
    for pid in _descendants(pool.process.pid):
        (trackers if "resource_tracker" in _cmdline(pid) else others).append(pid)
    for pid in others + [pool.process.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    pool.process.wait(10)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and "resource_tracker" in _cmdline(pid)
              for pid in trackers) and time.monotonic() < deadline:
        time.sleep(0.02)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


_NEURON_OPS = ("torch.ops.openneuron.", "torch.ops.prims.")


def _patch_pickler() -> None:
    """GraphPickler sends only aten/fbgemm ops to a compile process; the child imports
    openneuron (entry point), so openneuron's ops resolve there too."""
    from torch.fx import _graph_pickler as gp

    if getattr(gp.Options, "_openneuron", False):
        return
    safe = gp._ops_filter_safe

    def with_neuron_ops(name: str) -> bool:
        return safe(name) or name.startswith(_NEURON_OPS)

    @dataclasses.dataclass
    class Options(gp.Options):
        ops_filter: Any = with_neuron_ops

    Options._openneuron = True
    gp.Options = Options  # GraphPickler.__init__ looks it up at call time


def patch(compile_fx_module) -> None:
    """Routes neuron graphs that miss the FX-graph cache through a compile process while
    OPENNEURON_COMPILE_ASYNC=1 (read at each compile). Idempotent."""
    original = compile_fx_module.fx_codegen_and_compile
    if getattr(original, "_openneuron", False):
        return
    from torch._inductor.codecache import FxGraphCache

    save_graph = FxGraphCache._save_graph

    def fx_codegen_and_compile(gm, example_inputs, inputs_to_check, compile_region_name=None,
                               **graph_kwargs):
        if (not enabled() or not _on_neuron(example_inputs) or graph_kwargs.get("aot_mode")
                or torch._functorch.config.bundled_autograd_cache):
            return original(gm, example_inputs, inputs_to_check,
                            compile_region_name=compile_region_name, **graph_kwargs)
        from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

        _patch_pickler()
        scheme = _SubprocessFxCompile()
        scheme.compile_region_name = compile_region_name
        serialized = scheme.serialize_compile(gm, example_inputs, inputs_to_check, graph_kwargs)
        if not serialized:  # something in the graph does not pickle: compile here
            log.info("neuron: compiling in this process: the graph does not serialize")
            return original(gm, example_inputs, inputs_to_check,
                            compile_region_name=compile_region_name, **graph_kwargs)
        inputs, constants = serialized
        future = scheme._send_to_child_async(inputs)
        if not _stats["started"]:
            # NOTE: after the pool's own atexit shutdown is registered, so this runs first
            atexit.register(_abandon_pending)
        _stats["started"] += 1

        def callback(pickled):
            output = pickled.deserialize(constants)
            scheme._postprocess(output)
            return output.graph

        kind = "backward" if graph_kwargs.get("is_backward") else "forward"
        name = f"{compile_region_name or 'graph'} ({kind})"
        log.info("neuron: %s runs eagerly while Inductor compiles it in the background", name)
        return AsyncOutputCode(gm, future, callback, name)

    def _save_graph(key, compiled_graph, example_inputs, local, remote_cache):
        if isinstance(compiled_graph, AsyncOutputCode):
            compiled_graph.defer_save(save_graph, key, example_inputs, local,
                                      FxGraphCache._get_shape_env())
            return None
        return save_graph(key, compiled_graph, example_inputs, local, remote_cache)

    fx_codegen_and_compile._openneuron = True
    compile_fx_module.fx_codegen_and_compile = fx_codegen_and_compile
    FxGraphCache._save_graph = staticmethod(_save_graph)
