"""`mode="reduce-overhead"` on neuron: each compiled graph captured once per input signature into
a torch.neuron.NeuronGraph and then replayed with one launch, as Inductor does with CUDA graphs.

Installed as Inductor's `cudagraph_policy` (its hook for how a compiled graph is wrapped), with
Inductor's own checks deciding which graphs qualify (CPU tensors, incompatible ops, symbolic
shapes under its settings): only the device test is widened to accept one neuron device. Per
compiled graph and input signature: the first call runs as compiled (warm-up), the second
captures and replays, later calls copy their non-static inputs into the captured ones and
replay. Parameters and buffers (Inductor's static inputs) are used in place; an input whose
address changes is captured again. Outputs made by the graph are returned as copies (a replay
writes the captured ones again); outputs that alias inputs are returned as those inputs (views
of the caller's tensors).
A graph that cannot be captured (a random op, a host sync) runs as compiled, logged once.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from openneuron import _C

log = logging.getLogger("openneuron.compile")

# Captures held per compiled graph (input signatures); further signatures run as compiled: each
# capture holds its own memory.
MAX_CAPTURES = 8
# Replays after which a static input that moves is taken to move once in a while (captured
# again) rather than on every call (then copied in, like a non-static input).
_SETTLED = 3

_stats = {"captures": 0, "replays": 0, "uncaptured_calls": 0, "failed_captures": 0}


def stats() -> dict[str, int]:
    """Counters since the process started (or reset_stats()): graphs captured, replays, calls
    that ran as compiled because a graph could not or would no longer be captured, captures
    that failed."""
    return dict(_stats)


def reset_stats() -> None:
    for k in _stats:
        _stats[k] = 0


class _Capture:
    __slots__ = ("clone", "graph", "inputs", "outputs", "replays", "static_ptrs")

    def __init__(self, graph, inputs, static_ptrs, outputs, clone):
        self.graph = graph
        self.inputs = inputs            # the captured inputs: static ones and our copies
        self.static_ptrs = static_ptrs  # data pointers of the static inputs when captured
        self.outputs = outputs
        # per output: True made by the graph (returned as a copy), False returned as captured
        # (a static input or a view of one), else (input, size, stride, offset): a view of the
        # caller's input
        self.clone = clone
        self.replays = 0


class NeuronGraphed:
    """A compiled graph (Inductor's boxed callable) replayed from neuron graphs."""

    def __init__(self, model: Callable[[list], Any], static_input_idxs: Sequence[int],
                 mutated_input_idxs: Sequence[int], what: str):
        self.model = model
        self.static_idxs = frozenset(static_input_idxs)
        self.mutated_idxs = tuple(mutated_input_idxs)
        self.what = what
        self.warmed: set = set()        # signatures called once (the next call captures)
        self.uncaptured: set = set()    # signatures that run as compiled
        self.captures: dict[tuple, _Capture] = {}
        self.pool: int | None = None
        self.tensor_idxs: list[int] | None = None

    def _layout(self, inputs: list) -> None:
        self.tensor_idxs = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
        self.static_tensor_idxs = [i for i in self.tensor_idxs if i in self.static_idxs]
        self.copied_idxs = [i for i in self.tensor_idxs if i not in self.static_idxs]
        self.other_idxs = [i for i, t in enumerate(inputs) if not isinstance(t, torch.Tensor)]
        self.copied_set = frozenset(self.copied_idxs)
        self.copied_mutated = [i for i in self.mutated_idxs if i in self.copied_set]

    def _key(self, inputs: list) -> tuple:
        return (tuple((inputs[i].shape, inputs[i].stride()) for i in self.copied_idxs),
                tuple(inputs[i] for i in self.other_idxs))

    def __call__(self, inputs: list) -> Any:
        if self.tensor_idxs is None:
            self._layout(inputs)
        key = self._key(inputs)
        cap = self.captures.get(key)
        if cap is not None and _C._inductor_data_ptrs_equal(inputs, self.static_tensor_idxs,
                                                            cap.static_ptrs):
            return self._replay(cap, inputs)
        if key in self.uncaptured:
            _stats["uncaptured_calls"] += 1
            return self.model(inputs)
        if key not in self.warmed:  # the first call of a signature runs as compiled
            if len(self.warmed) >= 4 * MAX_CAPTURES:
                self.warmed.clear()
            self.warmed.add(key)
            return self.model(inputs)
        if cap is not None:
            del self.captures[key]
            cap.graph.reset()
            moved = {i for i, p in zip(self.static_tensor_idxs, cap.static_ptrs)
                     if inputs[i].data_ptr() != p}
            if cap.replays < _SETTLED:
                # Moved right after their capture (a backward's inputs made by a replayed
                # forward, which are copies): copied in like the others from now on.
                log.info("openneuron: %s: static inputs %s move between calls; copied in from "
                         "now on", self.what, sorted(moved))
                self.static_idxs = self.static_idxs - moved
                self._layout(inputs)
                key = self._key(inputs)
                for old in self.captures.values():
                    old.graph.reset()
                self.captures.clear()
            # else: moved once in a while (a new KV cache per generate()): captured again
        cap = self._capture(inputs) if len(self.captures) < MAX_CAPTURES else None
        if cap is None:
            if len(self.captures) >= MAX_CAPTURES and not self.uncaptured:
                log.info("openneuron: %s: %d neuron graphs captured, the limit; new input "
                         "signatures run as compiled", self.what, MAX_CAPTURES)
            if len(self.uncaptured) < 4 * MAX_CAPTURES:
                self.uncaptured.add(key)
            _stats["uncaptured_calls"] += 1
            return self.model(inputs)
        self.captures[key] = cap
        return self._finish(cap, inputs)

    def _capture(self, inputs: list) -> _Capture | None:
        from torch._inductor.output_code import get_expanded_dims

        from openneuron.neuron.graphs import NeuronGraph, graph_pool_handle

        if self.pool is None:
            self.pool = graph_pool_handle()
        captured = list(inputs)
        for i in self.copied_idxs:
            t = inputs[i]
            c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
            _copy_into(c, t, get_expanded_dims(t))
            captured[i] = c
        g = NeuronGraph()
        try:
            g.capture_begin(pool=self.pool)
            try:
                outputs = self.model(list(captured))
            except BaseException:
                try:
                    g.capture_end()
                except RuntimeError:
                    pass
                raise
            g.capture_end()
        except RuntimeError as err:
            _stats["failed_captures"] += 1
            log.warning("openneuron: %s runs without a neuron graph (mode='reduce-overhead'): "
                        "%s", self.what, err)
            return None
        # Per output: made by the graph (None: returned as a copy), or the input it aliases
        # and how (returned as that view of the caller's input).
        storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(captured)
                    if isinstance(t, torch.Tensor)}
        clone = []
        for o in outputs:
            i = (storages.get(o.untyped_storage().data_ptr())
                 if isinstance(o, torch.Tensor) else None)
            if i is None or i not in self.copied_set:
                clone.append(isinstance(o, torch.Tensor) and i is None)
            else:
                clone.append((i, tuple(o.size()), tuple(o.stride()), o.storage_offset()))
        _stats["captures"] += 1
        static_ptrs = [inputs[i].data_ptr() for i in self.static_tensor_idxs]
        return _Capture(g, captured, static_ptrs, outputs, clone)

    def _finish(self, cap: _Capture, inputs: list) -> list:
        """Replays cap (its inputs already filled) and returns the caller's outputs."""
        cap.graph.replay()
        cap.replays += 1
        _stats["replays"] += 1
        for i in self.copied_mutated:
            inputs[i].copy_(cap.inputs[i])
        outputs = []
        for o, how in zip(cap.outputs, cap.clone):
            if how is True:
                o = o.clone()
            elif how is not False:
                i, size, stride, offset = how
                o = inputs[i].as_strided(size, stride, inputs[i].storage_offset() + offset)
            outputs.append(o)
        inputs.clear()
        return outputs

    def _replay(self, cap: _Capture, inputs: list) -> list:
        for i in self.copied_idxs:
            dst = cap.inputs[i]
            src = inputs[i]
            if dst.data_ptr() != src.data_ptr():
                _copy_into(dst, src, None)
        return self._finish(cap, inputs)


