"""A jitted NKI kernel: traced once per (grid, argument shapes and dtypes, constant arguments)
into an executable program (bounded LRU cache), then launched: on neuron tensors queued on the
current stream (asynchronous, like any op), on numpy arrays or CPU tensors run synchronously
(results as numpy / CPU tensors, as NKI's simulator returns). Tracing itself is _trace.py."""

from __future__ import annotations

import collections
import dataclasses
import inspect
import itertools
import pickle
import time

import numpy as np

from openneuron.nki import _control, _emit, _trace
from openneuron.nki._tensor import NkiTensor, numpy_dtype
from openneuron.nki._trace import NkiError, Trace

CACHE_SIZE = 64

_TORCH_NAMES = {"float8_e4m3": "float8_e4m3fn"}


def _torch():
    import torch
    return torch


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or _is_tensor(x)


def _arg_dtype(x) -> str:
    return _trace.dtype_name(x.dtype)


def _value_key(a):
    """A hashable key of an unhashable constant's value, or None."""
    try:
        hash(a)
        return (type(a), a)
    except TypeError:
        pass
    if isinstance(a, np.ndarray):
        return (np.ndarray, a.shape, a.dtype.str, a.tobytes())
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        items = [(f.name, getattr(a, f.name)) for f in dataclasses.fields(a)]
    elif isinstance(a, dict):
        items = sorted(a.items(), key=repr)
    elif isinstance(a, (list, tuple, set)):
        items = list(enumerate(sorted(a, key=repr) if isinstance(a, set) else a))
    else:
        try:
            return (type(a), pickle.dumps(a))
        except (pickle.PicklingError, TypeError, AttributeError):
            return None
    keys = [(k, _value_key(v)) for k, v in items]
    return None if any(v is None for _, v in keys) else (type(a), tuple(keys))


class Traced:
    """A kernel specialized to one signature: the program, its outputs and which inputs it
    writes."""

    def __init__(self, name, program, out_specs, out_structure, written_inputs, input_outputs,
                 n_inputs, traces):
        self.name = name
        self.program = program
        self.out_specs = out_specs  # [(shape, dtype name)]
        self.out_structure = out_structure  # "none" | "single" | "tuple" | "list"
        self.written_inputs = written_inputs  # indices of array arguments the kernel writes
        self.input_outputs = input_outputs  # output position -> array argument index (or None)
        self.n_inputs = n_inputs
        self.sbuf_peak = max(t.sbuf_peak for t in traces)
        self.psum_peak = max(t.psum_peak for t in traces)
        self.lines = None

    @property
    def n_instructions(self) -> int:
        return self.program.n_instrs

    def pack(self, outs):
        if self.out_structure == "none":
            return None
        if self.out_structure == "single":
            return outs[0]
        return tuple(outs) if self.out_structure == "tuple" else list(outs)


def _trace_kernel(func, name, args, kwargs, grid) -> Traced:
    arrays = [i for i, a in enumerate(args) if _is_array(a)]
    lines, line_index = [], {}
    buffer_ids = itertools.count()
    grid = tuple(grid)
    instances = list(itertools.product(*[range(g) for g in grid])) if grid else [()]
    traces, results = [], []
    input_ids = None
    for pids in instances:
        t = Trace(name, pids, grid, lines, line_index, buffer_ids)
        _trace._local.trace = t
        try:
            targs = list(args)
            ids = []
            for i in arrays:
                shape = tuple(int(s) for s in args[i].shape)
                buf = _trace.Buffer(t, "hbm", shape, _arg_dtype(args[i]), "input")
                ids.append(buf.id)
                targs[i] = NkiTensor(buf)
            # every instance sees the same input buffers
            if input_ids is None:
                input_ids = ids
            else:
                remap = dict(zip(ids, input_ids))
                for i, new in zip(arrays, ids):
                    targs[i]._buf.id = remap[new]
                    t.buffers[remap[new]] = t.buffers.pop(new)
            keep = [targs[i]._buf for i in arrays]
            result = func(*targs, **kwargs)
            _control.check_closed(t)
            t.check_capacity()
        finally:
            _trace._local.trace = None
        t.keep = keep
        traces.append(t)
        results.append(result)
    return _finish(name, traces, results, input_ids, arrays, lines)


