"""nisa instructions that move data across partitions as fixed patterns: dma_transpose (the DMA
engines' permutations of a tile or an HBM tensor; its indirect form, rows of HBM gathered by a
tile of indices and transposed, as the executor's indirect copy into a transposed view) and
nc_stream_shuffle (the Vector Engine's partition shuffle within each 32-partition quadrant).
Strided or indirect copies chosen when traced (a few executor copy instructions, no Python per
element). isa.py re-exports them."""

from __future__ import annotations

from openneuron.nki import _emit, _trace
from openneuron.nki._emit import new_buffer
from openneuron.nki._tensor import NkiTensor
from openneuron.nki._trace import fail
from openneuron.nki.isa import _flat
from openneuron.nki.isa import dge_mode as _DgeMode

_PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _permuted(t: NkiTensor, perm) -> NkiTensor:
    checks = [(c, tuple(k[a] for a in perm), n, ax) for c, k, n, ax in t.checks]
    return NkiTensor(t._buf, t.offset, [t.shape[a] for a in perm], [t.strides[a] for a in perm],
                     checks)


def _check_hwdge(src):
    """The hardware DGE transpose's documented limits."""
    s, n = src.shape, src.ndim
    if n == 2 and s[0] != 16:
        fail(f"nisa.dma_transpose with dge_mode=hwdge: a 2-D source needs 16 rows, got "
             f"{list(s)}")
    if n > 2 and (s[0] not in (1, 2, 4, 8, 16) or (s[0] * s[-2]) % 16):
        fail(f"nisa.dma_transpose with dge_mode=hwdge: source {list(s)} needs shape[0] in "
             f"(1, 2, 4, 8, 16) and shape[0] * shape[-2] a multiple of 16")
    if s[-1] > 128:
        fail(f"nisa.dma_transpose with dge_mode=hwdge: source {list(s)} has a last dimension "
             f"over 128")
    if _trace.DTYPE_SIZES[src._buf.dtype] != 2:
        fail(f"nisa.dma_transpose with dge_mode=hwdge: source dtype {src._buf.dtype}; it must "
             f"be a 2-byte dtype")


def dma_transpose(*args, axes=None, mask=None, dtype=None, dge_mode=None, dst=None, **_):
    """The source (HBM or SBUF, 2-D to 4-D) permuted as NKI's DMA transpose does: 2-D (1, 0),
    3-D (2, 1, 0), 4-D (3, 1, 2, 0); axes, when given, must be that permutation. Beta 1:
    dma_transpose(src, axes=None) returns an SBUF tile (dtype converts); 0.x:
    dma_transpose(dst, src, axes=None) writes dst (an SBUF tile of the source's dtype).
    dge_mode=hwdge checks the hardware DGE's limits. An indirect source (0.x
    src_hbm.ap(pattern, vector_offset=idx, indirect_dim=0)): see _indirect_transpose."""
    args = list(args)
    if "src" in _:
        args.append(_.pop("src"))
    if dst is None and len(args) == 2:
        dst = args.pop(0)
    if len(args) != 1:
        fail("nisa.dma_transpose takes a source (Beta 1) or a destination and a source (0.x)")
    src = args[0]
    if not isinstance(src, NkiTensor):
        fail(f"nisa.dma_transpose: src must be a tensor, got {type(src).__name__}")
    if src._buf.kind == "psum":
        fail("nisa.dma_transpose: the source must be in HBM or SBUF, not PSUM")
    perm = _PERMUTATIONS.get(src.ndim)
    if perm is None:
        fail(f"nisa.dma_transpose: a source of {src.ndim} dimensions ({list(src.shape)}); it "
             f"transposes 2-D to 4-D ones")
    if axes is not None and tuple(int(a) for a in axes) != perm:
        fail(f"nisa.dma_transpose: axes {tuple(axes)} for a {src.ndim}-D source; the supported "
             f"one is {perm}")
    mode = _DgeMode.unknown if dge_mode is None else _DgeMode(int(dge_mode))
    if src.ind is not None:
        return _indirect_transpose(src, dst, axes, mask, dtype, mode)
    if mode == _DgeMode.hwdge:
        _check_hwdge(src)
    elif mode != _DgeMode.unknown:
        fail(f"nisa.dma_transpose: dge_mode {mode.name} is for indirect (vector_offset) "
             f"transposes, which are not supported here; use unknown or hwdge")
    view = _permuted(src, perm)
    if view.shape[0] > _trace.PMAX:
        fail(f"nisa.dma_transpose: the result {list(view.shape)} has {view.shape[0]} partitions; "
             f"at most {_trace.PMAX}")
    if dst is None:
        out = new_buffer(view.shape, _trace.dtype_name(dtype or src.dtype), "sbuf")
    else:
        out = dst
        if not isinstance(out, NkiTensor) or out._buf.kind != "sbuf":
            fail("nisa.dma_transpose: dst must be an SBUF tile")
        if out._buf.dtype != src._buf.dtype:
            fail(f"nisa.dma_transpose: dst dtype {out._buf.dtype} differs from the source's "
                 f"{src._buf.dtype}")
        if tuple(out.shape) != tuple(view.shape):
            fail(f"nisa.dma_transpose: dst {list(out.shape)} must be the transposed shape "
                 f"{list(view.shape)}")
    _emit.copy_into(out, view, mask=mask, allow_hbm=True)
    return out if dst is None else None


