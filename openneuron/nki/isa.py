"""openneuron.nki.isa (`nisa`): NKI's instruction-level API, both generations in one module.
Beta 1 (neuronxcc.nki.isa) returns a new tile: `t = nisa.tensor_copy(src)`; 0.x (nki.isa) writes
a destination given first: `nisa.tensor_copy(dst, src)` or `dst=`. A call is the 0.x form when it
passes `dst=`, or more positional arguments than the Beta 1 form takes, or (where Beta 1 starts
with an op or a shape) a tile first. Instructions are recorded when traced, as in language.py."""

from __future__ import annotations

import enum
import functools
import inspect
import types

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki import language as nl
from openneuron.nki._emit import Expr, broadcast_shape, emit, new_buffer, reduce_into
from openneuron.nki._tensor import IndexExpr, NkiTensor, Pred, _restride
from openneuron.nki._trace import fail


class engine(enum.IntEnum):
    """The engine an instruction runs on (accepted; the executor runs every engine's work).
    Values as NKI's."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6
    activation = 2  # the Scalar Engine's older name


_Engine = engine
# Beta 1's module constants (deprecated there for engine.*; its published examples use them)
tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


class reduce_cmd(enum.IntEnum):
    """What an instruction does to its engine's accumulator registers (select_reduce,
    range_select, tensor_scalar_reduce: the Vector Engine's; activation: the Scalar Engine's)."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


_ReduceCmd = reduce_cmd


class dge_mode(enum.IntEnum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):
    """What an indirect DMA does with a row index outside its HBM tensor: fail when the kernel
    runs (error, naming the line) or leave that row alone (skip)."""

    error = 0
    skip = 1


_OobMode = oob_mode
_DgeModeEnum = dge_mode


class nc_version(enum.IntEnum):
    gen2 = 2  # Trn1 / Inf2
    gen3 = 3  # Trn2: the generation the device models
    gen4 = 4  # Trn3


class matmul_perf_mode(enum.Enum):
    """nc_matmul's perf_mode (double_row: the contraction over two rows of a [K, 2, F] tile)."""

    none = "none"
    double_row = "double_row"


class dma_engine(enum.IntEnum):
    """The DMA engine of a transfer (accepted; the executor runs every copy the same way)."""

    dma = 1
    gpsimd_dma = 2


def get_nc_sub_version():
    return 0


def get_nc_version():
    return nc_version.gen3


# `nki.isa.constants` (imported as `from neuronxcc.nki.isa.constants import dge_mode`): the
# enums above, as one module
constants = types.ModuleType("nki.isa.constants", "NKI ISA enums (engine, modes, versions).")
for _enum in (engine, reduce_cmd, dge_mode, oob_mode, nc_version, matmul_perf_mode, dma_engine):
    setattr(constants, _enum.__name__, _enum)


fp32 = nl.fp32
NkiValidationError = _trace.NkiError  # what a kernel's invalid use raises


_NUMPY_OPS = {"true_divide": "divide", "absolute": "abs", "negative": "neg", "fmod": "mod",
              "remainder": "mod", "copy": "copy", "positive": "copy"}


_REDUCE_NAMES = {"max": "maximum", "amax": "maximum", "min": "minimum", "amin": "minimum",
                 "sum": "add", "prod": "multiply"}


def _op_name(op, arity=None) -> str:
    name = getattr(op, "_nki_op", None)
    if name is None and isinstance(op, np.ufunc):
        name = _NUMPY_OPS.get(op.__name__, op.__name__)
    if name is None and isinstance(op, str):
        name = op
    if name is None and op is nl.copy:
        name = "copy"
    if name is None and callable(op):  # reductions named as functions: nl.max, np.sum, ...
        name = _REDUCE_NAMES.get(getattr(op, "__name__", ""))
    if name not in _trace.ARITY or (arity is not None and _trace.ARITY[name] != arity):
        fail(f"unsupported {'' if arity is None else ('unary ' if arity == 1 else 'binary ')}"
             f"operator {getattr(op, '__name__', op)!r}")
    return name


