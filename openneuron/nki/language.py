"""openneuron.nki.language (`nl`): the NKI language as publicly documented (neuronxcc.nki.language
of Beta 1, and what nki.language of 0.x shares with it). Tiles are values: each call records
instructions into the kernel being traced (_trace.py) and returns a new tile; nothing here runs
at launch time. Limits (partition dimension, SBUF/PSUM capacity, matmul shapes, dtypes) are
checked as each call is recorded, with errors naming the kernel's line."""

from __future__ import annotations

import builtins
import os

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._control import dynamic_range, fori_loop, if_else, while_loop  # noqa: F401
from openneuron.nki._emit import Expr, broadcast_shape, emit, new_buffer, reduce_into
from openneuron.nki._tensor import (  # noqa: F401  (the public names)
    BFLOAT16,
    FLOAT8_E4M3,
    FLOAT8_E5M2,
    HBM,
    PRIVATE_HBM,
    PSUM,
    SBUF,
    SHARED_HBM,
    DTypeConst,
    DynSlice,
    IndexExpr,
    NkiTensor,
    Pred,
    arange,
    mgrid,
)
from openneuron.nki._trace import fail

# dtypes (numpy's where numpy has them, as NKI accepts either)
float32 = np.float32
float16 = np.float16
bfloat16 = BFLOAT16
tfloat32 = DTypeConst("tfloat32")
# the current API's MX formats: names for kernels that mention them; a tile of one is an error
float8_e8m0fnu = DTypeConst("float8_e8m0fnu")
float8_e4m3fn_x4 = DTypeConst("float8_e4m3fn_x4")
float8_e5m2_x4 = DTypeConst("float8_e5m2_x4")
float4_e2m1fn_x4 = DTypeConst("float4_e2m1fn_x4")
float8_e4m3 = FLOAT8_E4M3  # stored as torch.float8_e4m3fn (no infinities)
float8_e4m3fn = FLOAT8_E4M3
bool_ = np.bool_  # stored as a byte, as uint8
float8_e5m2 = FLOAT8_E5M2
int32 = np.int32
int16 = np.int16
int8 = np.int8
uint32 = np.uint32
uint16 = np.uint16
uint8 = np.uint8
bool_ = np.bool_

# memory
sbuf = SBUF
psum = PSUM
hbm = HBM
shared_hbm = SHARED_HBM
private_hbm = PRIVATE_HBM


class tile_size:
    """Hardware tile-size constants."""

    pmax = _trace.PMAX
    psum_fmax = _trace.PSUM_FMAX
    gemm_stationary_fmax = _trace.GEMM_STATIONARY_FMAX
    gemm_moving_fmax = _trace.GEMM_MOVING_FMAX
    bn_stats_fmax = _trace.BN_STATS_FMAX
    psum_min_align = 4
    sbuf_min_align = 1
    total_available_sbuf_size = _trace.SBUF_PARTITION_BYTES


class fp32:
    """float32 constants: fp32.min is the most negative float32 (bit pattern 0xff7fffff), the
    fill value nisa.range_select requires."""

    min = float(np.finfo(np.float32).min)


class par_dim(int):
    """Marks the partition dimension in a shape: nl.ndarray((nl.par_dim(128), 512), ...)."""


def ds(start, size, step=1) -> DynSlice:
    return DynSlice(start, size, step)


# --- SPMD and loops ----------------------------------------------------------------------------

def program_id(axis=0) -> int:
    t = _trace.current()
    if not 0 <= axis < builtins.max(1, len(t.grid)):
        fail(f"program_id({axis}) of a launch grid {list(t.grid)}")
    return t.program_ids[axis] if t.program_ids else 0


def num_programs(axes=None):
    t = _trace.current()
    grid = t.grid or (1,)
    if axes is None:
        return int(np.prod(grid))
    if isinstance(axes, (tuple, list)):
        return tuple(grid[a] for a in axes)
    return grid[axes]


def program_ndim() -> int:
    return len(_trace.current().grid)


