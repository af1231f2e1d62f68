"""Views indexed by values read when the kernel runs (_tensor.py's index() and NkiTensor.ap()
hand them here): one element of an integer SBUF tile in a tile's subscript (a view's `dyn`,
the executor's dynamic copy), an HBM tensor's rows by a tile of row indices (Beta 1
data[idx_tile, iy], 0.x ap(vector_offset=): a view's `ind`, the executor's indirect copy) and
an access pattern at a run-time scalar_offset (a view's `dyn` over the whole tensor). The
admissible values are worked out here or, over the masked box, in _emit.py."""

from __future__ import annotations

import numpy as np

from openneuron.nki._tensor import (
    DynIndex,
    DynSlice,
    IndexExpr,
    NkiTensor,
    _index_affine,
    dynamic_index,
    index,
    view_span,
)
from openneuron.nki._trace import fail


def _dynamic_key(k):
    if isinstance(k, DynSlice):
        return k.start if isinstance(k.start, DynIndex) else None
    return dynamic_index(k)


def _index_dynamic(t: NkiTensor, key, dyn_axes) -> NkiTensor:
    """t[key] with one axis indexed by a run-time value: the view of its static part (the
    value taken as 0), its bound check on that axis marked ("dyn", axis, coef) so that the
    instruction works out the values that keep it in bounds (_emit.emit), and `dyn`."""
    if len(dyn_axes) > 1:
        fail(f"one run-time index per access (NKI's dynamic offsets are one scalar); axes "
             f"{dyn_axes} of {list(t.shape)} are indexed by run-time values")
    d = dyn_axes[0]
    if t._buf.kind == "hbm":
        fail("a run-time index addresses an SBUF or PSUM tile (nisa.tensor_copy_dynamic_src / "
             "_dst); HBM tensors take static indices here")
    if d == 0:
        fail("a run-time index moves along a free axis: the partition axis (axis 0) of a tile "
             "takes static indices (NKI's dynamic offsets are within each partition)")
    k = key[d]
    if isinstance(k, DynSlice):  # nl.ds(value, size): a slice from the value
        dyn = k.start
        if dyn.coef != 1 or isinstance(dyn.static, IndexExpr):
            fail("nl.ds(start, size) takes a run-time start plus or minus integers only")
        key = list(key)
        key[d] = slice(0, k.size * k.step, k.step)
        view = index(NkiTensor(t._buf, t.offset, t.shape[:d] + (k.size * k.step,) +
                               t.shape[d + 1:], t.strides), tuple(key))
        kept = sum(1 for j in range(d) if not isinstance(key[j], (int, np.integer)))
        coefs = [0] * view.ndim
        coefs[kept] = k.step
        checks = view.checks + ((int(dyn.static), tuple(coefs), t.shape[d], ("dyn", d, 1)),)
        return NkiTensor(t._buf, view.offset + t.strides[d] * dyn.static, view.shape,
                         view.strides, checks, (dyn.value, 1, t.strides[d]))
    dyn = dynamic_index(k)
    marker, key = ("dyn", d, dyn.coef), list(key)
    if isinstance(dyn.static, IndexExpr) or any(isinstance(x, IndexExpr) for x in key):
        key[d] = dyn.static if isinstance(dyn.static, IndexExpr) else \
            IndexExpr((), int(dyn.static), ())
        view = _index_affine(t, key)
        checks = tuple((c, kk, n, marker if ax == d else ax) for c, kk, n, ax in view.checks)
        offset = view.offset
    else:  # value + an integer, among ints and slices: the axis is dropped as by an int
        key[d] = 0
        view = index(t, tuple(key))
        checks = view.checks + ((int(dyn.static), (0,) * view.ndim, t.shape[d], marker),)
        offset = view.offset + t.strides[d] * int(dyn.static)
    return NkiTensor(t._buf, offset, view.shape, view.strides, checks,
                     (dyn.value, dyn.coef, t.strides[d] * dyn.coef))


_INDEX_DTYPES = ("int32", "uint32", "int16", "uint16", "int8", "uint8")


def index_tile(name, idx) -> NkiTensor:
    """The [P] view of a tile of row indices ([P] or [P, 1]: one integer per partition, in
    SBUF), as the DMA's indirect accesses read them."""
    if not isinstance(idx, NkiTensor) or idx._buf.kind != "sbuf" or \
            idx._buf.dtype not in _INDEX_DTYPES:
        got = repr(idx) if isinstance(idx, NkiTensor) else type(idx).__name__
        fail(f"{name}: the row indices must be an integer tile in SBUF (int32 or uint32: load "
             f"them with nl.load or make them with nisa.iota), got {got}")
    if idx.dyn is not None or idx.ind is not None:
        fail(f"{name}: the index tile is itself indexed by a run-time value")
    if idx.ndim < 1 or any(n != 1 for n in idx.shape[1:]):
        fail(f"{name}: an index tile holds one row index per partition ([P] or [P, 1]), got "
             f"{list(idx.shape)}")
    return NkiTensor(idx._buf, idx.offset, idx.shape[:1], idx.strides[:1])