def _generations(beta1_positional: int, tile_first_is_dst: bool = False,
                 two_tiles_is_dst: bool = False):
    """Routes a 0.x destination-first call to the Beta 1 body with dst=."""

    def wrap(fn):
        names = list(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            dst = kwargs.pop("dst", None)
            two_tiles = len(args) > 1 and isinstance(args[1], NkiTensor)
            # a keyword naming a parameter the positional arguments already fill: 0.x's dst
            # first, the rest by keyword (nisa.tensor_copy(dst, src=x))
            shifted = any(k in names[:len(args)] for k in kwargs)
            if dst is None and args and isinstance(args[0], NkiTensor) and (
                    len(args) > beta1_positional or tile_first_is_dst or shifted
                    or (two_tiles_is_dst and two_tiles)):
                dst, args = args[0], args[1:]
            out = fn(*args, dst=dst, **kwargs)
            return None if dst is not None else out
        return call

    return wrap


def _out(dst, shape, dtype, kind="sbuf"):
    if dst is not None:
        return dst
    return new_buffer(shape, _trace.dtype_name(dtype), kind)


def _float_dtype(x, dtype):
    if dtype is not None:
        return _trace.dtype_name(dtype)
    d = x._buf.dtype
    return d if _trace.is_float(d) else "float32"


# --- Tensor Engine -----------------------------------------------------------------------------

@_generations(2)
def nc_matmul(stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, mask=None, accumulate=None, perf_mode=None, dst=None, **_):
    """stationary[K, M]^T @ moving[K, N] -> PSUM [M, N] float32. With dst (0.x), accumulate=None
    accumulates onto a matmul result those PSUM locations hold that nothing has read yet (a K
    loop into one PSUM tile; NKI: first write overwrites, later writes accumulate), True always,
    False never. perf_mode double_row (float8 operands [K, 2, M] and [K, 2, N]: two rows of K
    per partition) sums over both."""
    mode = str(getattr(perf_mode, "value", perf_mode) or "none")
    rows = [(stationary, moving)]
    if mode.startswith("double_row"):
        if stationary.ndim != 3 or moving.ndim != 3 or stationary.shape[1] != 2 or \
                moving.shape[1] != 2:
            fail(f"nc_matmul perf_mode={mode}: operands are [K, 2, M] and [K, 2, N], got "
                 f"{list(stationary.shape)} and {list(moving.shape)}")
        if not all(t._buf.dtype.startswith("float8") for t in (stationary, moving)):
            fail(f"nc_matmul perf_mode={mode} packs float8 pairs; operands are "
                 f"{stationary._buf.dtype} and {moving._buf.dtype}")
        rows = [(stationary[:, r, :], moving[:, r, :]) for r in range(2)]
    elif mode != "none":
        fail(f"nc_matmul: unknown perf_mode {mode!r} (none, double_row)")
    for s, m in rows:
        _emit.check_matmul(s, m)
    out = _out(dst, (rows[0][0].shape[1], rows[0][1].shape[1]), "float32", "psum")
    where = (out.offset, out.strides, out.shape)
    acc = accumulate
    if acc is None:
        acc = dst is not None and where in out._buf.mm_open
    for r, (s, m) in enumerate(rows):
        _emit.emit_matmul(out, s, m, accumulate=bool(acc) or r > 0)
    out._buf.mm_open.add(where)  # until an instruction reads the tile (_emit.emit)
    return out


@_generations(1)
def nc_transpose(data, engine=engine.unknown, mask=None, dtype=None, dst=None, **_):
    """[P, F] -> [F, P]: on the Tensor Engine (P, F <= 128, result in PSUM) or the Vector
    Engine (P, F <= 32, result in SBUF)."""
    if data.ndim != 2:
        fail(f"nc_transpose takes a 2-D tile, got {list(data.shape)}")
    p, f = data.shape
    eng = _Engine(engine)
    if eng == _Engine.unknown:
        eng = _Engine.vector if (p <= 32 and f <= 32) else _Engine.tensor
    limit = 32 if eng == _Engine.vector else _trace.PMAX
    if p > limit or f > limit:
        fail(f"nc_transpose of {list(data.shape)} on the {eng.name} engine: both dimensions "
             f"must be at most {limit}")
    kind = "sbuf" if eng == _Engine.vector else "psum"
    out = _out(dst, (f, p), dtype or data.dtype, kind)
    view = NkiTensor(data._buf, data.offset, (f, p), data.strides[::-1])
    _emit.copy_into(out, view, mask=mask)
    return out


# --- Scalar / Vector / GpSimd Engines ----------------------------------------------------------

def _activation_expr(op, data, bias, scale):
    e = Expr()
    x = e.src(data)
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        x = e.op("multiply", x, e.src(scale))
    if bias is not None:
        x = e.op("add", x, e.src(bias))
    return e, e.op(_op_name(op, 1), x)


@_generations(2, tile_first_is_dst=True)
def activation(op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=None, mask=None, dtype=None, dst=None, **_):
    """op(data * scale + bias); scale a number or a [P, 1] tile, bias a [P, 1] tile. With
    reduce_cmd idle (the default) and reduce_res, reduce_res receives this call's reduction
    (reduce_op, add by default) along the free axes. Otherwise the Scalar Engine's reduce_regs:
    reset / reset_reduce zero them, reduce / reset_reduce add this call's reduction (reduce_op)
    on top, and reduce_res receives them."""
    S = broadcast_shape(data, bias) if bias is not None else data.shape
    out = _out(dst, S, _float_dtype(data, dtype))
    e, r = _activation_expr(op, data, bias, scale)
    emit(out, S, e, r, mask=mask)
    cmd = _ReduceCmd(int(reduce_cmd or 0))
    if cmd == _ReduceCmd.idle:
        if reduce_res is not None:
            _reduce_free(reduce_res, S, op, data, bias, scale, reduce_op, mask)
        return out
    if cmd == _ReduceCmd.load_reduce:
        fail("nisa.activation: reduce_cmd load_reduce is not an activation command (idle, reset, "
             "reduce or reset_reduce)")
    rop = _op_name(reduce_op, 2) if reduce_op is not None else "add"
    if rop not in ("add", "multiply", "maximum", "minimum"):
        fail(f"nisa.activation: reduce_op {rop}; it must be nl.add, nl.multiply, nl.max or nl.min")
    if cmd != _ReduceCmd.reduce and rop != "add":  # reduce_regs reset to zero, as documented
        fail(f"nisa.activation: reduce_cmd {cmd.name} resets reduce_regs to zero, which only "
             f"nl.add accumulates onto; use reduce_op=nl.add")
    e, r = _activation_expr(op, data, bias, scale)
    _vector.accumulate("activation", S, e, r, rop, cmd, mask=mask, regs="scalar_acc")
    if reduce_res is not None:
        _vector.read_accumulators("activation", reduce_res, S[0], regs="scalar_acc")
    return out


def _reduce_free(res, S, op, data, bias, scale, reduce_op, mask):
    e, r = _activation_expr(op, data, bias, scale)
    axes = list(range(1, len(S)))
    rop = _op_name(reduce_op, 2) if reduce_op is not None else "add"
    reduce_into(res, S, axes, e, r, rop, keepdims=res.ndim == len(S), mask=mask)


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=None, mask=None, **_):
    """0.x (NeuronCore-v4): dst <- op((data op0 imm0) op1 imm1), imm0 / imm1 numbers or [P, 1]
    tiles, nl.bypass skipping a step, reverse swapping a step's operands; then reduce_cmd on
    the Scalar Engine's reduce_regs (shared with activation) by reduce_op (add, max, min,
    abs_max, abs_min; reset to its identity), reduce_res receiving them."""
    if not isinstance(dst, NkiTensor) or not isinstance(data, NkiTensor):
        fail("nisa.activate2(dst, op, data, ...): dst and data are tiles")
    if dst.shape[0] != data.shape[0] or dst.size != data.size:
        fail(f"nisa.activate2: dst {list(dst.shape)} must hold data {list(data.shape)}'s "
             f"elements in the same partitions")
    if not (isinstance(relu_param, (int, float)) and relu_param == 0.0):
        fail("nisa.activate2: relu_param (a parameterized activation) is not supported here")
    if op1 not in (None, nl.bypass) and op0 in (None, nl.bypass):
        fail("nisa.activate2: op1 needs op0")
    S = data.shape

    def expr():
        e = Expr()
        x = _scalar_step(e, e.src(data), op0, imm0, reverse0)
        x = _scalar_step(e, x, op1, imm1, reverse1)
        return e, e.op(_op_name(op, 1), x)

    e, r = expr()
    emit(dst.reshape(S) if dst.shape != S else dst, S, e, r, mask=mask)
    cmd = _ReduceCmd(int(reduce_cmd or 0))
    rop = _op_name(reduce_op, 2) if reduce_op is not None else "add"
    if rop not in ("add", "maximum", "minimum", "abs_max", "abs_min"):
        fail(f"nisa.activate2: reduce_op {rop}; it must be nl.add, nl.maximum, nl.minimum, "
             f"nl.abs_max or nl.abs_min")
    if cmd == _ReduceCmd.load_reduce:
        fail("nisa.activate2: reduce_cmd load_reduce is not an activation command")
    if cmd != _ReduceCmd.idle:
        e, r = expr()
        _vector.accumulate("activate2", S, e, r, rop, cmd, mask=mask, regs="scalar_acc")
    if reduce_res is not None:
        _vector.read_accumulators("activate2", reduce_res, S[0], regs="scalar_acc")