def _copy_into(dst: torch.Tensor, src: torch.Tensor, expanded: list[int] | None) -> None:
    """dst.copy_(src) for same-layout tensors, stride-0 (expanded) dims copied once."""
    if expanded is None:
        from torch._inductor.output_code import get_expanded_dims

        expanded = get_expanded_dims(src)
    if expanded:
        from torch._inductor.compile_fx import index_expanded_dims_and_copy_

        index_expanded_dims_and_copy_(dst, src, expanded)
    else:
        dst.copy_(src)


def _is_neuron_graph(example_inputs: Sequence[Any]) -> bool:
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    return "neuron" in devices and "cuda" not in devices


@functools.cache
def _policy_class():
    from torch._inductor.cudagraph_utils import CUDAGraphPolicy

    class NeuronGraphPolicy(CUDAGraphPolicy):
        """Neuron graphs for neuron compiled graphs; CUDA's default for anything else."""

        def cudagraphify(self, model, example_inputs, static_input_idxs, *, device_index,
                         is_backward, is_inference, **kwargs):
            if not _is_neuron_graph(example_inputs):
                return super().cudagraphify(model, example_inputs, static_input_idxs,
                                            device_index=device_index, is_backward=is_backward,
                                            is_inference=is_inference, **kwargs)
            what = ("the backward graph" if is_backward else
                    "the inference graph" if is_inference else "the forward graph")
            return NeuronGraphed(model, static_input_idxs,
                                 kwargs.get("mutated_input_idxs", ()), what)

    return NeuronGraphPolicy


def install() -> None:
    """Inductor's graph policy and device check for neuron. Idempotent."""
    from torch._inductor import config, cudagraph_utils, output_code

    if config.cudagraph_policy is None:
        config.cudagraph_policy = _policy_class()()
    check = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    if not getattr(check, "_openneuron", False):
        @functools.wraps(check)
        def check_devices(device_node_mapping):
            devices = [d for d in device_node_mapping if d.type != "meta"]
            if len(devices) == 1 and devices[0].type == "neuron":
                return None
            return check(device_node_mapping)

        check_devices._openneuron = True
        cudagraph_utils.check_multiple_devices_or_any_cpu_nodes = check_devices
    skipped = output_code.maybe_handle_backward_generation
    if not getattr(skipped, "_openneuron", False):
        @functools.wraps(skipped)
        def maybe_handle_backward_generation(compiled_graph, boxed_forward_device_index):
            # A neuron graph that does not qualify: say why (Inductor logs CUDA's only); no
            # CUDA graph tree manager exists to tell about a backward.
            if "neuron" not in compiled_graph.device_types:
                return skipped(compiled_graph, boxed_forward_device_index)
            info = compiled_graph.cudagraph_info
            reasons = compiled_graph.disabled_cudagraphs_reason or (
                info.cudagraph_fail_reasons if info is not None else None)
            log.info("openneuron: mode='reduce-overhead': a graph runs without a neuron graph: "
                     "%s", reasons)

        maybe_handle_backward_generation._openneuron = True
        output_code.maybe_handle_backward_generation = maybe_handle_backward_generation
