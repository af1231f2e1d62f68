"""Recording one instruction: operands bound to the iteration axes (broadcasting as numpy),
masks folded into the iteration box where they bound one axis (the rest stay per-lane
predicates), index bounds checked against the masked box, lazy NaN fills for tiles read before
they are written, and the matmul instruction's layout rules. Used by language.py and isa.py."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _tensor, _trace
from openneuron.nki._tensor import IndexExpr, NkiTensor, Pred, _expand, view_span
from openneuron.nki._trace import Buffer, Instr, Operand, fail


class Expr:
    """The scalar steps of one elementwise instruction over its operands."""

    def __init__(self):
        self.srcs = []
        self.steps = []

    def src(self, x):
        self.srcs.append(x)
        return ("s", len(self.srcs) - 1)

    def op(self, name, *regs):
        if name not in _trace.OPS:
            fail(f"operation {name} is not supported")
        self.steps.append((name, regs))
        return ("t", len(self.steps) - 1)


def _placeholder_fill(t, buf: Buffer):
    """An instruction writing NaN over the whole buffer, enabled only if the buffer is read (or
    partly written) before it is fully written: uninitialized memory reads as NaN. Tiles only:
    an HBM output is written by many grid instances (a fill per instance would erase the others'
    results) and, like torch.empty, holds whatever the allocator gave where nothing wrote."""
    if buf.numel == 0 or buf.kind == "hbm":
        return
    p = buf.shape[0] if buf.shape else 1
    f = buf.numel // p
    dst = Operand(0, buf.dtype, buf.id, 0, (f, 1))
    instr = Instr(0, [p, f], dst, [Operand(1, "float32", value=float("nan"))], line=-1)
    instr.enabled = False
    t.fills.add(len(t.instrs))
    t.add(instr)
    buf.state = "uninit"
    buf.fill = instr


def new_buffer(shape, dtype: str, kind: str, role: str = "tile", blocks: int = 1,
               direct=None) -> NkiTensor:
    t = _trace.current()
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        fail(f"negative dimension in shape {list(shape)}")
    buf = Buffer(t, kind, shape, dtype, role, blocks, direct)
    _placeholder_fill(t, buf)
    return NkiTensor(buf)


def _broadcasts(shape, S) -> bool:
    """Whether shape reaches S by _bind's broadcasting: trailing axes added, unit axes
    dropped at the end (else at the start), then each axis S's or 1."""
    shape = tuple(shape)
    if len(shape) > len(S):
        keep = shape[:len(S)] if all(n == 1 for n in shape[len(S):]) else shape[-len(S):]
        if any(n != 1 for n in shape[:len(shape) - len(S)]) and keep != shape[:len(S)]:
            return False
        shape = keep
    return all(a == b or a == 1 for a, b in zip(shape, S))


def _bind(view: NkiTensor, S, space_dims):
    """Strides of view over the iteration axes. NOTE: tiles align on the partition axis (NKI's
    rule): a [P] or [P, 1] tile broadcasts along the free axes of [P, F]; one that does not
    broadcast but has S's partitions and elements per partition walks them in order (0.x)."""
    if len(space_dims) == len(S) and not _broadcasts(view.shape, S):
        shaped = view.as_shape(S)
        view = shaped if shaped is not None else view
    if view.ndim > len(S):  # unit axes: a [P, 1] value into [P]; else [1, F] into [F]
        keep = slice(0, len(S))
        if any(n != 1 for n in view.shape[len(S):]):
            keep = slice(view.ndim - len(S), view.ndim)
            if any(n != 1 for n in view.shape[:keep.start]):
                fail(f"operand of shape {list(view.shape)} does not broadcast to {list(S)}")
        view = NkiTensor(view._buf, view.offset, view.shape[keep], view.strides[keep],
                         [(c, k[keep], n, a) for c, k, n, a in view.checks])
    strides, live = [], []
    for s in space_dims:
        j = s
        if j >= view.ndim:
            strides.append(0)
            live.append(False)
        elif view.shape[j] == S[s]:
            strides.append(view.strides[j])
            live.append(True)
        elif view.shape[j] == 1:
            strides.append(0)
            live.append(False)
        else:
            fail(f"operand of shape {list(view.shape)} does not broadcast to {list(S)}")
    checks = []
    for const, coefs, size, axis in view.checks:
        k = [coefs[s] if ok else 0 for s, ok in zip(space_dims, live)]
        checks.append([const, k, size, axis, view._buf.shape])
    return Operand(0, view._buf.dtype, view._buf.id, view.offset, strides), checks