@_generations(4, tile_first_is_dst=True)
def activation_reduce(op, data, reduce_op=None, reduce_res=None, bias=None, scale=1.0,
                      mask=None, dtype=None, dst=None, **_):
    """activation, and reduce_op (add) of its result along the free axes into reduce_res."""
    if reduce_res is None:
        fail("activation_reduce needs reduce_res (a [P, 1] tile)")
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, mask=mask, dtype=dtype, dst=dst)


@_generations(3)
def tensor_tensor(data1, data2, op, dtype=None, mask=None, engine=engine.unknown, dst=None, **_):
    """data1 op data2, elementwise."""
    S = broadcast_shape(data1, data2)
    name = _op_name(op, 2)
    compare = name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
    dt = dtype or (np.uint8 if compare else _trace.promote(data1._buf.dtype, data2._buf.dtype))
    out = _out(dst, S, dt)
    e = Expr()
    emit(out, S, e, e.op(name, e.src(data1), e.src(data2)), mask=mask)
    return out


def _scalar_step(e, x, op, operand, reverse):
    if op is None or op is nl.bypass:
        return x
    y = e.src(operand)
    return e.op(_op_name(op, 2), *((y, x) if reverse else (x, y)))


@_generations(3, two_tiles_is_dst=True)
def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine=engine.unknown, dst=None, **_):
    """(data op0 operand0) op1 operand1; operands are numbers or [P, 1] tiles (one value per
    partition, broadcast along the free axes); reverse swaps an op's operands."""
    return _two_steps(data, data.shape, op0, operand0, reverse0, op1, operand1, reverse1,
                      dtype, mask, dst)


