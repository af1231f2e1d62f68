"""nisa's DMA instructions: dma_copy (between any of HBM, SBUF and PSUM; an HBM side indexed by
a tile of row indices gathers or scatters rows, a side at an access pattern's run-time
scalar_offset moves with it), dma_compute (DMA-side reductions), nc_n_gather and local_gather
(the executor's gather by run-time indices). isa.py re-exports them."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit
from openneuron.nki import language as nl
from openneuron.nki._emit import Expr, emit
from openneuron.nki._tensor import NkiTensor
from openneuron.nki._trace import fail
from openneuron.nki.isa import _DgeModeEnum, _flat, _OobMode, _op_name, _out


def _rmw_op(op):
    """dst_rmw_op: None, or addition (np.add / nl.add), the one the DMA engines compute."""
    if op is None:
        return None
    if getattr(op, "_nki_op", None) == "add" or op is np.add or op == "add":
        return "add"
    fail(f"nisa.dma_copy: dst_rmw_op {getattr(op, '__name__', op)!r}; only np.add / nl.add "
         f"(dst = dst + src) is supported")
    return None


def dma_copy(*args, dst=None, src=None, mask=None, dge_mode=None, oob_mode=None,
             dst_rmw_op=None, **_):
    """dst <- src between any of HBM, SBUF and PSUM (shapes match; dtypes convert);
    dst_rmw_op=np.add: dst <- dst + src (in float32). An HBM side indexed by a tile of row
    indices (Beta 1 in_tensor[idx_tile, iy], 0.x tensor.ap(..., vector_offset=idx)) gathers or
    scatters rows: each index is checked when the kernel runs; oob_mode=skip leaves a row whose
    index is out of range alone instead of failing. Scatter indices that repeat: the last row
    wins (with dst_rmw_op, every row is added, in order). A side at a run-time offset (0.x
    tensor.ap(..., scalar_offset=register or [1, 1] integer tile)) is checked when the kernel
    runs (oob_mode=skip: nothing copied when out of range)."""
    args = list(args)
    if dst is None and args:
        dst = args.pop(0)
    if src is None and args:
        src = args.pop(0)
    if args or dst is None or src is None:
        fail("nisa.dma_copy takes dst and src")
    for what, t in (("dst", dst), ("src", src)):
        if not isinstance(t, NkiTensor):
            fail(f"nisa.dma_copy: {what} must be a tensor, got {type(t).__name__}")
    acc = _rmw_op(dst_rmw_op)
    skip = oob_mode is not None and _OobMode(int(oob_mode)) == _OobMode.skip
    indirect = src.ind is not None or dst.ind is not None
    dynamic = src.dyn is not None or dst.dyn is not None  # an `ap(scalar_offset=)` side
    if dynamic and (acc is not None or tuple(dst.shape) != tuple(src.shape)):
        fail(f"nisa.dma_copy with an access pattern's scalar_offset: a plain copy between "
             f"views of the same shape (dst {list(dst.shape)}, src {list(src.shape)}"
             f"{', dst_rmw_op' if acc is not None else ''})")
    if acc is not None and skip:
        fail("nisa.dma_copy: with dst_rmw_op only oob_mode=nisa.oob_mode.error is allowed")
    if indirect and dge_mode is not None and _DgeModeEnum(int(dge_mode)) == _DgeModeEnum.hwdge:
        fail("nisa.dma_copy: a gather or scatter by a tile of row indices needs the software "
             "DGE (dge_mode=swdge, none or unknown), not hwdge")
    if tuple(dst.shape) != tuple(src.shape) and indirect:
        fail(f"nisa.dma_copy shapes differ: dst {list(dst.shape)}, src {list(src.shape)}; an "
             f"indirect copy needs the same shape on both sides")
    if tuple(dst.shape) != tuple(src.shape):
        if int(np.prod(dst.shape)) != int(np.prod(src.shape)):
            fail(f"dma_copy shapes differ: dst {list(dst.shape)}, src {list(src.shape)}")
        # the DMA moves elements in order: either side strided as the other's shape
        s2 = src.as_shape(dst.shape, keep_partitions=False)
        d2 = None if s2 is not None else dst.as_shape(src.shape, keep_partitions=False)
        if s2 is not None:
            src = s2
        elif d2 is not None:
            dst = d2
        elif src._buf.kind == "hbm":
            src = src.reshape(dst.shape)
        elif dst._buf.kind == "hbm":
            dst = dst.reshape(src.shape)
        else:
            fail(f"dma_copy shapes differ: dst {list(dst.shape)}, src {list(src.shape)}")
    _emit.copy_into(dst, src, mask=mask, allow_hbm=True, oob_skip=skip, accumulate=acc,
                    dynamic="nisa.dma_copy" if dynamic else None)


def nc_n_gather(dst=None, data=None, indices=None, **_):
    """0.x: dst[p, j...] = data[p] (its free elements flattened)[indices[p, j...]], uint32
    indices, dst of data's dtype: nl.gather_flattened into dst (the executor's gather)."""
    if not all(isinstance(x, NkiTensor) for x in (dst, data, indices)):
        fail("nisa.nc_n_gather(dst, data, indices) takes three tiles")
    if indices._buf.dtype != "uint32":
        fail(f"nisa.nc_n_gather: indices dtype {indices._buf.dtype}; they must be uint32")
    if dst._buf.dtype != data._buf.dtype:
        fail(f"nisa.nc_n_gather: dst dtype {dst._buf.dtype} differs from data's "
             f"{data._buf.dtype}; the gather does not convert")
    if dst.shape[0] != indices.shape[0] or dst.size != indices.size:
        fail(f"nisa.nc_n_gather: dst {list(dst.shape)} must hold indices' "
             f"{list(indices.shape)} elements per partition")
    _emit.copy_into(dst, nl.gather_flattened(data, indices))


def dma_compute(dst, srcs, reduce_op=None, scales=None, unique_indices=True, oob_mode=None,
                **_):
    """dst = srcs[0] + srcs[1] + ... in float32 on the DMA engines (0.x: reduce_op nl.add and
    scales 1.0 only, as NKI documents), each tensor walked in order (the same element count,
    HBM or SBUF). The read-modify-write by vector_offset is not supported here."""
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    if reduce_op is not None and _op_name(reduce_op) != "add":
        fail("nisa.dma_compute: reduce_op must be nl.add (the only one NKI supports)")
    if scales is not None and any(float(c) != 1.0 for c in scales):
        fail("nisa.dma_compute: every scale must be 1.0 (as NKI supports)")
    if not isinstance(dst, NkiTensor) or not srcs or \
            not all(isinstance(x, NkiTensor) for x in srcs) or len(srcs) > 16:
        fail("nisa.dma_compute(dst, srcs) takes a tensor and a list of 1 to 16 tensors")
    if any(x.ind is not None for x in [dst, *srcs]):
        fail("nisa.dma_compute with vector_offset (the read-modify-write scatter / gather) is "
             "not supported on the neuron NKI executor; use nisa.dma_copy(dst_rmw_op=np.add)")
    walked = []
    for x in srcs:
        if x.size != dst.size:
            fail(f"nisa.dma_compute: src {list(x.shape)} and dst {list(dst.shape)} hold "
                 f"different element counts")
        v = x if tuple(x.shape) == tuple(dst.shape) else \
            x.as_shape(dst.shape, keep_partitions=False)
        if v is None:
            fail(f"nisa.dma_compute: src {x!r} cannot be walked as dst {list(dst.shape)}")
        walked.append(v)
    e = Expr()
    acc = e.src(walked[0])
    for x in walked[1:]:
        acc = e.op("add", acc, e.src(x))
    emit(dst, dst.shape, e, acc, allow_hbm=True)


_GATHER_ELEMS = (1, 2, 4, 8, 16, 32)


def local_gather(*args, mask=None, **kwargs):
    """Per GpSimd core (16 partitions): its index block [16, K] (uint16) read column by column
    (numpy order='F'), the first num_valid_indices of them (default 16 * K); every partition of
    the core takes num_elem_per_idx contiguous elements of its own (flattened) source row from
    each index: out[p, j, :] = src[p, i_j : i_j + num_elem_per_idx]. dtype as the source. Beta
    1: local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None) returns
    [P, K, 16, n] when every index is valid, else [P, num_valid_indices, n]; 0.x:
    local_gather(dst, src_buffer, index, ...). An index past the source fails when the kernel
    runs (undefined on hardware)."""
    dst = kwargs.pop("dst", None)
    if dst is None and len(args) >= 3 and isinstance(args[2], NkiTensor):
        dst, args = args[0], args[1:]
    params = ("src_buffer", "index", "num_elem_per_idx", "num_valid_indices")
    values = {"num_elem_per_idx": 1, "num_valid_indices": None, **dict(zip(params, args))}
    values.update({k: kwargs.pop(k) for k in params if k in kwargs})
    if "src_buffer" not in values or "index" not in values:
        fail("nisa.local_gather: missing src_buffer or index")
    if mask is not None:
        fail("nisa.local_gather: a mask is not supported here")
    src = _flat(values["src_buffer"], "local_gather", "src_buffer")
    index = _flat(values["index"], "local_gather", "index")
    n_elem = int(values["num_elem_per_idx"])
    p, k = index.shape
    if src.shape[0] != p or p % 16:
        fail(f"nisa.local_gather: src_buffer {list(values['src_buffer'].shape)} and index "
             f"{list(values['index'].shape)} need the same partitions, a multiple of 16")
    if index._buf.dtype != "uint16":
        fail(f"nisa.local_gather: index dtype {index._buf.dtype}; indices are uint16")
    if n_elem not in _GATHER_ELEMS:
        fail(f"nisa.local_gather: num_elem_per_idx {n_elem} must be one of {list(_GATHER_ELEMS)}")
    n_valid = values["num_valid_indices"]
    n_valid = 16 * k if n_valid is None else int(n_valid)
    if not 1 <= n_valid <= min(16 * k, 4096):
        fail(f"nisa.local_gather: num_valid_indices {n_valid} must be 1 to {min(16 * k, 4096)} "
             f"(16 partitions x {k} indices per core, at most 4096)")
    if n_elem > src.shape[1]:
        fail(f"nisa.local_gather: num_elem_per_idx {n_elem} exceeds the source's "
             f"{src.shape[1]} elements per partition")
    shape = (p, k, 16, n_elem) if n_valid == 16 * k else (p, n_valid, n_elem)
    out = _out(dst, shape, src.dtype)
    if out._buf.dtype != src._buf.dtype:
        fail(f"nisa.local_gather: dst dtype {out._buf.dtype} differs from the source's "
             f"{src._buf.dtype}; the gather does not convert")
    if out.shape[0] != p or out.size != p * n_valid * n_elem:
        fail(f"nisa.local_gather: dst {list(out.shape)} must hold {n_valid} x {n_elem} elements "
             f"in each of {p} partitions")
    _emit.emit_gather(out.reshape((p, n_valid, n_elem)), src, index, n_valid, n_elem)
    return out if dst is None else None