def _fit_mask(mask: Pred, S):
    """The mask over S's leading axes: unit grid axes no condition uses are dropped (an
    nl.mgrid axis the indexing dropped too)."""
    shape, ineqs = list(mask.shape), [(c, list(k)) for c, k in mask.ineqs]
    j = 0
    while len(shape) > len(S) and j < len(shape):
        if shape[j] == 1 and not any(k[j] for _, k in ineqs):
            del shape[j]
            for _, k in ineqs:
                del k[j]
        else:
            j += 1
    if len(shape) > len(S) or any(m not in (1, s) for m, s in zip(shape, S)):
        fail(f"mask of shape {list(mask.shape)} does not fit the instruction's shape {list(S)}")
    return shape, ineqs


def _covers(op: Operand, extent, numel) -> bool:
    if op.offset != 0:
        return False
    pairs = sorted((st, n) for st, n in zip(op.strides, extent) if n > 1 and st != 0)
    acc = 1
    for st, n in pairs:
        if st != acc:
            return False
        acc *= n
    return acc == numel


def _touch_read(buf: Buffer):
    if buf.state == "uninit":
        buf.fill.enabled = True
        buf.state = "init"


def _touch_write(buf: Buffer, full: bool):
    if buf.state == "uninit":
        # a tile from before a run-time loop or nl.if_else, written inside it, is still
        # unwritten where the body does not run (a zero trip count, the other branch)
        loops = buf.trace.loops if buf.trace is not None else ()
        if not full or (loops and getattr(buf, "alloc_at", 0) < loops[-1]["head"]):
            buf.fill.enabled = True
        buf.state = "init"