@_generations(5)
def scalar_tensor_tensor(data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         dtype=None, mask=None, engine=engine.unknown, dst=None, **_):
    """(data op0 operand0) op1 operand1, operand1 a tile."""
    return _two_steps(data, broadcast_shape(data, operand1), op0, operand0, reverse0, op1,
                      operand1, reverse1, dtype, mask, dst)


def _two_steps(data, S, op0, operand0, reverse0, op1, operand1, reverse1, dtype, mask, dst):
    """(data op0 operand0) op1 operand1 into a new tile (or dst) of shape S."""
    out = _out(dst, S, dtype or data.dtype)
    e = Expr()
    x = _scalar_step(e, e.src(data), op0, operand0, reverse0)
    x = _scalar_step(e, x, op1, operand1, reverse1)
    emit(out, S, e, x, mask=mask)
    return out


@_generations(3, tile_first_is_dst=True)
def tensor_reduce(op, data, axis, negate=False, keepdims=False, mask=None, dtype=None,
                  dst=None, **_):
    """op over the free axes `axis` (negated with negate=True)."""
    axes = nl._axes(data, axis)
    shape = [1 if d in axes else s for d, s in enumerate(data.shape)] if keepdims else \
        [s for d, s in enumerate(data.shape) if d not in axes]
    out = _out(dst, shape, dtype or data.dtype)
    keep = keepdims or (dst is not None and dst.ndim == data.ndim)
    e = Expr()
    reduce_into(out, data.shape, axes, e, e.src(data), _op_name(op, 2), keepdims=keep,
                mask=mask, post_scale=-1.0 if negate else 1.0)
    return out


@_generations(2, tile_first_is_dst=True)
def tensor_partition_reduce(op, data, mask=None, dtype=None, dst=None, **_):
    """op across partitions: [P, F] -> [1, F]."""
    shape = (1, *data.shape[1:])
    out = _out(dst, shape, dtype or data.dtype)
    e = Expr()
    reduce_into(out, data.shape, [0], e, e.src(data), _op_name(op, 2), keepdims=True, mask=mask)
    return out


@_generations(1)
def tensor_copy(src, mask=None, dtype=None, engine=engine.unknown, dst=None, **_):
    """A copy of src (cast to dtype, or to dst's dtype)."""
    out = _out(dst, src.shape, dtype or src.dtype)
    _emit.copy_into(out, src, mask=mask)
    return out


@_generations(1)
def reciprocal(data, dtype=None, mask=None, dst=None, **_):
    out = _out(dst, data.shape, _float_dtype(data, dtype))
    e = Expr()
    emit(out, data.shape, e, e.op("reciprocal", e.src(data)), mask=mask)
    return out