def _flatten(result):
    if result is None:
        return "none", []
    if isinstance(result, NkiTensor):
        return "single", [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, NkiTensor) for r in result):
        return ("tuple" if isinstance(result, tuple) else "list"), list(result)
    raise NkiError(f"a kernel returns HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)), a "
                   f"tuple/list of them, or None; got {type(result).__name__}")


def _whole_view_shape(name, o) -> tuple:
    """The shape a returned tensor has: its buffer's, or a reshape of all of it
    (`return out.reshape(shape)`); a part of a buffer is not a result."""
    whole = NkiTensor(o._buf, 0, o._buf.shape)
    if o.offset != 0 or o.size != whole.size or o.ind is not None or o.dyn is not None or \
            NkiTensor(o._buf, 0, o.shape).strides != o.strides:
        raise NkiError(f"kernel '{name}' returns {o!r}, a part of the tensor "
                       f"{list(o._buf.shape)}; return the whole tensor or a reshape of it")
    return tuple(o.shape)


def _finish(name, traces, results, input_ids, arrays, lines) -> Traced:
    structure, outs0 = _flatten(results[0])
    # Outputs are identified by allocation order, so every instance writes the same buffers
    # (a shared_hbm output is one buffer for the whole grid).
    out_slots, input_outputs, out_specs = [], [], []
    t0 = traces[0]
    for o in outs0:
        if o._buf.role == "const":
            raise NkiError(f"kernel '{name}' returns an nl.shared_constant; return a tensor "
                           f"of its own (nl.ndarray(..., buffer=nl.shared_hbm))")
        if o._buf.kind != "hbm":
            raise NkiError(f"kernel '{name}' returns an on-chip tile {o!r}; store it into an "
                           f"HBM tensor (nl.ndarray(..., buffer=nl.shared_hbm)) and return that")
        if o._buf.id in input_ids:
            input_outputs.append(input_ids.index(o._buf.id))
            out_slots.append(None)
        else:
            input_outputs.append(None)
            out_slots.append(t0.hbm_allocs.index(o._buf.id))
        out_specs.append((_whole_view_shape(name, o), o._buf.dtype))
    # nl.shared_constant tensors: hidden inputs after the arguments, the same per instance
    consts = [data for _, data in t0.constants]
    for t in traces:
        if len(t.constants) != len(consts) or any(
                not np.array_equal(d, c) for (_, d), c in zip(t.constants, consts)):
            raise NkiError(f"kernel '{name}': grid instances make different nl.shared_constant "
                           f"tensors")
    n_args = len(input_ids)
    input_ids = input_ids + [bid for bid, _ in t0.constants]
    n_in = len(input_ids)
    slots = {bid: i for i, bid in enumerate(input_ids)}
    new_outputs = [k for k in out_slots if k is not None]
    per_instance_slots = []
    for t, res in zip(traces, results):
        s, outs = _flatten(res)
        if s != structure or len(outs) != len(outs0):
            raise NkiError(f"kernel '{name}': grid instances return different outputs")
        m = dict(slots)
        for j, (bid, _) in enumerate(t.constants):
            m[bid] = n_args + j
        for j, k in enumerate(new_outputs):
            m[t.hbm_allocs[k]] = n_in + j
        if len(t.prints) != len(t0.prints):
            raise NkiError(f"kernel '{name}': grid instances make different nl.device_print "
                           f"calls")
        for j, (bid, _) in enumerate(t.prints):  # one buffer for the grid, a row each
            m[bid] = n_in + len(new_outputs) + j
        # HBM scratch: after the tiles in this instance's arena
        end = t.layout()
        for bid in t.hbm_allocs:
            if bid not in m:
                info = t.buffers[bid]
                info[4] = end
                end += (_buf_bytes(info) + 63) // 64 * 64
        t.arena_bytes = end
        per_instance_slots.append(m)
    # slot sizes: inputs and outputs from their shapes
    sizes = []
    for bid in input_ids:
        sizes.append(_buf_bytes(t0.buffers[bid]))
    for k in new_outputs:
        sizes.append(_buf_bytes(t0.buffers[t0.hbm_allocs[k]]))
    for bid, _ in t0.prints:
        sizes.append(_buf_bytes(t0.buffers[bid]))
    arena = max(t.arena_bytes for t in traces)
    sizes.append(max(arena, 64))
    arena_slot = len(sizes) - 1
    # instructions of every instance with its own slot map
    words = [_trace._MAGIC, len(sizes), *sizes, len(traces)]
    for t, m in zip(traces, per_instance_slots):
        enc = _trace.encode([t], m, sizes, arena_slot)
        words += list(enc[3 + len(sizes):])  # drop the header, keep this instance
    from openneuron import _C
    program = _C._NkiProgram(np.asarray(words, dtype=np.int64), name, list(lines))
    written = sorted({slots[i.dst.buf] for t in traces for i in t.instrs
                      if i.enabled and i.dst.buf in slots and not _barrier(i)})
    if written and written[-1] >= n_args:
        where = next(t.lines[i.line] for t in traces for i in t.instrs
                     if i.enabled and slots.get(i.dst.buf, -1) >= n_args and not _barrier(i))
        raise NkiError(f"{where}: in kernel '{name}': an nl.shared_constant is read-only")
    for t in traces:
        t.active = False
    traced = Traced(name, program, out_specs, structure, [arrays[i] for i in written],
                    [arrays[i] if i is not None else None for i in input_outputs], n_in, traces)
    traced.out_dtypes_index = new_outputs
    traced.constants = consts
    traced.prints = [(t0.buffers[bid][1], tuple(t0.buffers[bid][5]), prefix)
                     for bid, prefix in t0.prints]  # (dtype, shape, prefix)
    traced.grid = tuple(traces[0].grid)
    traced.device_constants = {}  # device -> the constants as tensors there
    traced.arrays = arrays
    traced.lines = list(lines)
    return traced