def _offset_range(mn, mx, size, coef):
    """The run-time values v for which every index mn + coef * v .. mx + coef * v lies in
    [0, size): (lowest, highest), empty when lowest > highest."""
    if coef > 0:
        return -(mn // coef), (size - 1 - mx) // coef
    c = -coef
    return -((size - 1 - mx) // c), mn // c


def _check_partitions(name, x: NkiTensor, op: Operand, extent, scale, lo, hi):
    """A tile operand moved by a run-time offset stays within the partitions it starts in at
    both ends of its range (the executor maps tiles partition-major, _trace.layout)."""
    per = x._buf.numel // x._buf.shape[0] if x._buf.shape and x._buf.shape[0] else 0
    ends = []
    for v in (lo, hi):
        at = Operand(0, op.dtype, op.buf, op.offset + scale * (v - lo), op.strides)
        ends.append(_trace.partition_view(at, extent, per, 1))
    if per and (None in ends or ends[0][0] // per != ends[1][0] // per):
        fail(f"{name}: the run-time offset moves {x!r} across partitions; it must move within "
             f"each partition (along a free axis)")


def _refit(dst: NkiTensor, S, expr: Expr):
    """0.x: dst and a result of S's partitions and elements per partition, walked in order:
    dst strided as S, or else S taken as dst's shape where every tile operand walks it."""
    d = dst.as_shape(S)
    if d is not None:
        return d, S
    shape = tuple(dst.shape)
    tiles = [x for x in expr.srcs if isinstance(x, NkiTensor)]
    if shape and S and shape[0] == S[0] and dst.size == int(np.prod(S, dtype=np.int64)) and \
            all(tuple(x.shape) == shape or x.as_shape(shape) is not None or
                _broadcasts(x.shape, shape) for x in tiles):
        return dst, shape
    return dst, S


def emit(dst: NkiTensor, S, expr: Expr, result, *, space_dims=None, dst_map=None, mask=None,
         accumulate=None, nreduce=0, reduce_op="add", post_scale=1.0, allow_hbm=False, kind=0,
         dynamic=None, oob_skip=False):
    """Records dst <- expr over the iteration axes `space_dims` of the broadcast shape S (default
    all of S, in order), the last `nreduce` of them reduced. dst_map: the dst axis of each
    iteration axis (None where dst does not move). kind 2: the scan (csrc/nki program.h) with
    expr's operands (data0, data1, initial) and its two steps. dynamic: the instruction's name
    when one operand of a copy may sit at a run-time offset (NkiTensor.dyn): the executor's
    dynamic copy (kind 4), the offset's admissible range worked out over the masked box. An HBM
    view indexed by a tile of row indices (NkiTensor.ind) makes the copy the executor's indirect
    copy (kind 5: each index checked when the kernel runs; oob_skip: out-of-range rows skipped,
    NKI's oob_mode.skip, instead of an error)."""
    t = _trace.current()
    S = tuple(int(s) for s in S)
    if space_dims is None and dst_map is None and nreduce == 0 and tuple(dst.shape) != S:
        dst, S = _refit(dst, S, expr)
    space_dims = list(range(len(S))) if space_dims is None else list(space_dims)
    dst_map = list(range(len(S))) if dst_map is None else list(dst_map)
    if not space_dims:  # a 0-d value: one lane
        S, space_dims, dst_map = (1,), [0], [None]
    nd = len(space_dims)
    if nd > _trace.MAX_DIMS:
        fail(f"an instruction over {nd} axes; at most {_trace.MAX_DIMS}")
    extent = [S[d] for d in space_dims]
    # operands
    views, checks, srcs, moving, indirect = [], [], [], [], []
    for x in expr.srcs:
        if isinstance(x, NkiTensor):
            if x._buf.kind == "hbm" and not allow_hbm:
                fail(f"operand {x!r} is in HBM: compute engines read SBUF/PSUM tiles; load it "
                     f"first (nl.load / nisa.dma_copy)")
            op, ch = _bind(x, S, space_dims)
            x._buf.mm_open.clear()  # a read ends the matmuls' accumulation group
            if x.dyn is not None:
                moving.append((0, x, op))
            if x.ind is not None:
                indirect.append((0, x, op))
            views.append((x, op))
            checks += ch
            srcs.append(op)
        elif isinstance(x, IndexExpr):
            if len(x.shape) > len(S):
                fail(f"index expression of shape {list(x.shape)} does not fit {list(S)}")
            full = _expand(x.coefs, x.shape, x.shape) + [0] * (len(S) - len(x.shape))
            srcs.append(Operand(2, "float32", None, x.const, [full[s] for s in space_dims]))
        else:
            srcs.append(Operand(1, "float32", value=float(x)))
    if dst._buf.kind == "hbm" and not allow_hbm:
        fail("compute engines write SBUF/PSUM tiles; store to HBM with nl.store / nisa.dma_copy")
    dstrides = []
    for i, m in enumerate(dst_map):
        if m is None:
            dstrides.append(0)
        else:
            if m >= dst.ndim or dst.shape[m] != extent[i]:
                fail(f"result of shape {list(S)} does not fit the destination "
                     f"{list(dst.shape)}")
            dstrides.append(dst.strides[m])
    mapped = [m for m in dst_map if m is not None]
    if any(dst.shape[d] != 1 for d in range(dst.ndim) if d not in mapped):
        fail(f"result of shape {list(S)} does not fit the destination {list(dst.shape)}")
    dop = Operand(0, dst._buf.dtype, dst._buf.id, dst.offset, dstrides)
    if dst.dyn is not None:
        moving.append((1, dst, dop))
    if dst.ind is not None:
        indirect.append((1, dst, dop))
    iop = None
    if indirect:  # the index tile's operand: one integer per row (moved by masks as the rest)
        if len(indirect) > 1 or moving:
            fail("one side of a copy is indexed by run-time values (an index tile), not both")
        _, x, op = indirect[0]
        if expr.steps or nreduce or accumulate not in (None, "add") or len(expr.srcs) != 1 \
                or not isinstance(expr.srcs[0], NkiTensor):
            fail(f"{x!r} is indexed by a tile of row indices: only nl.load, nl.store, "
                 f"nl.atomic_rmw and nisa.dma_copy / dma_transpose take such a view, with a "
                 f"tile on the other side")
        if x.ind[0].ndim == 2 and x.ind[0].shape[1] > 1:
            fail(f"an index tile of shape {list(x.ind[0].shape)}: one row index per partition "
                 f"([P, 1]) is supported (several index columns, the DMA's batching, are not)")
        idx = _tensor.index_tile("indirect access", x.ind[0])
        if idx.shape[0] != x.shape[0]:
            fail(f"the index tile has {idx.shape[0]} rows and the access {list(x.shape)} "
                 f"{x.shape[0]} partitions; they must match")
        iop, _ = _bind(idx, S, space_dims)
        op.offset += x.ind[1] * x.ind[2]  # encoded at the lowest admissible row
    if moving and dynamic is None:
        fail(f"{moving[0][1]!r} is indexed by a run-time value: only nisa.tensor_copy_dynamic_src"
             f" / tensor_copy_dynamic_dst (and nisa.dma_copy, for an access pattern's "
             f"scalar_offset) take such a view")
    for const, coefs, size, axis in [(c[0], c[1], c[2], c[3]) for c in dst.checks]:
        k = [coefs[m] if m is not None else 0 for m in dst_map]
        checks.append([const, k, size, axis, dst._buf.shape])
    # masks: predicates in iteration coordinates; one-axis ones shrink the box
    preds = []
    if mask is not None:
        if not isinstance(mask, Pred):
            fail(f"mask must be a condition on index expressions (nl.arange / nl.mgrid), "
                 f"got {type(mask).__name__}")
        mshape, ineqs = _fit_mask(mask, S)
        for c, k in ineqs:
            full = list(_expand(k, mshape, mshape)) + [0] * (len(S) - len(mshape))
            preds.append([c, [full[s] for s in space_dims]])
    lo, hi = [0] * nd, list(extent)
    rest, empty = [], False
    for c, k in preds:
        nz = [i for i in range(nd) if k[i] != 0]
        if not nz:
            empty = empty or c < 0
        elif len(nz) == 1:
            i, a = nz[0], k[nz[0]]
            if a > 0:
                lo[i] = max(lo[i], -(c // a))
            else:
                hi[i] = min(hi[i], c // (-a) + 1)
        else:
            rest.append([c, k])
    if empty or any(h <= lw for lw, h in zip(lo, hi)):
        _touch_write(dst._buf, full=False)
        return None
    if any(lo):
        for op in srcs + [dop] + ([iop] if iop is not None else []):
            if op.type != 1:
                op.offset += sum(s * lw for s, lw in zip(op.strides, lo))
        for p in rest:
            p[0] += sum(a * lw for a, lw in zip(p[1], lo))
        for ch in checks:
            ch[0] += sum(a * lw for a, lw in zip(ch[1], lo))
    extent = [h - lw for lw, h in zip(lo, hi)]
    offsets = None
    for const, k, size, axis, shape in checks:
        mn = const + sum(min(0, a * (e - 1)) for a, e in zip(k, extent))
        mx = const + sum(max(0, a * (e - 1)) for a, e in zip(k, extent))
        if isinstance(axis, tuple):  # ("dyn", axis, coef): a run-time index (_tensor.index)
            offsets = _offset_range(mn, mx, size, axis[2])
            if offsets[0] > offsets[1]:
                fail(f"{dynamic}: no run-time offset keeps axis {axis[1]} of a tensor of shape "
                     f"{list(shape)} in bounds (the static part of its index spans {mn} to {mx}"
                     f"; the axis has {size})")
            continue
        if mn < 0 or mx >= size:
            fail(f"index out of bounds: axis {axis} of a tensor of shape {list(shape)} is "
                 f"indexed from {mn} to {mx}; mask the out-of-range lanes (mask=...)")
    if moving:  # encoded at the lowest admissible offset (csrc/nki program.h, kDynamicCopy)
        if len(moving) > 1:
            fail(f"{dynamic}: one operand sits at a run-time offset, not both")
        if offsets is None:
            fail(f"internal: {dynamic} without the run-time index's bound check")
        _, x, op = moving[0]
        scale = x.dyn[2]
        op.offset += scale * offsets[0]
        if x._buf.kind != "hbm":
            _check_partitions(dynamic, x, op, extent, scale, *offsets)
    ends = [(x, op.offset, op.strides) for x, op in views + [(dst, dop)]]
    if indirect:  # the moving side at the last row too (an `ap` pattern has no per-axis checks)
        _, x, op = indirect[0]
        ends.append((x, op.offset + x.ind[1] * (x.ind[3] - x.ind[2]), op.strides))
        ends.append((x.ind[0], iop.offset, iop.strides))
    for x, offset, strides in ends:
        lo_e, hi_e = view_span(NkiTensor(x._buf, offset, extent, strides))
        if lo_e < 0 or hi_e >= x._buf.numel:
            fail(f"access outside the tensor {list(x._buf.shape)} (elements {lo_e}..{hi_e})")
    # registers
    n_src = len(srcs)
    if n_src + len(expr.steps) + 1 > _trace.MAX_REGISTERS:
        fail("expression too large for one instruction")

    def reg(r):
        return r[1] if r[0] == "s" else n_src + r[1]

    steps = []
    for name, regs in expr.steps:
        rr = [reg(r) for r in regs]
        rr += [rr[0] if rr else 0] * (3 - len(rr))
        steps.append((name, *rr))
    if steps and reg(result) != n_src + len(steps) - 1 or (not steps and reg(result) != 0):
        steps.append(("copy", reg(result), reg(result), reg(result)))
    if not steps and n_src != 1:
        fail("internal: an instruction without steps takes one operand")
    for x, _ in views:
        _touch_read(x._buf)
    if accumulate is not None:
        _touch_read(dst._buf)
    full = not rest and accumulate is None and _covers(dop, extent, dst._buf.numel)
    extra = ()
    if moving:  # the run-time value: one element, read whole (strides 0)
        if steps or nreduce or accumulate is not None:
            fail(f"internal: {dynamic} is a plain copy")
        target, x, _ = moving[0]
        value = x.dyn[0]
        srcs.append(Operand(0, value._buf.dtype, value._buf.id, value.offset, [0] * nd))
        _touch_read(value._buf)
        kind, full = 4, full and target == 0 and not oob_skip
        # csrc/nki program.h, Instr::dyn_mode: oob_mode.skip; an access pattern's scalar_offset
        mode = int(bool(oob_skip)) | (2 if len(x.dyn) > 3 and x.dyn[3] else 0)
        extra = (target, x.dyn[2], *offsets, mode)
    if indirect:  # csrc/nki program.h, kIndirect: rows ind[2] .. ind[3] admitted
        target, x, _ = indirect[0]
        srcs.append(iop)
        _touch_read(x.ind[0]._buf)
        kind, full = 5, full and target == 0 and not oob_skip
        extra = (target, int(bool(oob_skip)), x.ind[1], x.ind[2], x.ind[3])
    _touch_write(dst._buf, full)
    instr = Instr(kind, extent, dop, srcs, steps, rest, nreduce=nreduce, reduce_op=reduce_op,
                  accumulate=accumulate is not None, acc_op=accumulate or "add",
                  post_scale=post_scale, line=t.line())
    instr.extra = extra
    return t.add(instr)


def check_matmul(stationary: NkiTensor, moving: NkiTensor):
    """The Tensor Engine's layout and dtype rules (before the result tile is allocated)."""
    if stationary.ndim != 2 or moving.ndim != 2:
        fail(f"matmul takes 2-D tiles, got {list(stationary.shape)} and {list(moving.shape)}")
    K, M = stationary.shape
    K2, N = moving.shape
    if K != K2:
        fail(f"matmul contraction (partition) dimensions differ: stationary {list(stationary.shape)}"
             f", moving {list(moving.shape)}")
    if K > _trace.PMAX:
        fail(f"matmul contraction dimension {K} exceeds {_trace.PMAX} partitions; accumulate "
             f"K tiles of at most 128 into one PSUM tile")
    if M > _trace.GEMM_STATIONARY_FMAX:
        fail(f"matmul stationary free size {M} exceeds nl.tile_size.gemm_stationary_fmax "
             f"({_trace.GEMM_STATIONARY_FMAX})")
    if N > _trace.GEMM_MOVING_FMAX:
        fail(f"matmul moving free size {N} exceeds nl.tile_size.gemm_moving_fmax "
             f"({_trace.GEMM_MOVING_FMAX})")
    for name, x in (("stationary", stationary), ("moving", moving)):
        lo, hi = view_span(x)
        if lo < 0 or hi >= x._buf.numel:
            fail(f"matmul {name} operand {x!r} lies outside its tile {list(x._buf.shape)} "
                 f"(elements {lo}..{hi})")
        if x.dyn is not None:
            fail(f"matmul {name} operand is indexed by a run-time value; only "
                 f"nisa.tensor_copy_dynamic_src / _dst take such a view")
        if x._buf.kind != "sbuf":
            fail(f"matmul {name} operand must be an SBUF tile, got {x._buf.kind}")
        if not _trace.is_float(x._buf.dtype):
            fail(f"matmul {name} operand has dtype {x._buf.dtype}; the Tensor Engine takes "
                 f"float32, bfloat16, float16, float8_e4m3 or float8_e5m2")
    a, b = stationary._buf.dtype, moving._buf.dtype
    if (a == "float32") != (b == "float32"):
        fail(f"matmul operands {a} and {b}: a float32 matmul needs both operands float32 "
             f"(cast the other with nl.copy(x, dtype=...))")


def emit_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, accumulate: bool):
    """dst[M, N] (+)= stationary[K, M]^T @ moving[K, N]: the Tensor Engine's layout."""
    t = _trace.current()
    check_matmul(stationary, moving)
    K, M = stationary.shape
    N = moving.shape[1]
    a, b = stationary._buf.dtype, moving._buf.dtype
    if dst._buf.kind != "psum" or dst._buf.dtype != "float32":
        fail(f"matmul writes a float32 PSUM tile, got {dst._buf.dtype} in {dst._buf.kind}")
    if tuple(dst.shape) != (M, N):
        fail(f"matmul result [{M}, {N}] does not fit the destination {list(dst.shape)}")
    dop = Operand(0, "float32", dst._buf.id, dst.offset, (dst.strides[0], dst.strides[1], 0))
    sop = Operand(0, a, stationary._buf.id, stationary.offset,
                  (stationary.strides[1], 0, stationary.strides[0]))
    mop = Operand(0, b, moving._buf.id, moving.offset, (0, moving.strides[1], moving.strides[0]))
    _touch_read(stationary._buf)
    _touch_read(moving._buf)
    if accumulate:
        _touch_read(dst._buf)
    _touch_write(dst._buf, not accumulate and _covers(dop, [M, N, K], dst._buf.numel))
    return t.add(Instr(1, [M, N, K], dop, [sop, mop], accumulate=accumulate, line=t.line()))


# --- shared shapes of instructions -------------------------------------------------------------

def shape_of(x):
    if isinstance(x, NkiTensor):
        return x.shape
    if isinstance(x, IndexExpr):
        return x.shape
    return ()


def broadcast_shape(*xs):
    """NKI's broadcasting: shapes aligned on the partition (first) axis. Tiles of different
    shapes with the same partitions and elements per partition (0.x) are walked in order: the
    shape (most axes first) every tile's strides can walk."""
    shapes = [shape_of(x) for x in xs]
    tiles = [x for x in xs if isinstance(x, NkiTensor)]
    tshapes = sorted({tuple(x.shape) for x in tiles}, key=lambda s: -len(s))
    if len(tshapes) > 1 and len({x.size for x in tiles}) == 1 and \
            len({s[0] for s in tshapes if s}) == 1:
        for cand in tshapes:
            if all(tuple(x.shape) == cand or x.as_shape(cand) is not None for x in tiles):
                return cand
    n = max(len(s) for s in shapes)
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) + (1,) * (n - len(s)) for s in shapes]))
    except ValueError:
        fail(f"operands of shapes {[list(s) for s in shapes]} do not broadcast")


def copy_into(dst: NkiTensor, value, mask=None, allow_hbm=False, oob_skip=False,
              accumulate=None, dynamic=None):
    e = Expr()
    emit(dst, dst.shape, e, e.src(value), mask=mask, allow_hbm=allow_hbm, oob_skip=oob_skip,
         accumulate=accumulate, dynamic=dynamic)


def accumulate_into(dst: NkiTensor, value, op: str, mask=None):
    e = Expr()
    emit(dst, dst.shape, e, e.src(value), mask=mask, accumulate=op)


# the reductions the executor combines (csrc/nki execute.cpp combine; the parser admits these)
REDUCTIONS = ("add", "multiply", "maximum", "minimum", "abs_max", "abs_min")


def reduce_into(dst: NkiTensor, S, axes, expr: Expr, result, op: str, *, keepdims, mask=None,
                post_scale=1.0, accumulate=None):
    """dst <- op over `axes` of expr (evaluated over shape S)."""
    if op not in REDUCTIONS:
        fail(f"{op} is not a reduction the engines compute (one of {', '.join(REDUCTIONS)})")
    axes = sorted(a % len(S) for a in axes)
    kept = [d for d in range(len(S)) if d not in axes]
    space = kept + axes
    if keepdims:
        dst_map = [d for d in kept] + [None] * len(axes)
    else:
        dst_map = list(range(len(kept))) + [None] * len(axes)
    return emit(dst, S, expr, result, space_dims=space, dst_map=dst_map, mask=mask,
                accumulate=accumulate, nreduce=len(axes), reduce_op=op, post_scale=post_scale)


def emit_gather(dst: NkiTensor, src: NkiTensor, index: NkiTensor, n_valid: int, n_elem: int,
                own_row: bool = False):
    """dst [P, n_valid, n_elem] <- nisa.local_gather of src [P, S] (unit free stride) by the
    run-time indices of index [P, K] (csrc/nki program.h, kGather; an index past S - n_elem
    fails when the kernel runs, naming its line); own_row: each partition by its own index
    row (nl.gather_flattened)."""
    t = _trace.current()
    if any(x.dyn is not None for x in (dst, src, index)):
        fail("nisa.local_gather: an operand is indexed by a run-time value; only "
             "nisa.tensor_copy_dynamic_src / _dst take such a view")
    P, S = src.shape
    K = index.shape[1]
    if src.strides[1] != 1:
        fail("nisa.local_gather: the source's free elements must be contiguous in each partition; "
             "copy it into a tile first")
    dop = Operand(0, dst._buf.dtype, dst._buf.id, dst.offset, dst.strides)
    sop = Operand(0, src._buf.dtype, src._buf.id, src.offset, (src.strides[0], 0, 1))
    iop = Operand(0, index._buf.dtype, index._buf.id, index.offset,
                  (index.strides[0], index.strides[1], 0))
    _touch_read(src._buf)
    _touch_read(index._buf)
    extent = [P, n_valid, n_elem]
    _touch_write(dst._buf, _covers(dop, extent, dst._buf.numel))
    instr = Instr(3, extent, dop, [sop, iop], line=t.line())
    instr.extra = (S, K, int(own_row))
    return t.add(instr)