@_generations(2, tile_first_is_dst=True)
def iota(expr=None, dtype=None, mask=None, dst=None, pattern=None, offset=0,
         channel_multiplier=0, **_):
    """The values of an index expression (e.g. nl.arange(128)[:, None] * 4 + nl.arange(64)[None,
    :]) as a tile; 0.x: iota(dst, pattern=[[step, num], ...], offset, channel_multiplier), value
    offset + p * channel_multiplier + sum(i_k * step_k) over dst's partitions p and the pattern's
    nested counts (outermost first) walking dst's elements in order."""
    if isinstance(expr, (list, tuple)):
        expr, pattern = None, expr
    if pattern is not None:
        return _iota_pattern(dst, pattern, offset, channel_multiplier, mask)
    if isinstance(expr, (int, np.integer)):
        expr = IndexExpr((1, 1), int(expr), (0, 0))
    if not isinstance(expr, IndexExpr):
        fail("nisa.iota takes an index expression (nl.arange / nl.mgrid arithmetic)")
    out = _out(dst, expr.shape, dtype)
    _emit.copy_into(out, expr, mask=mask)
    return out


def _iota_pattern_expr(dst, pattern, offset, channel_multiplier, what):
    """(dst's view, the affine value offset + p * channel_multiplier + sum(i_k * step_k)) over
    (P, num_0, num_1, ...), or over dst's own axes where its strides do not walk those."""
    steps = [int(s) for s, _ in pattern]
    counts = [int(n) for _, n in pattern]
    P, n = dst.shape[0], int(np.prod(counts, dtype=np.int64))
    if n * P != dst.size:
        fail(f"nisa.{what}: the pattern {[list(p) for p in pattern]} has {n} elements, dst "
             f"{list(dst.shape)} has {dst.size // P} per partition")
    view = dst.as_shape((P, *counts))
    if view is not None:
        return view, IndexExpr((P, *counts), offset, (channel_multiplier, *steps))
    coefs = _restride(counts, steps, dst.shape[1:])  # the pattern walked as dst's free axes
    if coefs is None:
        return dst.reshape((P, *counts)), None  # fails, saying why
    return dst, IndexExpr(dst.shape, offset, (channel_multiplier, *coefs))


def _iota_pattern(dst, pattern, offset, channel_multiplier, mask):
    if dst is None:
        fail("nisa.iota(pattern=...) writes into dst= (the 0.x form)")
    view, expr = _iota_pattern_expr(dst, pattern, offset, channel_multiplier, "iota")
    _emit.copy_into(view, expr, mask=mask)
    return dst


@_generations(3)
def affine_select(pred=None, on_true_tile=None, on_false_value=None, mask=None, dtype=None,
                  dst=None, pattern=None, channel_multiplier=0, cmp_op=None, offset=0, **_):
    """on_true_tile where the affine condition `pred` (on index expressions) holds, else
    on_false_value (e.g. a causal mask: nisa.affine_select(i_q >= i_k, scores, -9984.0)).
    0.x: affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
    cmp_op=nl.equal, offset=0): the condition cmp_op(a, 0) of iota's affine value a."""
    if isinstance(pred, (list, tuple)):  # 0.x positional, dst already taken
        pattern, pred = pred, None
        channel_multiplier, on_true_tile, on_false_value = on_true_tile, on_false_value, mask
        mask = None
    if pattern is not None:
        return _affine_select_pattern(dst, pattern, channel_multiplier, on_true_tile,
                                      on_false_value, cmp_op or nl.equal, offset)
    if not isinstance(pred, Pred):
        fail("nisa.affine_select takes a condition on index expressions as its predicate")
    S = on_true_tile.shape
    out = _out(dst, S, dtype or on_true_tile.dtype)
    _emit.copy_into(out, on_true_tile, mask=mask)
    for c, k in pred.ineqs:  # where any condition fails, the false value
        neg = Pred(pred.shape, [(-c - 1, [-x for x in k])])
        _emit.copy_into(out, on_false_value, mask=neg if mask is None else (neg & mask))
    return out


# a >= 0 conditions (const, coef of a) whose conjunction fails cmp_op(a, 0): the false lanes
_AFFINE_FALSE = {
    "equal": [[(-1, -1)], [(-1, 1)]], "not_equal": [[(0, 1), (0, -1)]],
    "greater_equal": [[(-1, -1)]], "greater": [[(0, -1)]],
    "less_equal": [[(-1, 1)]], "less": [[(0, 1)]],
}


def _affine_select_pattern(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
                           cmp_op, offset):
    if dst is None:
        fail("nisa.affine_select(pattern=...) writes into dst= (the 0.x form)")
    name = _op_name(cmp_op)
    if name not in _AFFINE_FALSE:
        fail(f"nisa.affine_select: cmp_op {name!r} is not a comparison "
             f"({', '.join(sorted(_AFFINE_FALSE))})")
    view, a = _iota_pattern_expr(dst, pattern, offset, channel_multiplier, "affine_select")
    shaped = on_true_tile.as_shape(a.shape)
    _emit.copy_into(view, shaped if shaped is not None else on_true_tile.reshape(a.shape))
    for conj in _AFFINE_FALSE[name]:
        fails = Pred(a.shape, [(c + s * a.const, [s * k for k in a.coefs]) for c, s in conj])
        _emit.copy_into(view, float(on_false_value), mask=fails)
    return dst