def _index_indirect(t: NkiTensor, key, ind_axes) -> NkiTensor:
    """t[idx_tile, iy] on an HBM tensor: partition p of the view reads row idx_tile[p] of the
    indexed axis (NKI's indirect DMA, Beta 1 nl.load / nl.store / nisa.dma_copy). The view is
    built with arange(P) in the index's place, then that axis's stride is taken out (the
    executor adds index * stride, csrc/nki kIndirect) and its static bound check dropped (each
    index is checked when the kernel runs)."""
    if len(ind_axes) > 1:
        fail(f"one index tile per access; axes {ind_axes} of {list(t.shape)} are indexed by tiles")
    d = ind_axes[0]
    idx = index_tile("indirect access", key[d])
    if any(_dynamic_key(k) is not None for j, k in enumerate(key) if j != d):
        fail("an indirect access takes one index tile and static indices otherwise")
    if any(not isinstance(k, (int, np.integer)) for k in key[:d]):
        fail(f"the index tile indexes axis {d} of {list(t.shape)}: the axes before it take "
             f"integers (the indexed rows become the partition axis)")
    P = idx.shape[0]
    key = list(key)
    if any(isinstance(k, IndexExpr) for k in key):
        g = max([2] + [len(k.shape) for k in key if isinstance(k, IndexExpr)])
        key[d] = IndexExpr((P,) + (1,) * (g - 1), 0, (1,) + (0,) * (g - 1))
        view = _index_affine(NkiTensor(t._buf, t.offset, t.shape[:d] + (P,) + t.shape[d + 1:],
                                       t.strides), key)
        checks = tuple(c for c in view.checks if c[3] != d)
    else:
        key[d] = slice(None)
        view = index(NkiTensor(t._buf, t.offset, t.shape[:d] + (P,) + t.shape[d + 1:],
                               t.strides), tuple(key))
        checks = view.checks
    if not view.shape or view.shape[0] != P:
        fail(f"internal: indirect view {list(view.shape)} does not start with the {P} indices")
    strides = (view.strides[0] - t.strides[d],) + tuple(view.strides[1:])
    return NkiTensor(t._buf, view.offset, view.shape, strides, checks,
                     ind=(idx, t.strides[d], 0, t.shape[d] - 1))


def _ap_scalar_offset(t: NkiTensor, strides, shape, offset, value, indirect_dim) -> NkiTensor:
    """t.ap(pattern, offset, scalar_offset=value, indirect_dim=d): the pattern moved value
    steps of t's axis d. A run-time value makes the view's `dyn` (csrc/nki program.h,
    kDynamicCopy, scalar-offset mode) with a bound check over the tensor's elements, from which
    _emit works out the values that keep the pattern inside the tensor."""
    if not 0 <= indirect_dim < max(t.ndim, 1):
        fail(f"ap(scalar_offset=..., indirect_dim={indirect_dim}): the tensor {list(t.shape)} has "
             f"{t.ndim} axes")
    scale = t.strides[indirect_dim] if t.ndim else 1
    start = t.offset + offset
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return NkiTensor(t._buf, start + scale * int(value), shape, strides)
    dyn = dynamic_index(value)
    if dyn is None:
        fail(f"ap(scalar_offset=...) takes a register, a one-element integer SBUF tile or an "
             f"integer, got {type(value).__name__}")
    if isinstance(dyn.static, IndexExpr):
        fail("ap(scalar_offset=...): a run-time value plus or minus integers only")
    start += scale * int(dyn.static)
    scale *= dyn.coef
    if scale == 0:  # the axis does not move: the value changes nothing
        return NkiTensor(t._buf, start, shape, strides)
    check = (start, tuple(strides), t._buf.numel, ("dyn", indirect_dim, scale))
    return NkiTensor(t._buf, start, shape, strides, (check,), (dyn.value, 1, scale, True))


def _ap_indirect(t: NkiTensor, strides, shape, offset, idx, indirect_dim) -> NkiTensor:
    """t.ap(pattern, vector_offset=idx, indirect_dim=0): the 0.x spelling of an indirect
    access (see _index_indirect): partition p at row idx[p] of the first axis, in place of the
    first pair's step; the rows admitted being those that keep the whole pattern in the
    tensor."""
    if t._buf.kind != "hbm":
        fail("ap(vector_offset=...): the tensor indexed by row indices must be in HBM")
    if isinstance(idx, NkiTensor) and idx.ndim > 2 and idx.size == idx.shape[0]:
        column = idx.as_shape((idx.shape[0], 1))  # [P, 1, 1]: one index per partition
        idx = column if column is not None else idx
    if not isinstance(idx, NkiTensor) or idx._buf.kind != "sbuf" or \
            idx._buf.dtype not in _INDEX_DTYPES or idx.ndim != 2:
        got = repr(idx) if isinstance(idx, NkiTensor) else type(idx).__name__
        fail(f"ap(vector_offset=...) takes a 2-D integer SBUF tile of row indices ([P, 1], "
             f"int32 or uint32), got {got}")
    if indirect_dim != 0:
        fail(f"ap(vector_offset=..., indirect_dim={indirect_dim}): only indirect_dim=0 (rows "
             f"of the tensor's first axis) is supported")
    full = t.shape  # the rows of this view (a reshape of the tensor: nki-library's 1-D views)
    scale = t.strides[0] if full else 1
    if not shape:
        fail("ap(vector_offset=...): the pattern needs a first (partition) pair")
    # NOTE: the index replaces the first pair's step (nki-library's router_topk scatters into a
    # 1-D tensor by absolute element indices with a first step of k * tiles).
    view = NkiTensor(t._buf, t.offset + offset, shape, [0] + strides[1:])
    lo, hi = view_span(view)
    rows = full[0] if full else 1
    vmin = max(0, -(lo // scale)) if lo < 0 else 0
    vmax = min(rows - 1, (t._buf.numel - 1 - hi) // scale)
    if vmin > vmax:
        fail(f"access pattern {[[a, b] for a, b in zip(strides, shape)]} at offset {offset} "
             f"leaves the tensor {list(full)} whatever the row index")
    return NkiTensor(t._buf, view.offset, shape, view.strides, ind=(idx, scale, vmin, vmax))