def _barrier(i) -> bool:
    """nisa.core_barrier's instruction: it names its data, it does not write it."""
    return i.kind == 7 and i.extra[0] < 0


def _buf_bytes(info) -> int:
    return info[2]


class BenchmarkResult:
    """Latencies of a benchmark run, as NKI's `benchmark_result.nc_latency`."""

    def __init__(self, latencies_us):
        self.nc_latency = self
        self.latencies_us = sorted(latencies_us)

    def get_latency_percentile(self, p: int) -> float:
        return float(np.percentile(self.latencies_us, p))


class Kernel:
    """@nki.jit: call it like a function; kernel[g0, g1](...) launches an SPMD grid."""

    def __init__(self, func, mode="auto", grid=(), cache=None, warmup=2, iters=10, **options):
        self.func = func
        self.mode = mode
        self.grid = tuple(grid)
        self.options = options
        self.warmup, self.iters = warmup, iters
        self._cache = cache if cache is not None else collections.OrderedDict()
        self.benchmark_result = None
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__doc__ = getattr(func, "__doc__", None)
        self.__wrapped__ = func

    def __repr__(self):
        return f"<nki kernel {self.__name__} grid={list(self.grid)} mode={self.mode}>"

    def __getitem__(self, grid):
        grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
        if not grid or any(g < 1 for g in grid):
            raise NkiError(f"kernel '{self.__name__}': launch grid {list(grid)} has no "
                           f"instances; every dimension must be at least 1")
        return Kernel(self.func, self.mode, grid, self._cache,
                      self.warmup, self.iters, **self.options)

    def _positional(self, args, kwargs):
        """Arrays passed by keyword (`kernel(x, imm0=arr)`) become positional, so every array
        argument is a kernel input found by position (defaults filled in for any gap)."""
        if not any(_is_array(v) for v in kwargs.values()):
            return args, kwargs
        try:
            bound = inspect.signature(self.func).bind(*args, **kwargs)
        except TypeError as err:
            raise NkiError(f"kernel '{self.__name__}': {err}") from None
        bound.apply_defaults()
        if any(_is_array(v) for v in bound.kwargs.values()):
            raise NkiError(f"kernel '{self.__name__}': pass array arguments as positional or "
                           f"positional-or-keyword parameters, not keyword-only ones")
        return bound.args, bound.kwargs

    def specialize(self, *args, **kwargs) -> Traced:
        """The traced program for these arguments (traced now unless cached)."""
        args, kwargs = self._positional(args, kwargs)
        key = self._key(args, kwargs)
        traced = self._cache.get(key)
        if traced is None:
            traced = _trace_kernel(self.func, self.__name__, args, kwargs, self.grid)
            self._cache[key] = traced
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return traced

    def _key(self, args, kwargs):
        def sig(a):
            if _is_array(a):
                return ("array", tuple(int(s) for s in a.shape), _arg_dtype(a))
            try:
                hash(a)
            except TypeError:  # a config object (nki-library's dataclasses), a list: by value
                key = _value_key(a)
                if key is None:
                    raise NkiError(f"kernel '{self.__name__}': argument {a!r} is neither an "
                                   f"array nor a constant (hashable, a dataclass, a list, a "
                                   f"dict or picklable)") from None
                return ("value", key)
            return ("const", type(a).__name__, a)

        return (self.grid, tuple(sig(a) for a in args),
                tuple(sorted((k, sig(v)) for k, v in kwargs.items())))

    def __call__(self, *args, **kwargs):
        args, kwargs = self._positional(args, kwargs)
        if self.mode == "trace":
            return self.specialize(*args, **kwargs)
        if self.mode == "benchmark":
            return self._benchmark(args, kwargs)
        return launch(self.specialize(*args, **kwargs), args)

    def _benchmark(self, args, kwargs):
        traced = self.specialize(*args, **kwargs)
        for _ in range(self.warmup):
            out = launch(traced, args)
        lat = []
        for _ in range(self.iters):
            t0 = time.perf_counter()
            out = launch(traced, args)
            _sync(args)
            lat.append((time.perf_counter() - t0) * 1e6)
        self.benchmark_result = BenchmarkResult(lat)
        return out