@_generations(3, tile_first_is_dst=True)
def memset(shape=None, value=None, dtype=None, mask=None, dst=None, **_):
    """A tile of `shape` filled with value (0.x: memset(dst, value), memset(dst=, value=))."""
    if dst is not None and value is None:
        shape, value = dst.shape, shape
    elif dst is not None and shape is None:
        shape = dst.shape
    out = _out(dst, shape, dtype)
    _emit.copy_into(out, value, mask=mask)
    return out


# --- statistics --------------------------------------------------------------------------------

@_generations(1)
def bn_stats(data, mask=None, dtype=None, dst=None, **_):
    """Per-partition statistics of a [P, F] tile (F <= nl.tile_size.bn_stats_fmax) in the
    6-element form nisa.bn_aggr combines: (count, mean, count * variance, 0, 0, 0)."""
    if data.ndim != 2:
        fail(f"bn_stats takes a 2-D tile, got {list(data.shape)}")
    p, f = data.shape
    if f > _trace.BN_STATS_FMAX:
        fail(f"bn_stats free size {f} exceeds nl.tile_size.bn_stats_fmax ({_trace.BN_STATS_FMAX})"
             f"; compute stats per chunk and combine them with nisa.bn_aggr")
    out = _out(dst, (p, 6), dtype or "float32")
    _emit.copy_into(out[:, 0:1], float(f))
    _emit.copy_into(out[:, 3:6], 0.0)
    e = Expr()
    reduce_into(out[:, 1:2], data.shape, [1], e, e.src(data), "add", keepdims=True, mask=mask,
                post_scale=1.0 / f)
    e = Expr()
    d = e.op("subtract", e.src(data), e.src(out[:, 1:2]))
    reduce_into(out[:, 2:3], data.shape, [1], e, e.op("square", d), "add", keepdims=True,
                mask=mask)
    return out


@_generations(1)
def bn_aggr(data, mask=None, dtype=None, dst=None, **_):
    """Combines bn_stats results [P, 6k] into [P, 2]: (mean, variance)."""
    p, w = data.shape
    if w % 6:
        fail(f"bn_aggr takes bn_stats results ([P, 6 * k]), got {list(data.shape)}")
    k = w // 6
    out = _out(dst, (p, 2), dtype or "float32")
    n = NkiTensor(data._buf, data.offset, (p, k), (data.strides[0], 6 * data.strides[1]))
    m = NkiTensor(data._buf, data.offset + data.strides[1], (p, k), n.strides)
    m2 = NkiTensor(data._buf, data.offset + 2 * data.strides[1], (p, k), n.strides)
    total = new_buffer((p, 1), "float32", "sbuf")
    e = Expr()
    reduce_into(total, (p, k), [1], e, e.src(n), "add", keepdims=True)
    weighted = new_buffer((p, 1), "float32", "sbuf")
    e = Expr()
    reduce_into(weighted, (p, k), [1], e, e.op("multiply", e.src(n), e.src(m)), "add",
                keepdims=True)
    e = Expr()
    emit(out[:, 0:1], (p, 1), e, e.op("divide", e.src(weighted), e.src(total)))
    e = Expr()
    dev = e.op("subtract", e.src(m), e.src(out[:, 0:1]))
    spread = e.op("add", e.src(m2), e.op("multiply", e.src(n), e.op("square", dev)))
    reduce_into(weighted, (p, k), [1], e, spread, "add", keepdims=True)
    e = Expr()
    emit(out[:, 1:2], (p, 1), e, e.op("divide", e.src(weighted), e.src(total)))
    return out


# --- randomness --------------------------------------------------------------------------------

@_generations(2)
def dropout(data, prob, mask=None, dtype=None, dst=None, **_):
    """Zeroes each element with probability prob (a number or a [P, 1] tile)."""
    return nl._dropout(data, prob, dtype, mask, out=dst)


def _dst_first(name, args, kwargs, params):
    """(dst, values of params) of a call whose Beta 1 form takes `params` (positionally or by
    name) and whose 0.x form puts the destination first (or passes dst=)."""
    dst = kwargs.pop("dst", None)
    given = sum(1 for p in params if p in kwargs)
    if dst is None and len(args) + given > len(params):
        dst, args = args[0], args[1:]
    values = dict(zip(params, args))
    for p in params:
        if p in kwargs:
            if p in values:
                fail(f"nisa.{name}: {p} given twice")
            values[p] = kwargs.pop(p)
    missing = [p for p in params if p not in values]
    if missing:
        fail(f"nisa.{name}: missing {', '.join(missing)}")
    return dst, [values[p] for p in params]