class spmd_dim:
    """A launch-grid dimension made of factors, some of them NeuronCores (`nl.nc(n)`):
    `kernel[nl.spmd_dim(nl.nc(2), 2), 2]`, or `kernel[nl.nc(2) * 2, 2]`. The device emulates
    one NeuronCore per `neuron:N` and runs a grid's instances in parallel on it, so the factors
    decide only the dimension's size (their product); program_id counts along it as usual."""

    def __init__(self, *factors):
        self.factors = factors
        self.size = int(np.prod([int(f) for f in factors])) if factors else 1
        if self.size < 1:
            fail(f"nl.spmd_dim{factors}: every factor must be a positive integer")

    def __index__(self):
        return self.size

    __int__ = __index__

    def __mul__(self, other):
        return spmd_dim(self, other)

    def __rmul__(self, other):
        return spmd_dim(other, self)

    def __repr__(self):
        return f"nl.spmd_dim({', '.join(map(repr, self.factors))})"


class nc(spmd_dim):
    """`n` logical NeuronCores as one factor of a launch-grid dimension (see spmd_dim)."""

    def __init__(self, n):
        super().__init__(n)

    def __repr__(self):
        return f"nl.nc({self.size})"


def affine_range(start, stop=None, step=1, **_):
    """Iterations without loop-carried dependencies (unrolled when traced)."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range


# --- creation ----------------------------------------------------------------------------------

def _shape(shape):
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def ndarray(shape, dtype, buffer=None, name="", **_):
    """An uninitialized tensor: an SBUF/PSUM tile or, with buffer=nl.shared_hbm/nl.hbm, an HBM
    tensor (a kernel's output when returned). Uninitialized elements read as NaN. An on-chip
    shape may put its nl.par_dim after leading block axes, (B, nl.par_dim(P), F): B tiles of
    [P, F] side by side in the free bytes of P partitions (t[b] is one of them)."""
    kind = _tensor_kind(buffer)
    dims = _shape(shape)
    role = "hbm" if kind == "hbm" else "tile"
    k = next((i for i, s in enumerate(shape) if isinstance(s, par_dim)), 0) \
        if kind != "hbm" and not isinstance(shape, (int, np.integer)) else 0
    direct = None  # ncc placement: (base address or None, physical tiles)
    if hasattr(buffer, "physical_blocks"):
        direct = (buffer.base, buffer.physical_blocks(dims[:k]))
    if k == 0:
        return new_buffer(dims, _trace.dtype_name(dtype), kind, role, direct=direct)
    tile = new_buffer((dims[k],) + dims[:k] + dims[k + 1:], _trace.dtype_name(dtype), kind, role,
                      blocks=int(np.prod(dims[:k])), direct=direct)
    order = list(range(1, k + 1)) + [0] + list(range(k + 1, len(dims)))
    return NkiTensor(tile._buf, 0, dims, [tile.strides[j] for j in order])


def _tensor_kind(buffer):
    from openneuron.nki._tensor import buffer_kind
    return buffer_kind(buffer)


def static_cast(x, dtype):
    """x converted to dtype: a numpy array (bfloat16 / float8 through ml_dtypes), a torch
    tensor, or a tile inside a kernel (a copy in that dtype); values round to nearest even."""
    from openneuron.nki._tensor import numpy_dtype
    name = _trace.dtype_name(dtype)
    if isinstance(x, NkiTensor):
        return copy(x, dtype=name)
    if type(x).__module__ == "torch":
        import torch
        return x.to(getattr(torch, {"float8_e4m3": "float8_e4m3fn"}.get(name, name)))
    npdt = numpy_dtype(name)
    if npdt is None:
        fail(f"nl.static_cast: numpy has no {name} here (install ml_dtypes)")
    return np.asarray(x).astype(npdt)


class NKIObject:
    """Base class of NKI kernel dataclasses and configuration objects (NKI's compiler traces
    through them; here they are plain Python objects)."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


def is_hbm(buffer) -> bool:
    """Whether a buffer (nl.hbm, nl.shared_hbm, ...; or a tensor's) is HBM."""
    return _buffer_of(buffer) == "hbm"


def is_sbuf(buffer) -> bool:
    return _buffer_of(buffer) == "sbuf"


def is_psum(buffer) -> bool:
    return _buffer_of(buffer) == "psum"


def is_on_chip(buffer) -> bool:
    return _buffer_of(buffer) in ("sbuf", "psum")


def _buffer_of(buffer) -> str:
    return buffer._buf.kind if isinstance(buffer, NkiTensor) else _tensor_kind(buffer)


class no_reorder:
    """`with nl.no_reorder():` keeps the block's operations in program order. The executor runs
    a traced program in order anyway (within what the data allow); also a loop directive."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def shared_constant(constant, dtype=None, **_):
    """An HBM tensor holding `constant` (an array known when the kernel is traced, or a .npy
    file), in dtype (the array's own by default). It reaches the device as a hidden input of the traced
    program, copied once per device and kept with the program; read-only."""
    from openneuron.nki._tensor import numpy_dtype
    if isinstance(constant, (str, os.PathLike)):  # 0.x: a path to a .npy file
        constant = np.load(constant)
    data = np.asarray(constant)
    name = _trace.dtype_name(dtype if dtype is not None else data.dtype)
    npdt = numpy_dtype(name)
    if npdt is None:
        fail(f"nl.shared_constant: numpy has no {name} here (install ml_dtypes)")
    t = _trace.current()
    buf = _trace.Buffer(t, "hbm", data.shape, name, "const")
    t.constants.append((buf.id, np.ascontiguousarray(data.astype(npdt))))
    return NkiTensor(buf)


def shared_identity_matrix(n, dtype=np.uint8, dst=None, **_):
    """An [n, n] identity matrix: an SBUF tile (dst, when given) for n <= 128, as the current
    NKI documents it (Beta 1's nl.load of it copies the tile), an HBM tensor beyond; e.g. the
    moving operand that makes nisa.nc_matmul a transpose."""
    from openneuron.nki import isa
    if dst is not None and tuple(dst.shape) != (n, n):
        fail(f"nl.shared_identity_matrix({n}): dst is {list(dst.shape)}, not [{n}, {n}]")
    out = dst if dst is not None else ndarray((n, n), dtype, buffer=sbuf if n <= 128
                                              else shared_hbm)
    jf = arange(n)[None, :]
    for p0 in range(0, n, 128):
        ip = arange(builtins.min(128, n - p0))[:, None]
        rows = isa.iota(p0 + ip - jf, dtype=np.float32)
        _emit.copy_into(out[p0 + ip, jf], equal(rows, 0.0, dtype=out.dtype), allow_hbm=True)
    return out


def empty(shape, dtype, buffer=None, name="", **_):
    return ndarray(shape, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=None, name="", **_):
    t = ndarray(shape, dtype, buffer, name)
    _emit.copy_into(t, fill_value, allow_hbm=True)
    return t


def zeros(shape, dtype, buffer=None, name="", **_):
    return full(shape, 0.0, dtype, buffer, name)


def ones(shape, dtype, buffer=None, name="", **_):
    return full(shape, 1.0, dtype, buffer, name)


def empty_like(a, dtype=None, buffer=None, name="", **_):
    return ndarray(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer, name)


def zeros_like(a, dtype=None, buffer=None, name="", **_):
    return zeros(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer, name)


def ones_like(a, dtype=None, buffer=None, name="", **_):
    return ones(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer, name)


def full_like(a, fill_value, dtype=None, buffer=None, name="", **_):
    return full(a.shape, fill_value, dtype or a.dtype, buffer if buffer is not None else a.buffer)


# --- memory ------------------------------------------------------------------------------------

def load(src, mask=None, dtype=None, **_):
    """HBM -> a new SBUF tile of the view's shape (partition dimension first)."""
    if not isinstance(src, NkiTensor):
        fail(f"nl.load takes an HBM tensor (or a view of one), got {type(src).__name__}")
    dt = _trace.dtype_name(dtype) if dtype is not None else src._buf.dtype
    out = new_buffer(src.shape, dt, "sbuf")
    _emit.copy_into(out, src, mask=mask, allow_hbm=True)
    return out


def store(dst, value, mask=None, **_):
    """A tile (SBUF, or PSUM through a copy) -> HBM."""
    if not isinstance(dst, NkiTensor) or dst._buf.kind != "hbm":
        fail("nl.store writes an HBM tensor: nl.store(out_tensor[...], value=tile)")
    if isinstance(value, NkiTensor) and value._buf.kind == "hbm":
        fail("nl.store takes an on-chip tile as value; HBM to HBM is nisa.dma_copy")
    _emit.copy_into(dst, value, mask=mask, allow_hbm=True)


def atomic_rmw(dst, value, op, mask=None, **_):
    """dst <- op(dst, value) on HBM, dst indexed by a tile of row indices (rmw[indices_tile,
    ix]); op np.add / nl.add. Rows whose indices repeat are all added, in row order."""
    if not isinstance(dst, NkiTensor) or dst._buf.kind != "hbm" or dst.ind is None:
        fail("nl.atomic_rmw updates an HBM tensor indexed by a tile of row indices: "
             "nl.atomic_rmw(rmw_tensor[indices_tile, ix], value=tile, op=np.add)")
    if not (getattr(op, "_nki_op", None) == "add" or op is np.add):
        fail(f"nl.atomic_rmw: op {getattr(op, '__name__', op)!r}; only np.add is supported")
    if not isinstance(value, NkiTensor):
        value = full(dst.shape, value, dst._buf.dtype)
    _emit.copy_into(dst, value, mask=mask, allow_hbm=True, accumulate="add")


def load_transpose2d(src, mask=None, dtype=None, **_):
    """HBM [F, P] -> SBUF tile [P, F] (the DMA transposes)."""
    if src.ind is not None:
        fail("nl.load_transpose2d of a view indexed by a tile of row indices is not supported; "
             "load the rows, then nl.transpose them")
    if src.ndim != 2:
        fail("nl.load_transpose2d takes a 2-D view")
    view = NkiTensor(src._buf, src.offset, src.shape[::-1], src.strides[::-1])
    return load(view, mask=mask, dtype=dtype)


def copy(src, mask=None, dtype=None, buffer=None, **_):
    """A new tile with src's values (cast to dtype)."""
    dt = _trace.dtype_name(dtype) if dtype is not None else _value_dtype(src)
    out = new_buffer(_emit.shape_of(src), dt, _tensor_kind(buffer))
    _emit.copy_into(out, src, mask=mask)
    return out


def gather_flattened(data, indices, axis=0, dtype=None, **_):
    """out[p, j...] = data[p] (its free elements flattened)[indices[p, j...]]: each partition
    takes elements of its own row by its own run-time indices (an index past the row fails when
    the kernel runs, naming the line). The result has the indices' shape, data's dtype unless
    dtype says otherwise."""
    from openneuron.nki import isa
    if not isinstance(data, NkiTensor) or not isinstance(indices, NkiTensor):
        fail("nl.gather_flattened takes two tiles")
    if axis != 0:
        fail(f"nl.gather_flattened: axis {axis}; the partition axis (0) is the only one")
    if data._buf.kind == "hbm" or indices._buf.kind == "hbm":
        fail("nl.gather_flattened takes on-chip tiles; load HBM tensors first")
    if indices._buf.dtype not in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
        fail(f"nl.gather_flattened: indices dtype {indices._buf.dtype}; indices are integers")
    src = isa._flat(data, "gather_flattened", "data")
    index = isa._flat(indices, "gather_flattened", "indices")
    p, k = index.shape
    if src.shape[0] != p:
        fail(f"nl.gather_flattened: data {list(data.shape)} and indices {list(indices.shape)} "
             f"need the same partitions")
    out = new_buffer((p, k), _trace.dtype_name(dtype) if dtype is not None else data._buf.dtype,
                     "sbuf")
    _emit.emit_gather(out.reshape((p, k, 1)), src, index, k, 1, own_row=True)
    return out.reshape(indices.shape)


def expand_dims(x, axis):
    """A view of x with a new axis of one position at `axis` (numpy's expand_dims)."""
    if not isinstance(x, NkiTensor):
        fail("nl.expand_dims takes a tile")
    axes = sorted(a % (x.ndim + 1) for a in (axis if isinstance(axis, (tuple, list)) else [axis]))
    shape, strides = list(x.shape), list(x.strides)
    for a in axes:
        shape.insert(a, 1)
        strides.insert(a, 0)
    if x._buf.kind != "hbm" and axes[0] == 0:
        fail("nl.expand_dims: a tile keeps its partition axis first; insert the axis after it")
    return NkiTensor(x._buf, x.offset, shape, strides, x.checks)


def broadcast_to(src, shape, **_):
    """A tile of `shape` with src broadcast along size-1 axes (the partition axis included)."""
    out = new_buffer(_shape(shape), _value_dtype(src), "sbuf")
    _emit.copy_into(out, src)
    return out


def transpose(x, mask=None, dtype=None, **_):
    """[P, F] -> [F, P] (F <= 128: it becomes the partition dimension)."""
    if x.ndim != 2:
        fail(f"nl.transpose takes a 2-D tile, got {list(x.shape)}")
    p, f = x.shape
    if f > _trace.PMAX:
        fail(f"nl.transpose of {list(x.shape)}: the free size {f} becomes the partition "
             f"dimension and exceeds {_trace.PMAX}")
    dt = _trace.dtype_name(dtype) if dtype is not None else x._buf.dtype
    out = new_buffer((f, p), dt, "sbuf")
    view = NkiTensor(x._buf, x.offset, (f, p), x.strides[::-1])
    _emit.copy_into(out, view, mask=mask)
    return out


# --- elementwise -------------------------------------------------------------------------------

def _value_dtype(x) -> str:
    if isinstance(x, NkiTensor):
        return x._buf.dtype
    if isinstance(x, IndexExpr):
        return "int32"
    if isinstance(x, (bool, np.bool_)):
        return "uint8"
    if isinstance(x, (int, np.integer)):
        return "int32"
    return "float32"


def _result_dtype(xs, dtype, kind):
    if dtype is not None:
        return _trace.dtype_name(dtype)
    if kind == "compare":
        return "uint8"
    tiles = [_value_dtype(x) for x in xs if isinstance(x, NkiTensor)]
    scalars = [_value_dtype(x) for x in xs if not isinstance(x, NkiTensor)]
    dt = tiles[0] if tiles else "float32"
    for d in tiles[1:]:
        dt = _trace.promote(dt, d)
    if not _trace.is_float(dt) and builtins.any(_trace.is_float(d) for d in scalars):
        dt = "float32"
    if kind == "float" and not _trace.is_float(dt):
        dt = "float32"
    return dt


def _check_operand(x, name):
    if isinstance(x, (NkiTensor, IndexExpr, int, float, bool, np.number)):
        return
    fail(f"nl.{name}: unsupported operand {type(x).__name__}")


def _make(name, arity, kind="same"):
    def fn(*args, dtype=None, mask=None, buffer=None, **_):
        if len(args) != arity:
            fail(f"nl.{name} takes {arity} operand(s), got {len(args)}")
        for a in args:
            _check_operand(a, name)
        S = broadcast_shape(*args)
        out = new_buffer(S, _result_dtype(args, dtype, kind), _tensor_kind(buffer))
        e = Expr()
        r = e.op(name, *[e.src(a) for a in args])
        emit(out, S, e, r, mask=mask)
        return out

    fn.__name__ = name
    fn._nki_op = name
    fn.__doc__ = f"Elementwise {name} (float32 compute, rounded to the result dtype)."
    return fn


exp = _make("exp", 1, "float")
log = _make("log", 1, "float")
tanh = _make("tanh", 1, "float")
sqrt = _make("sqrt", 1, "float")
rsqrt = _make("rsqrt", 1, "float")
reciprocal = _make("reciprocal", 1, "float")
sigmoid = _make("sigmoid", 1, "float")
relu = _make("relu", 1)
gelu = _make("gelu", 1, "float")
gelu_apprx_tanh = _make("gelu_apprx_tanh", 1, "float")
silu = _make("silu", 1, "float")
softplus = _make("softplus", 1, "float")
mish = _make("mish", 1, "float")
sin = _make("sin", 1, "float")
cos = _make("cos", 1, "float")
erf = _make("erf", 1, "float")
square = _make("square", 1)
abs = _make("abs", 1)
negative = _make("neg", 1)
sign = _make("sign", 1)
floor = _make("floor", 1)
ceil = _make("ceil", 1)
trunc = _make("trunc", 1)
logical_not = _make("logical_not", 1, "compare")
add = _make("add", 2)
subtract = _make("subtract", 2)
multiply = _make("multiply", 2)
divide = _make("divide", 2, "float")
maximum = _make("maximum", 2)
minimum = _make("minimum", 2)
power = _make("power", 2, "float")
mod = fmod = _make("mod", 2)
equal = _make("equal", 2, "compare")
not_equal = _make("not_equal", 2, "compare")
less = _make("less", 2, "compare")
less_equal = _make("less_equal", 2, "compare")
greater = _make("greater", 2, "compare")
greater_equal = _make("greater_equal", 2, "compare")
logical_and = _make("logical_and", 2, "compare")
logical_or = _make("logical_or", 2, "compare")
logical_xor = _make("logical_xor", 2, "compare")
bitwise_and = _make("bitwise_and", 2)
bitwise_or = _make("bitwise_or", 2)
bitwise_xor = _make("bitwise_xor", 2)
left_shift = _make("left_shift", 2)  # integers; right shifts keep the sign, as numpy's
right_shift = _make("right_shift", 2)
invert = bitwise_not = _make("invert", 1)
abs_max = _make("abs_max", 2)  # the signed value of the larger magnitude
abs_min = _make("abs_min", 2)
tan = _make("tan", 1, "float")
arctan = _make("arctan", 1, "float")
gelu_apprx_sigmoid = _make("gelu_apprx_sigmoid", 1, "float")  # x * sigmoid(1.702 x)
gelu_dx = _make("gelu_dx", 1, "float")
gelu_apprx_sigmoid_dx = _make("gelu_apprx_sigmoid_dx", 1, "float")
silu_dx = _make("silu_dx", 1, "float")
erf_dx = _make("erf_dx", 1, "float")
negative._nki_op = "neg"
identity = _make("copy", 1)


def bypass(x, *_, **__):
    """No operation: as op0 / op1 of tensor-scalar instructions, the step is skipped."""
    return x


def where(condition, x, y, dtype=None, mask=None, **_):
    """x where condition is nonzero, else y."""
    S = broadcast_shape(condition, x, y)
    out = new_buffer(S, _result_dtype((x, y), dtype, "same"), "sbuf")
    e = Expr()
    r = e.op("select", e.src(condition), e.src(x), e.src(y))
    emit(out, S, e, r, mask=mask)
    return out


def dropout(x, rate, dtype=None, mask=None, **_):
    """Zeroes each element with probability `rate` (a new mask on every launch)."""
    return _dropout(x, rate, dtype, mask)


def rand(shape, dtype=None, buffer=None, name="", **_):
    """Uniform random values in [0, 1), drawn when the kernel runs (openneuron/nki/_random.py)."""
    from openneuron.nki import _random

    return _random.rand(shape, dtype, buffer, name)


def random_seed(seed):
    """Seeds the kernel's generator from a [1, 1] 32-bit tile (openneuron/nki/_random.py)."""
    from openneuron.nki import _random

    _random.random_seed(seed)


def _dropout(x, rate, dtype, mask, out=None):
    S = x.shape
    if out is None:
        out = new_buffer(S, _result_dtype((x,), dtype, "same"), "sbuf")
    from openneuron.nki import _random

    _random.dropout_into(out, x, rate, mask)
    return out


# --- reductions over free axes -----------------------------------------------------------------

def _axes(x, axis):
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    axes = [int(a) % x.ndim for a in axes]
    if 0 in axes:
        fail("reductions run along free axes only (axis 0 is the partition axis); transpose "
             "first (nl.transpose) or use nisa.tensor_partition_reduce")
    return axes


def _reduce(name, op, x, axis, dtype, mask, keepdims, scale=None):
    if not isinstance(x, NkiTensor):
        fail(f"nl.{name} takes a tile")
    axes = _axes(x, axis)
    shape = [1 if d in axes else s for d, s in enumerate(x.shape)] if keepdims else \
        [s for d, s in enumerate(x.shape) if d not in axes]
    dt = _trace.dtype_name(dtype) if dtype is not None else x._buf.dtype
    out = new_buffer(shape, dt, "sbuf")
    e = Expr()
    n = int(np.prod([x.shape[a] for a in axes]))
    reduce_into(out, x.shape, axes, e, e.src(x), op, keepdims=keepdims, mask=mask,
                post_scale=(1.0 / n if scale == "mean" else 1.0))
    return out


def sum(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("sum", "add", x, axis, dtype, mask, keepdims)


def prod(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("prod", "multiply", x, axis, dtype, mask, keepdims)


def max(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("max", "maximum", x, axis, dtype, mask, keepdims)


def min(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("min", "minimum", x, axis, dtype, mask, keepdims)


def mean(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("mean", "add", x, axis, dtype, mask, keepdims, scale="mean")


def all(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("all", "minimum", not_equal(x, 0), axis, dtype, mask, keepdims)


def any(x, axis, dtype=None, mask=None, keepdims=False, **_):
    return _reduce("any", "maximum", not_equal(x, 0), axis, dtype, mask, keepdims)


def var(x, axis, dtype=None, mask=None, keepdims=False, **_):
    """Population variance (numpy's var, ddof=0) along free axes: mean((x - mean)^2)."""
    m = mean(x, axis, keepdims=True, mask=mask, dtype=float32)
    d = subtract(x, m, dtype=float32, mask=mask)
    return mean(multiply(d, d, mask=mask), axis, dtype=dtype or x.dtype, mask=mask,
                keepdims=keepdims)


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None, mask=None, **_):
    """x * rsqrt(sum(x^2 along axis) / n + epsilon) * w (n: the count the mean divides by)."""
    ss = sum(square(x, dtype=float32, mask=mask), axis, keepdims=True, mask=mask)
    r = rsqrt(add(multiply(ss, 1.0 / n), float(epsilon)))
    return multiply(multiply(x, r, dtype=float32, mask=mask), w, dtype=dtype or x.dtype,
                    mask=mask)


def softmax(x, axis, dtype=None, mask=None, **_):
    """exp(x - max) / sum(exp(x - max)) along free axes."""
    m = max(x, axis, keepdims=True, mask=mask, dtype=float32)
    e = exp(subtract(x, m, dtype=float32, mask=mask), mask=mask)
    s = sum(e, axis, keepdims=True, mask=mask)
    return divide(e, s, dtype=dtype or x.dtype, mask=mask)


# --- matmul ------------------------------------------------------------------------------------

def matmul(x, y, transpose_x=False, mask=None, **_):
    """x @ y into a new float32 PSUM tile. x is [M, K] (or, with transpose_x=True, [K, M]:
    the Tensor Engine's stationary layout); y is [K, N]; K, M <= 128, N <= 512. Accumulate
    K tiles with `psum_tile += nl.matmul(...)`."""
    if not isinstance(x, NkiTensor) or not isinstance(y, NkiTensor) or x.ndim != 2 or y.ndim != 2:
        fail("nl.matmul takes two 2-D tiles")
    stationary = x if transpose_x else NkiTensor(x._buf, x.offset, x.shape[::-1], x.strides[::-1])
    _emit.check_matmul(stationary, y)
    out = new_buffer((stationary.shape[1], y.shape[1]), "float32", "psum")
    _emit.emit_matmul(out, stationary, y, accumulate=False)
    return out


# --- debugging ---------------------------------------------------------------------------------

def device_print(print_prefix, tensor, **_):
    """Prints `print_prefix` and the tile's (or HBM tensor's) values as they are at this point
    of the kernel, once it has run: the values are copied into a hidden output of the traced
    program, printed to stdout when the launch completes (a launch on neuron tensors with
    device_print waits for its kernel), one line per grid instance."""
    if not isinstance(tensor, NkiTensor):
        fail(f"nl.device_print({print_prefix!r}, ...) takes a tile or HBM tensor")
    t = _trace.current()
    n = builtins.max(1, int(np.prod(t.grid))) if t.grid else 1
    buf = _trace.Buffer(t, "hbm", (n, *tensor.shape), tensor._buf.dtype, "print")
    index = int(np.ravel_multi_index(t.program_ids, t.grid)) if t.grid else 0
    _emit.copy_into(NkiTensor(buf)[index], tensor, allow_hbm=True)
    t.prints.append((buf.id, str(print_prefix)))


def __getattr__(name):
    # nl.bool (nki-library's dtype lookup): a module global named `bool` would shadow the
    # builtin inside this module, so it is served here
    if name == "bool":
        return np.bool_
    raise AttributeError(f"module 'nki.language' has no attribute {name!r}")