def _sync(args):
    for a in args:
        if _is_tensor(a) and a.device.type != "cpu":
            _torch().neuron.synchronize(a.device)
            return


def launch(traced: Traced, args):
    arrays = [args[i] for i in traced.arrays]
    tensors = [a for a in arrays if _is_tensor(a)]
    if tensors and any(t.device.type != "cpu" for t in tensors):
        return _launch_device(traced, args, arrays)
    return _launch_host(traced, args, arrays)


def _launch_device(traced, args, arrays):
    torch = _torch()
    if not all(_is_tensor(a) and a.device.type == "neuron" for a in arrays):
        raise NkiError(f"kernel '{traced.name}': mix of neuron tensors and other arrays; pass "
                       f"every array argument as a neuron tensor")
    device = arrays[0].device
    ins = [a if a.is_contiguous() else a.contiguous() for a in arrays]
    if traced.constants:
        consts = traced.device_constants.get(device)
        if consts is None:
            consts = traced.device_constants[device] = [_as_tensor(c).to(device)
                                                        for c in traced.constants]
        ins = ins + consts
    new = [torch.empty(shape, dtype=_torch_dtype(dt), device=device)
           for (shape, dt), src in zip(traced.out_specs, traced.input_outputs) if src is None]
    prints = [torch.empty(shape, dtype=_torch_dtype(dt), device=device)
              for dt, shape, _ in traced.prints]
    from openneuron import _C
    _C._nki_launch(traced.program, ins + new + prints)
    _print(traced, [p.cpu() for p in prints])  # .cpu() waits for the kernel
    for i, (a, c) in enumerate(zip(arrays, ins)):
        if c is not a and traced.arrays[i] in traced.written_inputs:
            a.copy_(c)
    return traced.pack(_outputs(traced, args, new))