def _flat(t, name, what):
    """t as [partitions, free elements] (a view of the same elements)."""
    if not isinstance(t, NkiTensor):
        fail(f"nisa.{name}: {what} must be a tile, got {type(t).__name__}")
    if t.ndim == 2:
        return t
    free = int(np.prod(t.shape[1:], dtype=np.int64)) if t.ndim > 1 else 1
    shaped = t.as_shape((t.shape[0], free))
    return shaped if shaped is not None else t.reshape((t.shape[0], free))


def _column(t, p):
    """A tile of one value per partition ([p], [p, 1], [p, 1, 1] ...) as a [p, 1] view."""
    checks = [(c, (k[0], 0), n, a) for c, k, n, a in t.checks]
    return NkiTensor(t._buf, t.offset, (p, 1), (t.strides[0], 0), checks)


def _is_operator(x) -> bool:
    return callable(x) or isinstance(x, str)


def tensor_tensor_scan(*args, dtype=None, mask=None, **kwargs):
    """Per partition, along the (flattened) free axis: result[:, 0] = op1(op0(data0[:, 0],
    initial), data1[:, 0]), result[:, i] = op1(op0(data0[:, i], result[:, i - 1]), data1[:, i])
    in float32, each result as stored in the output dtype (the numpy model NKI documents);
    reverse0 / reverse1 swap op0's / op1's operands. initial: a number or a tile of one value
    per partition. Beta 1 returns the result; 0.x: tensor_tensor_scan(dst, data0, ...). Runs
    in the executor (no Python per element)."""
    params = ("data0", "data1", "initial", "op0", "op1", "reverse0", "reverse1")
    dst = kwargs.pop("dst", None)
    if dst is None and len(args) >= 4 and not _is_operator(args[3]):
        dst, args = args[0], args[1:]  # 0.x: the operators come one place later
    values = dict(zip(params, args))
    values.update({k: kwargs.pop(k) for k in params if k in kwargs})
    for p in params[:5]:
        if p not in values:
            fail(f"nisa.tensor_tensor_scan: missing {p}")
    a = _flat(values["data0"], "tensor_tensor_scan", "data0")
    b = _flat(values["data1"], "tensor_tensor_scan", "data1")
    if a.shape != b.shape:
        fail(f"nisa.tensor_tensor_scan: data0 {list(values['data0'].shape)} and data1 "
             f"{list(values['data1'].shape)} need the same partitions and elements per partition")
    if a._buf.kind == "psum" and b._buf.kind == "psum":
        fail("nisa.tensor_tensor_scan: data0 and data1 cannot both be in PSUM")
    p, f = a.shape
    initial = values["initial"]
    if isinstance(initial, NkiTensor):
        if initial.shape[0] != p or initial.size != p:
            fail(f"nisa.tensor_tensor_scan: initial {list(initial.shape)} must be one value per "
                 f"partition ([{p}, 1]) or a number")
        initial = _column(initial, p)
    elif not isinstance(initial, (int, float, np.number)):
        fail(f"nisa.tensor_tensor_scan: initial must be a number or a [{p}, 1] tile")
    op0 = _op_name(values["op0"], 2)
    op1 = _op_name(values["op1"], 2)
    dt = dtype or _trace.promote(a._buf.dtype, b._buf.dtype)
    out = _out(dst, values["data0"].shape, dt)
    out2 = _flat(out, "tensor_tensor_scan", "dst")
    if tuple(out2.shape) != (p, f):
        fail(f"nisa.tensor_tensor_scan: dst {list(out.shape)} must hold {f} elements in each of "
             f"{p} partitions")
    e = Expr()
    x0, x1, carry = e.src(a), e.src(b), e.src(initial)
    t = e.op(op0, *((carry, x0) if values.get("reverse0", False) else (x0, carry)))
    r = e.op(op1, *((x1, t) if values.get("reverse1", False) else (t, x1)))
    emit(out2, (p, f), e, r, mask=mask, kind=2)
    return out if dst is None else None


