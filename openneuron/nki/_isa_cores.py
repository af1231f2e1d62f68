"""nisa instructions between the NeuronCores of one launch (kernel[lnc], or any SPMD grid: an
instance is a core, its rank its position in the grid): core_barrier and sendrecv. Each is the
executor's sync point (csrc/nki program.h, kSync): every instance runs up to it, then the
sendrecv data moves, then all go on. Every instance must reach the same sync points in the same
order (checked when the program is built; on the hardware the others would wait forever).
isa.py re-exports them."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._tensor import NkiTensor, view_span
from openneuron.nki._trace import Instr, Operand, fail


def _instances(t) -> int:
    return int(np.prod(t.grid, dtype=np.int64)) if t.grid else 1


def _view(name, what, x) -> NkiTensor:
    """x as [partitions, elements per partition] (an HBM tensor: its first axis and the rest)."""
    if not isinstance(x, NkiTensor):
        fail(f"nisa.{name}: {what} must be a tensor, got {type(x).__name__}")
    if x.dyn is not None or x.ind is not None:
        fail(f"nisa.{name}: {what} is indexed by a run-time value; pass a static view")
    if x.ndim == 2:
        return x
    p = x.shape[0] if x.ndim else 1
    free = int(np.prod(x.shape[1:], dtype=np.int64)) if x.ndim > 1 else 1
    flat = x.as_shape((p, free)) if x.ndim else None
    if flat is None:
        fail(f"nisa.{name}: {what} {list(x.shape)} is not one run of elements per partition; "
             f"copy it into a tile first")
    return flat


def _rank(name, what, v, n) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= int(v) < n:
        fail(f"nisa.{name}: {what} {v!r} is not a rank of this launch of {n} NeuronCore(s) "
             f"(0 to {n - 1})")
    return int(v)


def sendrecv(*args, src=None, dst=None, send_to_rank=None, recv_from_rank=None, pipe_id=0,
             **_):
    """Sends src to core send_to_rank and receives into dst what core recv_from_rank sends
    (its src, converted to dst's dtype), at a point every core of the launch reaches; the two
    must name each other and exchange the same shape. sendrecv(src, dst, send_to_rank,
    recv_from_rank, pipe_id) or by keyword."""
    name = "sendrecv"
    params = ("src", "dst", "send_to_rank", "recv_from_rank", "pipe_id")
    given = dict(zip(params, args))
    for k, v in (("src", src), ("dst", dst), ("send_to_rank", send_to_rank),
                 ("recv_from_rank", recv_from_rank)):
        if v is not None:
            given[k] = v
    missing = [k for k in params[:4] if given.get(k) is None]
    if missing:
        fail(f"nisa.{name}: missing {', '.join(missing)}")
    t = _trace.current()
    n = _instances(t)
    to = _rank(name, "send_to_rank", given["send_to_rank"], n)
    frm = _rank(name, "recv_from_rank", given["recv_from_rank"], n)
    s = _view(name, "src", given["src"])
    d = _view(name, "dst", given["dst"])
    if tuple(s.shape) != tuple(d.shape):
        fail(f"nisa.{name}: src {list(given['src'].shape)} and dst {list(given['dst'].shape)} "
             f"differ; the cores exchange tensors of one shape")
    for what, x in (("src", s), ("dst", d)):
        lo, hi = view_span(x)
        if lo < 0 or hi >= x._buf.numel:
            fail(f"nisa.{name}: {what} {x!r} lies outside its tensor {list(x._buf.shape)}")
    _emit._touch_read(s._buf)
    _emit._touch_write(d._buf, False)
    dop = Operand(0, d._buf.dtype, d._buf.id, d.offset, d.strides)
    sop = Operand(0, s._buf.dtype, s._buf.id, s.offset, s.strides)
    instr = Instr(7, list(s.shape), dop, [sop], line=t.line())
    instr.extra = (to, frm)
    t.add(instr)


def core_barrier(*args, data=None, cores=None, **_):
    """Every core in `cores` waits here until all have arrived (the writes to `data` before it
    are seen by all after it). With one NeuronCore there is nothing to wait for; across a launch
    every core must take part."""
    name = "core_barrier"
    if data is None and args:
        data, args = args[0], args[1:]
    if cores is None and args:
        cores = args[0]
    t = _trace.current()
    n = _instances(t)
    if not isinstance(data, NkiTensor):
        fail(f"nisa.{name}: data must be a tensor, got {type(data).__name__}")
    named = sorted(int(c) for c in (cores if cores is not None else range(n)))
    if n == 1:
        return  # one NeuronCore: every core named has arrived
    if named != list(range(n)):
        fail(f"nisa.{name}: cores {tuple(named)} in a launch of {n} NeuronCores; a barrier here "
             f"spans all of them ({tuple(range(n))})")
    dop = Operand(0, data._buf.dtype, data._buf.id, data.offset, [0, 0])
    instr = Instr(7, [1, 1], dop, [], line=t.line())
    instr.extra = (-1, -1)
    t.add(instr)