def _outputs(traced, args, new):
    it = iter(new)
    return [next(it) if src is None else _reshaped(args[src], shape)
            for src, (shape, _) in zip(traced.input_outputs, traced.out_specs)]


def _reshaped(array, shape):
    return array if tuple(array.shape) == shape else array.reshape(shape)


def _launch_host(traced, args, arrays):
    torch_in = any(_is_tensor(a) for a in arrays)
    bufs = []
    for a in arrays:
        if _is_tensor(a):
            bufs.append(a if a.is_contiguous() else a.contiguous())
        else:
            bufs.append(np.ascontiguousarray(a))
    consts = list(traced.constants)  # host memory as they are
    if torch_in:
        torch = _torch()
        new = [torch.empty(shape, dtype=_torch_dtype(dt))
               for (shape, dt), src in zip(traced.out_specs, traced.input_outputs) if src is None]
    else:
        new = []
        for (shape, dt), src in zip(traced.out_specs, traced.input_outputs):
            if src is None:
                npdt = numpy_dtype(dt)
                if npdt is None:
                    raise NkiError(f"kernel '{traced.name}' returns {dt}, which numpy lacks "
                                   f"without the ml_dtypes package; install it, or call the "
                                   f"kernel with torch tensors")
                new.append(np.empty(shape, dtype=npdt))
    prints = [np.empty(shape, dtype=numpy_dtype(dt)) if not torch_in and numpy_dtype(dt)
              else _torch().empty(shape, dtype=_torch_dtype(dt)) for dt, shape, _ in traced.prints]
    addrs, sizes = [], []
    for b in bufs + consts + new + prints:
        if _is_tensor(b):
            addrs.append(b.data_ptr())
            sizes.append(b.numel() * b.element_size())
        else:
            addrs.append(b.ctypes.data)
            sizes.append(b.nbytes)
    from openneuron import _C
    _C._nki_run_host(traced.program, addrs, sizes)
    _print(traced, prints)
    for i, (a, c) in enumerate(zip(arrays, bufs)):
        if c is not a and traced.arrays[i] in traced.written_inputs:
            a[...] = c
    return traced.pack(_outputs(traced, args, new))


def _print(traced, values):
    """nl.device_print's lines: the prefix and the values, one line per grid instance."""
    for (_, _, prefix), v in zip(traced.prints, values):
        v = v.float().numpy() if _is_tensor(v) else v
        for i, row in enumerate(v):
            pid = ", ".join(str(int(j)) for j in np.unravel_index(i, traced.grid))
            where = f" [program {pid}]" if traced.grid else ""
            print(f"{prefix}{where} {np.array2string(np.asarray(row))}", flush=True)


def _as_tensor(array):
    """A numpy array (ml_dtypes' bfloat16 / float8 included) as a CPU tensor of its bits."""
    torch = _torch()
    flat = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy())
    return flat.view(_torch_dtype(_trace.dtype_name(array.dtype))).reshape(array.shape)


def _torch_dtype(name):
    torch = _torch()
    return getattr(torch, _TORCH_NAMES.get(name, name))


def trace_outputs(traced: Traced):
    """(shape, dtype name) of each result: what a fake implementation returns."""
    return list(traced.out_specs)


__all__ = ["Kernel", "Traced", "_emit", "launch"]