def select_reduce(*args, mask=None, **kwargs):
    """dst = where(predicate (negated by reverse_pred), on_true, on_false), on_false a number or
    a [P, 1] tile; with reduce_cmd reset_reduce / reduce the engine's accumulators take the max
    of dst per partition (reset first / on top of what they hold) and reduce_res (a [P, 1]
    float tile) receives them. 0.x: select_reduce(dst, predicate, on_true, on_false, ...);
    Beta 1 returns dst."""
    reduce_res = kwargs.pop("reduce_res", None)
    cmd = kwargs.pop("reduce_cmd", reduce_cmd.idle)
    rop = kwargs.pop("reduce_op", None)
    reverse = kwargs.pop("reverse_pred", False)
    dtype = kwargs.pop("dtype", None)
    dst, (pred, on_true, on_false) = _dst_first(
        "select_reduce", args, kwargs, ("predicate", "on_true", "on_false"))
    if rop is not None and _op_name(rop, 2) != "maximum":
        fail("nisa.select_reduce: reduce_op must be nl.maximum (the only one it supports)")
    if pred.shape[0] != on_true.shape[0] or pred.size != on_true.size:
        fail(f"nisa.select_reduce: predicate {list(pred.shape)} and on_true "
             f"{list(on_true.shape)} need the same partitions and elements per partition")
    if pred._buf.dtype not in ("int8", "uint8", "int16", "uint16"):
        fail(f"nisa.select_reduce: predicate dtype {pred._buf.dtype}; it must be int8, uint8, "
             f"int16 or uint16")
    if on_true._buf.dtype in ("int32", "uint32"):
        fail(f"nisa.select_reduce: on_true dtype {on_true._buf.dtype} is not supported")
    if pred._buf.kind == "psum" and on_true._buf.kind == "psum":
        fail("nisa.select_reduce: predicate and on_true cannot both be in PSUM")
    p = on_true.shape[0]
    if isinstance(on_false, NkiTensor) and (on_false.shape[0] != p or on_false.size != p):
        fail(f"nisa.select_reduce: on_false {list(on_false.shape)} must be a number or a "
             f"[{p}, 1] tile")
    x = _flat(on_true, "select_reduce", "on_true")
    f = x.shape[1]
    out = _out(dst, on_true.shape, dtype or on_true.dtype)
    out2 = _flat(out, "select_reduce", "dst")
    if tuple(out2.shape) != (p, f):
        fail(f"nisa.select_reduce: dst {list(out.shape)} must match on_true "
             f"{list(on_true.shape)}")
    if isinstance(on_false, NkiTensor):
        on_false = _column(on_false, p)
    e = Expr()
    cond = e.src(_flat(pred, "select_reduce", "predicate"))
    if reverse:
        cond = e.op("logical_not", cond)
    emit(out2, (p, f), e, e.op("select", cond, e.src(x), e.src(on_false)), mask=mask)
    res_dtype = getattr(getattr(reduce_res, "_buf", None), "dtype", None)
    if reduce_res is not None and not _trace.is_float(res_dtype or ""):
        fail(f"nisa.select_reduce: reduce_res dtype {res_dtype}; it must be a float dtype")
    cmd = reduce_cmd(int(cmd))
    if cmd == reduce_cmd.load_reduce:
        fail("nisa.select_reduce: reduce_cmd load_reduce is not supported by select_reduce "
             "(idle, reset, reduce or reset_reduce)")
    e = Expr()
    _vector.accumulate("select_reduce", (p, f), e, e.src(out2), "maximum", cmd, mask=mask)
    if reduce_res is not None:
        _vector.read_accumulators("select_reduce", reduce_res, p)
    return out if dst is None else None


# NOTE: imported last: these modules use the helpers above.
from openneuron.nki import _isa_vector as _vector
from openneuron.nki._isa_cores import core_barrier, sendrecv  # noqa: F401
from openneuron.nki._isa_dma import dma_compute, dma_copy, local_gather, nc_n_gather  # noqa: F401
from openneuron.nki._isa_dynamic import (  # noqa: F401
    register_alloc,
    register_load,
    register_move,
    register_store,
    tensor_copy_dynamic_dst,
    tensor_copy_dynamic_src,
)
from openneuron.nki._isa_move import dma_transpose, nc_stream_shuffle  # noqa: F401
from openneuron.nki._isa_scan import (  # noqa: F401
    exponential,
    nonzero_with_count,
    sequence_bounds,
    tensor_scalar_cumulative,
)
from openneuron.nki._isa_search import max8, nc_find_index8  # noqa: F401
from openneuron.nki._isa_vector import (  # noqa: F401
    nc_match_replace8,
    range_select,
    tensor_copy_predicated,
    tensor_scalar_reduce,
)
from openneuron.nki._random import (  # noqa: F401
    rand2,
    rand_get_state,
    rand_set_state,
    rng,
    set_rng_seed,
)
from openneuron.nki._scalar import NkiScalar, scalar_alu, scalar_load, scalar_store  # noqa: F401
