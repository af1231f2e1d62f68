"""nisa instructions that select, replace or accumulate per partition (tensor_scalar_reduce,
range_select, tensor_copy_predicated, nc_match_replace8) and the engines' accumulator registers
they share with select_reduce and activation, modelled as hidden float32 [128, 1] tiles of the
trace. Each is composed of the executor's elementwise instructions when traced; no Python runs
per element. isa.py re-exports them (both generations: Beta 1 keywords, 0.x destination first)."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._emit import Expr, emit, new_buffer, reduce_into
from openneuron.nki._tensor import IndexExpr, NkiTensor
from openneuron.nki._trace import fail
from openneuron.nki.isa import _column, _flat, _op_name, _out, reduce_cmd

# keywords the hardware reads and the executor does not need
_IGNORED = ("name", "engine", "dge_mode", "priority", "oob_mode")
_UNSET = object()


def parse_call(name, args, kwargs, params, defaults, keyword_only=()):
    """(dst, {param: value}) of a call whose Beta 1 form passes everything by name and whose
    0.x form puts the destination first (positionally or as dst=), then `params` in order."""
    dst = kwargs.pop("dst", None)
    args = list(args)
    if dst is None and args:
        dst = args.pop(0)
    if len(args) > len(params):
        fail(f"nisa.{name}: {len(args) + 1} positional arguments; it takes at most "
             f"{len(params) + 1} (dst, {', '.join(params)})")
    values = dict(zip(params, args))
    for k, v in kwargs.items():
        if k in _IGNORED:
            continue
        if k not in params and k not in keyword_only:
            fail(f"nisa.{name}: unexpected argument {k!r}")
        if k in values:
            fail(f"nisa.{name}: {k} given twice")
        values[k] = v
    for k, v in defaults.items():
        values.setdefault(k, v)
    missing = [p for p in params if p not in values]
    if missing:
        fail(f"nisa.{name}: missing {', '.join(missing)}")
    return dst, values


def _tile(name, what, x):
    if not isinstance(x, NkiTensor):
        fail(f"nisa.{name}: {what} must be a tile, got {type(x).__name__}")
    if x._buf.kind == "hbm":
        fail(f"nisa.{name}: {what} is in HBM; load it into SBUF first")
    return x


def _per_partition(name, what, x, p):
    """A number, or a tile of one value per partition as a [p, 1] view."""
    if isinstance(x, NkiTensor):
        if x.shape[0] != p or x.size != p:
            fail(f"nisa.{name}: {what} {list(x.shape)} must be a number or one value per "
                 f"partition ([{p}, 1])")
        return _column(_tile(name, what, x), p)
    if not isinstance(x, (int, float, np.number)) or isinstance(x, bool):
        fail(f"nisa.{name}: {what} must be a number or a [{p}, 1] tile, got {type(x).__name__}")
    return float(x)


def _same_rows(name, what, x, p, f, shape=None):
    """x as a [p, f] view, or a view of `shape` (p partitions of f elements), pairing the
    same partitions and elements per partition in order."""
    shape = (p, f) if shape is None else tuple(shape)
    if x.shape[0] != p or x.size != p * f:
        fail(f"nisa.{name}: {what} {list(x.shape)} must have {p} partitions of {f} elements")
    v = x if tuple(x.shape) == shape else x.as_shape(shape)
    return _flat(x, name, what) if v is None else v


# --- the engines' accumulator registers ---------------------------------------------------------

_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf,
             "abs_max": 0.0, "abs_min": np.inf}


def accumulate(name, S, expr, result, op, cmd, mask=None, init=None, regs="vector_acc"):
    """reduce_cmd on an engine's accumulators (`regs`: the Vector Engine's, or "scalar_acc" for
    the Scalar Engine's reduce_regs): reset / reset_reduce set partitions 0..S[0]-1 to op's
    identity, load_reduce to init, reduce keeps them; then, except for idle and reset, they
    take op of themselves and op over all free axes of `result` (an expression over S)."""
    p = S[0]
    cmd = reduce_cmd(int(cmd))
    if cmd == reduce_cmd.idle:
        return
    t = _trace.current()
    acc = getattr(t, regs, None)
    if cmd == reduce_cmd.reduce and acc is None:
        fail(f"nisa.{name}: reduce_cmd=reduce continues an accumulation that no instruction of "
             f"this kernel started; use reduce_cmd.reset_reduce first")
    if acc is None:
        acc = new_buffer((_trace.PMAX, 1), "float32", "sbuf")
        setattr(t, regs, acc)
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        _emit.copy_into(acc[0:p, :], _IDENTITY[op])
    elif cmd == reduce_cmd.load_reduce:
        if init is None:
            fail(f"nisa.{name}: reduce_cmd=load_reduce needs reduce_init")
        _emit.copy_into(acc[0:p, :], init)
    if cmd != reduce_cmd.reset:
        reduce_into(acc[0:p, :], S, list(range(1, len(S))), expr, result, op, keepdims=True,
                    mask=mask, accumulate=op)


def read_accumulators(name, reduce_res, p, negate=False, regs="vector_acc"):
    """reduce_res (one value per partition) <- the accumulators (negated if asked)."""
    acc = getattr(_trace.current(), regs, None)
    if acc is None:
        fail(f"nisa.{name}: reduce_res with reduce_cmd=idle reads accumulators no instruction of "
             f"this kernel set; pass reduce_cmd=nisa.reduce_cmd.reset_reduce")
    if not isinstance(reduce_res, NkiTensor) or reduce_res.shape[0] != p or reduce_res.size != p:
        fail(f"nisa.{name}: reduce_res {list(getattr(reduce_res, 'shape', ()))} must be a "
             f"[{p}, 1] tile")
    e = Expr()
    r = e.src(acc[0:p, :])
    emit(_column(_tile(name, "reduce_res", reduce_res), p), (p, 1), e,
         e.op("neg", r) if negate else r)


# --- tensor_scalar_reduce ------------------------------------------------------------------------

_REDUCE_OPS = ("add", "multiply", "maximum", "minimum")


def tensor_scalar_reduce(*args, **kwargs):
    """dst = data op0 operand0 (operand0 a number or a [P, 1] tile; reverse0 swaps the operands;
    a unary op0 takes operand0 None or 0), and reduce_op (add, multiply, max, min) of dst over
    all its free axes into the Vector Engine's accumulators, which reduce_res ([P, 1]) receives
    (negated with reduce_res_negate). reduce_cmd: reset_reduce (default), reduce (on top of what
    they hold) or load_reduce (from reduce_init, a number or a [P, 1] tile). Beta 1:
    tensor_scalar_reduce(data=, op0=, operand0=, reduce_op=, reduce_res=) returns dst; 0.x:
    tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, ...)."""
    name = "tensor_scalar_reduce"
    dst, v = parse_call(
        name, args, kwargs,
        ("data", "op0", "operand0", "reduce_op", "reduce_res", "reverse0", "reduce_cmd",
         "reduce_init", "reduce_res_negate"),
        {"reduce_res": None, "reverse0": False, "reduce_cmd": reduce_cmd.reset_reduce,
         "reduce_init": None, "reduce_res_negate": False, "dtype": None, "mask": None},
        keyword_only=("dtype", "mask"))
    data = _tile(name, "data", v["data"])
    x = _flat(data, name, "data")
    p, f = x.shape
    op0 = _op_name(v["op0"])
    if op0.startswith("bitwise_"):
        fail(f"nisa.{name}: op0 {op0} is a bitvec operator; only arithmetic operators are "
             f"supported")
    unary = _trace.ARITY[op0] == 1
    if unary and v["operand0"] not in (None, 0, 0.0):
        fail(f"nisa.{name}: op0 {op0} is unary; operand0 must be None or 0")
    if _trace.ARITY[op0] > 2:
        fail(f"nisa.{name}: unsupported operator {op0}")
    rop = _op_name(v["reduce_op"], 2)
    if rop == "subtract":
        fail(f"nisa.{name}: reduce_op subtract is not supported here (the documentation does not "
             f"define its order); reduce with nl.add and negate")
    if rop not in _REDUCE_OPS:
        fail(f"nisa.{name}: reduce_op {rop}; it must be nl.add, nl.multiply, nl.max or nl.min")
    cmd = reduce_cmd(int(v["reduce_cmd"]))
    if cmd not in (reduce_cmd.reset_reduce, reduce_cmd.reduce, reduce_cmd.load_reduce):
        fail(f"nisa.{name}: reduce_cmd {cmd.name}; it must be reset_reduce, reduce or load_reduce")
    init = v["reduce_init"]
    if init is not None and cmd != reduce_cmd.load_reduce:
        fail(f"nisa.{name}: reduce_init is only read with reduce_cmd=load_reduce")
    if cmd == reduce_cmd.load_reduce:
        if init is None:
            fail(f"nisa.{name}: reduce_cmd=load_reduce needs reduce_init")
        if isinstance(init, NkiTensor) and init._buf.dtype != "float32":
            fail(f"nisa.{name}: reduce_init dtype {init._buf.dtype}; it must be float32")
        init = _per_partition(name, "reduce_init", init, p)
    if dst is None and v["reduce_res"] is None:
        fail(f"nisa.{name}: reduce_res (a [{p}, 1] tile) is required")
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    out = _out(dst, data.shape, v["dtype"] or data.dtype)
    out2 = _same_rows(name, "dst", _tile(name, "dst", out), p, f)
    e = Expr()
    xr = e.src(x)
    if unary:
        r = e.op(op0, xr)
    else:
        y = e.src(_per_partition(name, "operand0", v["operand0"], p))
        r = e.op(op0, *((y, xr) if v["reverse0"] else (xr, y)))
    emit(out2, (p, f), e, r, mask=v["mask"])
    e = Expr()
    accumulate(name, (p, f), e, e.src(out2), rop, cmd, mask=v["mask"], init=init)
    if v["reduce_res"] is not None:
        read_accumulators(name, v["reduce_res"], p, negate=bool(v["reduce_res_negate"]))
    return out if dst is None else None


# --- range_select --------------------------------------------------------------------------------

_COMPARES = ("equal", "less", "less_equal", "greater", "greater_equal")
_FP32_MIN = float(np.finfo(np.float32).min)


def range_select(*args, **kwargs):
    """dst = on_true_tile where comp_op0(i, bound0) and comp_op1(i, bound1) hold, else
    on_false_value (which must be nl.fp32.min), i = range_start + the flattened free index,
    compared in float32 with bound0 / bound1 (float32, one value per partition); the selected
    values' max goes into the Vector Engine's accumulators per reduce_cmd and reduce_res receives
    them. Beta 1: range_select(on_true_tile=, comp_op0=, ...) returns dst (reduce_cmd idle by
    default: a reduce_res without reduce_cmd gets this call's max, its numpy equivalent); 0.x:
    range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reset_reduce,
    reduce_res=None, ...)."""
    name = "range_select"
    dst, v = parse_call(
        name, args, kwargs,
        ("on_true_tile", "comp_op0", "comp_op1", "bound0", "bound1", "reduce_cmd", "reduce_res",
         "reduce_op", "range_start", "on_false_value"),
        {"reduce_cmd": _UNSET, "reduce_res": None, "reduce_op": "maximum", "range_start": 0,
         "on_false_value": _FP32_MIN, "dtype": None, "mask": None},
        keyword_only=("dtype", "mask"))
    src = _tile(name, "on_true_tile", v["on_true_tile"])
    if not _trace.is_float(src._buf.dtype):
        fail(f"nisa.{name}: on_true_tile dtype {src._buf.dtype}; it must be a float dtype")
    x = _flat(src, name, "on_true_tile")
    p, f = x.shape
    comps = []
    for key in ("comp_op0", "comp_op1"):
        c = _op_name(v[key], 2)
        if c not in _COMPARES:
            fail(f"nisa.{name}: {key} {c}; it must be nl.equal, nl.less, nl.less_equal, "
                 f"nl.greater or nl.greater_equal")
        comps.append(c)
    bounds = []
    for key in ("bound0", "bound1"):
        b = _tile(name, key, v[key])
        if b._buf.dtype != "float32":
            fail(f"nisa.{name}: {key} dtype {b._buf.dtype}; bounds are float32")
        bounds.append(_per_partition(name, key, b, p))
    if _op_name(v["reduce_op"], 2) != "maximum":
        fail(f"nisa.{name}: reduce_op must be nl.maximum (the only one it supports)")
    start = v["range_start"]
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
        fail(f"nisa.{name}: range_start must be a compile-time integer, got "
             f"{type(start).__name__}")
    start = int(start)
    if start < -(1 << 24) or start + f - 1 > (1 << 24):
        fail(f"nisa.{name}: range_start {start} + the free index (up to {f - 1}) leaves the "
             f"float32-exact range (+-2^24)")
    fill = v["on_false_value"]
    if not isinstance(fill, (int, float, np.number)) or np.float32(fill) != np.float32(_FP32_MIN):
        fail(f"nisa.{name}: on_false_value must be nl.fp32.min (-3.4028235e+38, a hardware "
             f"constraint), got {fill!r}")
    cmd = v["reduce_cmd"]
    if cmd is _UNSET:  # Beta 1 defaults to idle, 0.x to reset_reduce
        cmd = reduce_cmd.reset_reduce if (dst is not None or v["reduce_res"] is not None) \
            else reduce_cmd.idle
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    out = _out(dst, src.shape, v["dtype"] or src.dtype)
    out2 = _same_rows(name, "dst", _tile(name, "dst", out), p, f)

    def selected():
        e = Expr()
        i = e.src(IndexExpr((p, f), start, (0, 1)))
        c0 = e.op(comps[0], i, e.src(bounds[0]))
        c1 = e.op(comps[1], i, e.src(bounds[1]))
        return e, e.op("select", e.op("logical_and", c0, c1), e.src(x), e.src(_FP32_MIN))

    emit(out2, (p, f), *selected(), mask=v["mask"])
    accumulate(name, (p, f), *selected(), "maximum", cmd, mask=v["mask"])
    if v["reduce_res"] is not None:
        read_accumulators(name, v["reduce_res"], p)
    return out if dst is None else None


# --- tensor_copy_predicated ----------------------------------------------------------------------

def tensor_copy_predicated(*args, **kwargs):
    """dst = src where predicate (uint8 / uint16 / uint32; nonzero is true, negated by
    reverse_pred), dst unchanged elsewhere; src a tile of dst's dtype or a number. Beta 1:
    tensor_copy_predicated(src=, dst=, predicate=); 0.x: tensor_copy_predicated(dst, src,
    predicate, reverse_pred=False). Writes dst; returns None."""
    name = "tensor_copy_predicated"
    dst, v = parse_call(name, args, kwargs, ("src", "predicate", "reverse_pred"),
                        {"reverse_pred": False, "dtype": None, "mask": None},
                        keyword_only=("dtype", "mask"))
    if dst is None:
        fail(f"nisa.{name}: dst is required (the tile written where predicate holds)")
    dst = _tile(name, "dst", dst)
    d = dst.as_shape((dst.shape[0], dst.size // max(dst.shape[0], 1)))
    d = d if d is not None else dst  # N-D if strided
    p, f = dst.shape[0], dst.size // max(dst.shape[0], 1)
    pred = _tile(name, "predicate", v["predicate"])
    if pred._buf.dtype not in ("uint8", "uint16", "uint32"):
        fail(f"nisa.{name}: predicate dtype {pred._buf.dtype}; it must be uint8, uint16 or uint32")
    pr = _same_rows(name, "predicate", pred, p, f, d.shape)
    if v["dtype"] is not None and _trace.dtype_name(v["dtype"]) != dst._buf.dtype:
        fail(f"nisa.{name}: dtype {_trace.dtype_name(v['dtype'])} differs from dst's "
             f"{dst._buf.dtype}; the copy does not convert")
    src = v["src"]
    if isinstance(src, NkiTensor):
        _tile(name, "src", src)
        if src._buf.dtype != dst._buf.dtype:
            fail(f"nisa.{name}: src dtype {src._buf.dtype} differs from dst's {dst._buf.dtype}")
        if src._buf.kind == "psum" and pred._buf.kind == "psum":
            fail(f"nisa.{name}: src and predicate cannot both be in PSUM")
        src = _same_rows(name, "src", src, p, f, d.shape)
    elif not isinstance(src, (int, float, np.number)) or isinstance(src, bool):
        fail(f"nisa.{name}: src must be a tile or a number, got {type(src).__name__}")
    else:
        src = float(src)
    e = Expr()
    cond = e.src(pr)
    if v["reverse_pred"]:
        cond = e.op("logical_not", cond)
    emit(d, d.shape, e, e.op("select", cond, e.src(src), e.src(d)), mask=v["mask"])


# --- nc_match_replace8 ---------------------------------------------------------------------------

def nc_match_replace8(*args, **kwargs):
    """The data tile with the first occurrence of each of the 8 values per partition of `vals`
    replaced by imm (compared in float32, free axes flattened, each value matched after the
    previous replacements, as NKI's numpy model does); dst_idx ([P, 8], optional) receives the
    positions (0 for a value not found, which is left in place). Beta 1:
    nc_match_replace8(data=, vals=, imm=, dst_idx=None) returns the tile and takes vals in
    order; 0.x: nc_match_replace8(dst, data, vals, imm, dst_idx=None) takes them from the last
    (repeated values pair with their occurrences in descending order, as documented)."""
    name = "nc_match_replace8"
    dst, v = parse_call(name, args, kwargs, ("data", "vals", "imm", "dst_idx"),
                        {"dst_idx": None, "dtype": None, "mask": None},
                        keyword_only=("dtype", "mask"))
    data = _tile(name, "data", v["data"])
    mask = v["mask"]
    if mask is not None and data.ndim != 2:
        fail(f"nisa.{name}: a mask needs a 2-D data tile, got {list(data.shape)}")
    x = _flat(data, name, "data")
    p, f = x.shape
    if f > 16384:
        fail(f"nisa.{name}: data has {f} elements per partition; at most 16,384")
    vals = _same_rows(name, "vals", _tile(name, "vals", v["vals"]), p, 8)
    imm = v["imm"]
    if not isinstance(imm, (int, float, np.number)) or isinstance(imm, bool):
        fail(f"nisa.{name}: imm must be a number, got {type(imm).__name__}")
    idx = v["dst_idx"]
    if idx is not None:
        idx = _same_rows(name, "dst_idx", _tile(name, "dst_idx", idx), p, 8)
        dt = idx._buf.dtype
        if dt != "float32" and (_trace.is_float(dt) or np.iinfo(dt).max < f - 1):
            fail(f"nisa.{name}: dst_idx dtype {dt} cannot hold positions up to {f - 1}")
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    out = _out(dst, data.shape, v["dtype"] or data.dtype)
    out2 = _same_rows(name, "dst", _tile(name, "dst", out), p, f)
    work = new_buffer((p, f), "float32", "sbuf")
    _emit.copy_into(work, x)
    first = new_buffer((p, 1), "float32", "sbuf")
    position = IndexExpr((p, f), 0, (0, 1))
    for k in (range(8) if dst is None else range(7, -1, -1)):
        e = Expr()
        hit = e.op("equal", e.src(work), e.src(vals[:, k:k + 1]))
        reduce_into(first, (p, f), [1], e, e.op("select", hit, e.src(position), e.src(float(f))),
                    "minimum", keepdims=True, mask=mask)
        e = Expr()
        w = e.src(work)
        emit(work, (p, f), e,
             e.op("select", e.op("equal", e.src(position), e.src(first)), e.src(float(imm)), w))
        if idx is not None:
            e = Expr()
            at = e.src(first)
            emit(idx[:, k:k + 1], (p, 1), e,
                 e.op("select", e.op("less", at, e.src(float(f))), at, e.src(0.0)))
    _emit.copy_into(out2, work, mask=mask)
    return out if dst is None else None
