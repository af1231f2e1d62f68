"""nisa's searches over each partition's free elements: max8 (the 8 largest values, in order)
and nc_find_index8 (where 8 values first occur), composed of elementwise and reduction
instructions when traced. isa.py re-exports them."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki import language as nl
from openneuron.nki._emit import Expr, emit, new_buffer, reduce_into
from openneuron.nki._tensor import IndexExpr
from openneuron.nki._trace import fail
from openneuron.nki.isa import _dst_first, _flat, _generations, _out


def _rows(t, name, what):
    """t as [partitions, free elements] (a view), 8..16,384 free elements."""
    free = int(np.prod(t.shape[1:], dtype=np.int64)) if t.ndim > 1 else 1
    if not 8 <= free <= 16384:
        fail(f"nisa.{name}: {what} has {free} elements per partition; it must have 8 to 16,384")
    return t if t.ndim == 2 else t.reshape((t.shape[0], free))


def _free_index(p, f):
    """A [p, f] float32 tile of free-axis positions 0..f-1 (the same in every partition)."""
    return nl.copy(IndexExpr((p, f), 0, (0, 1)), dtype=nl.float32)


@_generations(0, two_tiles_is_dst=True)
def max8(src=None, mask=None, dtype=None, dst=None, **_):
    """The 8 largest values of each partition, in descending order ([P, 8]; compared in
    float32; a value present k times fills k places)."""
    if mask is not None:
        fail("nisa.max8: a mask is not supported here; load the masked tile first")
    x = _rows(src, "max8", "src")
    p, f = x.shape
    out = _out(dst, (p, 8), dtype or src.dtype)
    work = nl.copy(x, dtype=nl.float32)
    pos = _free_index(p, f)
    for k in range(8):
        top = nl.max(work, axis=1, keepdims=True)
        out[:, k:k + 1] = top
        if k < 7:  # take out the first place holding it, so repeats fill the next places
            first = nl.min(nl.where(nl.equal(work, top), pos, float(f)), axis=1, keepdims=True)
            work = nl.where(nl.equal(pos, first), -np.inf, work)
    return out


def nc_find_index8(*args, mask=None, dtype=None, **kwargs):
    """The position (flattened free index, from 0) of the first occurrence of each of the 8
    values per partition of `vals` in `data` ([P, 8], uint32 by default or uint16), compared in
    float32; a mask applies to `data` only. Beta 1: nc_find_index8(data=, vals=); 0.x:
    nc_find_index8(dst, data, vals). A value absent from data: 0.x (its documentation) gives
    all ones (0xFFFFFFFF / 0xFFFF); Beta 1 documents it as undefined and gets the number of
    elements per partition, an index out of range."""
    dst, (data, vals) = _dst_first("nc_find_index8", args, kwargs, ("data", "vals"))
    if mask is not None and data.ndim != 2:
        fail(f"nisa.nc_find_index8: a mask needs a 2-D data tile, got {list(data.shape)}")
    x = _rows(data, "nc_find_index8", "data")
    p, f = x.shape
    v = _flat(vals, "nc_find_index8", "vals")
    if v.shape[0] != p or v.shape[1] != 8:
        fail(f"nisa.nc_find_index8: vals {list(vals.shape)} must hold 8 values per partition "
             f"for each of data's {p} partitions")
    dt = dst._buf.dtype if dst is not None else _trace.dtype_name(dtype or "uint32")
    if dt not in ("uint16", "uint32"):
        fail(f"nisa.nc_find_index8: the result is uint16 or uint32, not {dt}")
    out = _flat(_out(dst, (p, 8), dt), "nc_find_index8", "dst")
    if tuple(out.shape) != (p, 8):
        fail(f"nisa.nc_find_index8: dst {list(out.shape)} must be [{p}, 8]")
    found = new_buffer((p, 8), "float32", "sbuf")
    _emit.copy_into(found, float(f))
    position = IndexExpr((p, f), 0, (0, 1))
    for k in range(8):
        e = Expr()
        hit = e.op("equal", e.src(x), e.src(v[:, k:k + 1]))
        first = e.op("select", hit, e.src(position), e.src(float(f)))
        reduce_into(found[:, k:k + 1], (p, f), [1], e, first, "minimum", keepdims=True,
                    mask=mask)
    if dst is None:
        _emit.copy_into(out, found)
        return out
    # 0.x: not found -> all ones (2^32 stores as 0xFFFFFFFF: uint32 saturates, csrc/nki
    # convert.h; 65535 is exact)
    e = Expr()
    missing = e.op("equal", e.src(found), e.src(float(f)))
    ones = 4294967296.0 if dt == "uint32" else 65535.0
    emit(out, (p, 8), e, e.op("select", missing, e.src(ones), e.src(found)))
    return None