def _indirect_transpose(src, dst, axes, mask, dtype, mode):
    """The software DGE's gather-transpose (0.x): flat = indices.T.flatten()[:n] (column-major
    over a [K, M] uint32 index tile), gathered = src[flat, ...], dst = gathered permuted as a
    direct transpose of its rank (2-D (1, 0), 4-D (3, 1, 2, 0)), with the documented limits.
    One indirect copy per index column, each into the part of dst its rows fill."""
    name = "nisa.dma_transpose (indirect)"
    idx = src.ind[0]
    if mode not in (_DgeMode.unknown, _DgeMode.swdge):
        fail(f"{name}: dge_mode {mode.name}; an indirect transpose runs on the software DGE "
             f"(unknown or swdge)")
    if src.ndim not in (2, 4):
        fail(f"{name}: a {src.ndim}-D source {list(src.shape)}; indirect transposes are 2-D or "
             f"4-D")
    if mask is not None:
        fail(f"{name}: a mask is not supported")
    perm = _PERMUTATIONS[src.ndim]
    n, c = src.shape[0], src.shape[-1]
    k, m = idx.shape
    limits = [
        (src.ndim == 2 or 1 in src.shape[1:3],
         f"a 4-D src {list(src.shape)} needs shape[1] or shape[2] to be 1"),
        (_trace.DTYPE_SIZES[src._buf.dtype] == 2, f"src dtype {src._buf.dtype} must be 2 bytes"),
        (c <= 128, f"src.shape[-1] {c} must be at most 128"),
        (idx._buf.dtype == "uint32", f"indices dtype {idx._buf.dtype} must be uint32"),
        (k * m >= n, f"indices {list(idx.shape)} hold fewer than src.shape[0] = {n} entries"),
        (n % 16 == 0, f"src.shape[0] {n} must be divisible by 16"),
        (16 <= k <= 128 and k % 16 == 0,
         f"indices.shape[0] {k} must be in [16, 128] and divisible by 16"),
        (m == 1 or k == 128,
         f"indices {list(idx.shape)}: with several columns indices.shape[0] must be 128"),
    ]
    for ok, why in limits:
        if not ok:
            fail(f"{name}: {why}")
    shape = tuple(src.shape[a] for a in perm)
    if dst is None:
        out = new_buffer(shape, _trace.dtype_name(dtype or src.dtype), "sbuf")
    else:
        out = dst
        if not isinstance(out, NkiTensor) or out._buf.kind != "sbuf":
            fail(f"{name}: dst must be an SBUF tile")
        if out._buf.dtype != src._buf.dtype:
            fail(f"{name}: dst dtype {out._buf.dtype} differs from the source's "
                 f"{src._buf.dtype}")
        if tuple(out.shape) != shape:
            fail(f"{name}: dst {list(out.shape)} must be the transposed shape {list(shape)}")
    # dst seen in the source's axis order: source axis a is dst axis perm.index(a)
    into_strides = [out.strides[perm.index(a)] for a in range(src.ndim)]
    for j in range((n + k - 1) // k):
        r0 = j * k
        rows = min(k, n - r0)
        column = NkiTensor(idx._buf, idx.offset + j * idx.strides[1], (rows,), idx.strides[:1])
        part = NkiTensor(src._buf, src.offset + r0 * src.strides[0], (rows,) + src.shape[1:],
                         src.strides, ind=(column, *src.ind[1:]))
        into = NkiTensor(out._buf, out.offset + r0 * into_strides[0], part.shape, into_strides)
        _emit.copy_into(into, part, allow_hbm=True)
    return out if dst is None else None


def _partitions(name, what, t):
    """(first partition, [P, F] view) of a tile view whose partitions are consecutive."""
    if not isinstance(t, NkiTensor) or t._buf.kind == "hbm":
        fail(f"nisa.{name}: {what} must be an SBUF or PSUM tile")
    per = t._buf.numel // t._buf.shape[0] if t._buf.shape and t._buf.shape[0] else 0
    if t.ndim == 1 and per and t.strides[0] % per:  # one partition's elements (a[0, i_x])
        v = NkiTensor(t._buf, t.offset, (1, t.shape[0]), (per, t.strides[0]))
    else:
        v = _flat(t, name, what)
    if v.shape[0] > 1 and v.strides[0] != per:
        fail(f"nisa.{name}: {what} must cover consecutive partitions (a partition step of 1)")
    return (v.offset // per if per else 0), v


def _check_start(name, start_src, start_dst, n_active):
    allowed = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[n_active]
    for what, s in (("src", start_src), ("dst", start_dst)):
        if s not in allowed:
            fail(f"nisa.{name}: {what} starts at partition {s}; with {n_active} active "
                 f"partitions it must start at one of {list(allowed)}")


def nc_stream_shuffle(*args, shuffle_mask=None, mask=None, dtype=None, src=None, dst=None, **_):
    """Within each 32-partition quadrant, dst partition i <- src partition shuffle_mask[i]
    (0..31; 255 leaves dst partition i unchanged), the same mask for every quadrant; src may be
    dst (in place) or have fewer partitions (a partition broadcast); mask applies to dst. Beta 1:
    nc_stream_shuffle(src, dst, shuffle_mask); 0.x: nc_stream_shuffle(dst, src, shuffle_mask).
    Two tiles passed positionally are ambiguous between the two: pass src= and dst=."""
    name = "nc_stream_shuffle"
    args = list(args)
    tiles = [a for a in args if isinstance(a, NkiTensor)]
    rest = [a for a in args if not isinstance(a, NkiTensor)]
    if len(tiles) == 2 and src is None and dst is None:
        if tiles[0] is not tiles[1]:
            fail(f"nisa.{name}: two tiles passed by position (Beta 1 takes (src, dst, ...), 0.x "
                 f"(dst, src, ...)); pass src= and dst=")
        src = dst = tiles[0]
    elif len(tiles) == 1 and (src is None) != (dst is None):
        src, dst = (tiles[0], dst) if src is None else (src, tiles[0])
    elif tiles:
        fail(f"nisa.{name}: pass src= and dst= (one tile each)")
    if rest and shuffle_mask is None:
        shuffle_mask = rest.pop(0)
    if src is None or dst is None or shuffle_mask is None or rest:
        fail(f"nisa.{name} takes src, dst and shuffle_mask")
    sm = list(shuffle_mask) if isinstance(shuffle_mask, (list, tuple)) else None
    if sm is None or len(sm) != 32 or not all(isinstance(m, int) and (0 <= m < 32 or m == 255)
                                              for m in sm):
        fail(f"nisa.{name}: shuffle_mask must be a list of 32 integers, each 0..31 or 255")
    s0, s = _partitions(name, "src", src)
    d0, d = _partitions(name, "dst", dst)
    if src._buf.dtype != dst._buf.dtype or (dtype is not None and
                                            _trace.dtype_name(dtype) != dst._buf.dtype):
        fail(f"nisa.{name}: src dtype {src._buf.dtype} and dst dtype {dst._buf.dtype} must be "
             f"the same (the shuffle does not convert)")
    if s.shape[1] != d.shape[1]:
        fail(f"nisa.{name}: src {list(src.shape)} and dst {list(dst.shape)} need the same number "
             f"of elements per partition")
    n_src, n_dst = s.shape[0], d.shape[0]
    _check_start(name, s0, d0, -(-max(n_src, n_dst) // 32) * 32)
    for q in range(-(-n_dst // 32)):
        for i, m in enumerate(sm):
            if m != 255 and 32 * q + i < n_dst and 32 * q + m >= n_src:
                fail(f"nisa.{name}: shuffle_mask[{i}] = {m} reads partition {32 * q + m} of src, "
                     f"which has {n_src}")
    if src._buf is dst._buf:  # in place (or overlapping): read a copy
        copy = new_buffer(s.shape, src._buf.dtype, "sbuf")
        _emit.copy_into(copy, s)
        s = copy
    target = d
    if mask is not None:  # shuffled into a copy of dst, then copied where the mask holds
        whole = new_buffer(dst.shape, dst._buf.dtype, "sbuf")
        _emit.copy_into(whole, dst)
        target = _flat(whole, name, "dst")
    f = d.shape[1]
    for q in range(-(-n_dst // 32)):
        for i0, n, step in _runs(sm, min(32, n_dst - 32 * q)):
            rows_d = NkiTensor(target._buf, target.offset + (32 * q + i0) * target.strides[0],
                               (n, f), (target.strides[0], target.strides[1]))
            rows_s = NkiTensor(s._buf, s.offset + (32 * q + sm[i0]) * s.strides[0], (n, f),
                               (step * s.strides[0], s.strides[1]))
            _emit.copy_into(rows_d, rows_s)
    if mask is not None:
        _emit.copy_into(dst, whole, mask=mask)


def _runs(sm, n):
    """(first, count, source step) of the runs of dst partitions 0..n-1 whose sources advance by
    one step (0 or more) each: one strided copy per run."""
    out, i = [], 0
    while i < n:
        if sm[i] == 255:
            i += 1
            continue
        j, step = i + 1, None
        while j < n and sm[j] != 255:
            d = sm[j] - sm[j - 1]
            if d < 0 or (step is not None and d != step):
                break
            step = d
            j += 1
        out.append((i, j - i, step or 0))
        i = j
    return out
