"""nisa instructions that run along a partition's free axis or feed the Vector Engine's
accumulators: tensor_scalar_cumulative (a running reduction, the executor's scan),
sequence_bounds (segment starts by a forward scan, ends by one over reversed views),
nonzero_with_count (the executor's kNonzero) and exponential. Each is a few executor instructions when traced; no Python runs per element. The
accumulator model (reduce_cmd) is _isa_vector.py's; isa.py re-exports these."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._emit import Expr, emit, new_buffer
from openneuron.nki._isa_vector import (
    _per_partition,
    _same_rows,
    _tile,
    accumulate,
    parse_call,
    read_accumulators,
)
from openneuron.nki._tensor import IndexExpr, NkiTensor
from openneuron.nki._trace import Instr, Operand, fail
from openneuron.nki.isa import _flat, _is_operator, _op_name, _out, reduce_cmd

# The accumulator a reset gives each reduction (NKI's pseudocode: subtract starts at 0 too).
_RESET = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}
_NO_INT32 = ("int32", "uint32")


def _float32_tile(name, what, x):
    if isinstance(x, NkiTensor) and x._buf.dtype != "float32":
        fail(f"nisa.{name}: {what} dtype {x._buf.dtype}; it must be float32")
    return x


def _vector_acc(p):
    """Partitions 0..p-1 of the Vector Engine's accumulators (created on first use)."""
    t = _trace.current()
    if getattr(t, "vector_acc", None) is None:
        t.vector_acc = new_buffer((_trace.PMAX, 1), "float32", "sbuf")
    return t.vector_acc[0:p, :]


def _beta1_positional(args):
    """Beta 1 passes src first and the operators next; 0.x puts dst before src."""
    return len(args) >= 2 and _is_operator(args[1])


# --- tensor_scalar_cumulative ------------------------------------------------------------------

def tensor_scalar_cumulative(*args, **kwargs):
    """Per partition, along the flattened free axis: reg = op1(op0(src[i], imm0), reg) (op0's
    operands swapped by reverse0), dst[i] = reg, reg a float32 Vector Engine accumulator that
    reduce_cmd starts: reset_reduce (op1's identity; 0 for subtract), load_reduce (imm1) or
    reduce (where the last accumulating instruction left it). imm0 / imm1: a number or a
    float32 [P, 1] tile. 0.x: tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None,
    reduce_cmd=reset_reduce); Beta 1 (no dst) returns the result (src's dtype or dtype=).
    Runs as the executor's scan."""
    name = "tensor_scalar_cumulative"
    if _beta1_positional(args):
        args = (None, *args)
    dst, v = parse_call(
        name, args, kwargs, ("src", "op0", "op1", "imm0", "imm1", "reduce_cmd", "reverse0"),
        {"imm1": None, "reduce_cmd": reduce_cmd.reset_reduce, "reverse0": False, "dtype": None},
        keyword_only=("dtype",))
    src = _tile(name, "src", v["src"])
    x = _flat(src, name, "src")
    p, f = x.shape
    op0 = _op_name(v["op0"])
    if _trace.ARITY[op0] != 2 or op0.startswith("bitwise_") or op0 in ("left_shift",
                                                                       "right_shift"):
        fail(f"nisa.{name}: op0 {op0}; it must be a binary arithmetic operator")
    op1 = _op_name(v["op1"], 2)
    if op1 not in _RESET:
        fail(f"nisa.{name}: op1 {op1}; it must be nl.add, nl.subtract, nl.multiply, nl.maximum "
             f"or nl.minimum")
    cmd = reduce_cmd(int(v["reduce_cmd"]))
    if cmd not in (reduce_cmd.reset_reduce, reduce_cmd.reduce, reduce_cmd.load_reduce):
        fail(f"nisa.{name}: reduce_cmd {cmd.name}; it must be reset_reduce, reduce or load_reduce")
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    out = _out(dst, src.shape, v["dtype"] or src.dtype)
    out2 = _same_rows(name, "dst", _tile(name, "dst", out), p, f)
    for what, t in (("src", src), ("dst", out)):
        if t._buf.dtype in _NO_INT32:
            fail(f"nisa.{name}: {what} dtype {t._buf.dtype} is not supported (the Vector Engine "
                 f"does not take int32 / uint32 here); use float32 or a narrower integer")
    imm0 = _per_partition(name, "imm0", _float32_tile(name, "imm0", v["imm0"]), p)
    if cmd == reduce_cmd.load_reduce:
        if v["imm1"] is None:
            fail(f"nisa.{name}: reduce_cmd=load_reduce loads the accumulator from imm1; pass it")
        initial = _per_partition(name, "imm1", _float32_tile(name, "imm1", v["imm1"]), p)
    elif cmd == reduce_cmd.reduce:
        if getattr(_trace.current(), "vector_acc", None) is None:
            fail(f"nisa.{name}: reduce_cmd=reduce continues an accumulation that no instruction "
                 f"of this kernel started; use reduce_cmd.reset_reduce first")
        initial = _vector_acc(p)
    else:
        initial = _RESET[op1]
    # op0 as its own instruction (float32), then the scan reg = op1(value, reg); the scan keeps
    # its carry as stored, so it writes float32 and dst takes a converting copy.
    e = Expr()
    xr, y = e.src(x), e.src(imm0)
    value = new_buffer((p, f), "float32", "sbuf")
    emit(value, (p, f), e, e.op(op0, *((y, xr) if v["reverse0"] else (xr, y))))
    run = out2 if out2._buf.dtype == "float32" else new_buffer((p, f), "float32", "sbuf")
    e = Expr()
    d0, zero, carry = e.src(value), e.src(0.0), e.src(initial)
    emit(run, (p, f), e, e.op("add", e.op(op1, d0, carry), zero), kind=2)
    if run is not out2:
        _emit.copy_into(out2, run)
    if f:
        _emit.copy_into(_vector_acc(p), run[:, f - 1:f])
    return out if dst is None else None


# --- sequence_bounds ---------------------------------------------------------------------------

def _equal_neighbours(seq, n, step):
    """float32 [1, n]: 1 where seq[i] == seq[i + step] (step -1: the element before, +1: after),
    0 at the end that has no such neighbour."""
    eq = new_buffer((1, n), "float32", "sbuf")
    edge = 0 if step < 0 else n - 1
    _emit.copy_into(eq[:, edge:edge + 1], 0.0)
    if n > 1:
        a, b = (seq[:, 1:n], seq[:, 0:n - 1]) if step < 0 else (seq[:, 0:n - 1], seq[:, 1:n])
        e = Expr()
        emit(eq[:, 1:n] if step < 0 else eq[:, 0:n - 1], (1, n - 1), e,
             e.op("equal", e.src(a), e.src(b)))
    return eq


def _reversed(t: NkiTensor, n):
    return NkiTensor(t._buf, t.offset + t.strides[1] * (n - 1), (1, n),
                     (t.strides[0], -t.strides[1]))


def _run_bound(seq, n, step):
    """float32 [1, n]: where each element's run of equal ids starts (step -1: the first index)
    or ends (step +1: one past the last), by a scan from that end: b[i] = same * b[i -+ 1] +
    (1 - same) * own, own = i or i + 1."""
    same = _equal_neighbours(seq, n, step)
    own = new_buffer((1, n), "float32", "sbuf")
    e = Expr()
    at = e.src(IndexExpr((1, n), 0 if step < 0 else 1, (0, 1)))
    emit(own, (1, n), e, e.op("select", e.src(same), e.src(0.0), at))
    bound = new_buffer((1, n), "float32", "sbuf")
    views = (same, own, bound) if step < 0 else tuple(_reversed(t, n) for t in
                                                      (same, own, bound))
    e = Expr()
    d0, d1, carry = e.src(views[0]), e.src(views[1]), e.src(0.0)
    emit(views[2], (1, n), e, e.op("add", e.op("multiply", d0, carry), d1), kind=2)
    return bound


def sequence_bounds(*args, **kwargs):
    """For segment ids [1, n] (float32 or int32; 0 is padding), [1, 2, n]: the start (first
    index) and end (one past the last index) of the run of equal ids each element is in;
    padding gets start n and end -1. 0.x: sequence_bounds(dst, segment_ids); Beta 1:
    sequence_bounds(segment_ids=) returns the bounds in segment_ids' dtype."""
    name = "sequence_bounds"
    dst, v = parse_call(name, args, kwargs, ("segment_ids",), {"dtype": None},
                        keyword_only=("dtype",))
    ids = _tile(name, "segment_ids", v["segment_ids"])
    if ids.shape[0] != 1:
        fail(f"nisa.{name}: segment_ids {list(ids.shape)} must have partition dimension 1")
    if ids._buf.dtype not in ("float32", "int32"):
        fail(f"nisa.{name}: segment_ids dtype {ids._buf.dtype}; it must be float32 or int32")
    seq = _flat(ids, name, "segment_ids")
    n = seq.shape[1]
    if n > (1 << 24):
        fail(f"nisa.{name}: {n} segment ids; at most 2^24 (indices are exact in float32)")
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    out = _out(dst, (1, 2, n), v["dtype"] or ids.dtype)
    out = _tile(name, "dst", out)
    if out._buf.dtype not in ("float32", "int32"):
        fail(f"nisa.{name}: dst dtype {out._buf.dtype}; it must be float32 or int32")
    if out.shape[0] != 1 or out.size != 2 * n:
        fail(f"nisa.{name}: dst {list(out.shape)} must be [1, 2, {n}] for segment_ids "
             f"{list(ids.shape)}")
    res = out.reshape((1, 2, n)) if out.ndim != 3 else out
    if n == 0:
        return out if dst is None else None
    for k, (step, pad) in enumerate(((-1, float(n)), (1, -1.0))):
        bound = _run_bound(seq, n, step)
        e = Expr()
        padding = e.op("equal", e.src(seq), e.src(0.0))
        emit(res[:, k, :], (1, n), e, e.op("select", padding, e.src(pad), e.src(bound)))
    return out if dst is None else None


# --- nonzero_with_count ------------------------------------------------------------------------

def nonzero_with_count(*args, **kwargs):
    """GpSimd's nonzero search (NeuronCore-v3 and newer): in partitions 0, 16, ..., 112 of src
    [P, T] (float32 or int32), the positions of the nonzero elements (a NaN is nonzero) plus
    index_offset, in order, then padding_val up to T elements, then their count: dst [P, T + 1]
    int32. The other partitions of dst are left as they were (each GpSimd core reads and writes
    its first partition only). 0.x: nonzero_with_count(dst, src, index_offset=0,
    padding_val=-1); without dst, a new [P, T + 1] int32 tile is returned."""
    name = "nonzero_with_count"
    dst, v = parse_call(name, args, kwargs, ("src", "index_offset", "padding_val"),
                        {"index_offset": 0, "padding_val": -1})
    src = _tile(name, "src", v["src"])
    if src._buf.dtype not in ("float32", "int32"):
        fail(f"nisa.{name}: src dtype {src._buf.dtype}; it must be float32 or int32")
    x = _flat(src, name, "src")
    p, n = x.shape
    for what in ("index_offset", "padding_val"):
        if not isinstance(v[what], (int, np.integer)) or isinstance(v[what], bool):
            fail(f"nisa.{name}: {what} must be an integer, got {v[what]!r}")
    offset, pad = int(v["index_offset"]), int(v["padding_val"])
    for what, val in (("index_offset", offset + max(n - 1, 0)), ("index_offset", offset),
                      ("padding_val", pad)):
        if not -(1 << 31) <= val < (1 << 31):
            fail(f"nisa.{name}: {what} {val} does not fit the int32 result")
    out = _tile(name, "dst", _out(dst, (p, n + 1), "int32"))
    if out._buf.dtype != "int32":
        fail(f"nisa.{name}: dst dtype {out._buf.dtype}; it must be int32")
    res = _flat(out, name, "dst")
    if res.shape != (p, n + 1):
        fail(f"nisa.{name}: dst {list(out.shape)} must be [{p}, {n + 1}] for src "
             f"{list(src.shape)}: the positions of the nonzero elements, then their count")
    if any(t.dyn is not None for t in (x, res)):
        fail(f"nisa.{name}: an operand is indexed by a run-time value; only "
             f"nisa.tensor_copy_dynamic_src / _dst take such a view")
    t = _trace.current()
    _emit._touch_read(x._buf)
    _emit._touch_write(res._buf, False)  # partitions that are not a core's first stay
    dop = Operand(0, res._buf.dtype, res._buf.id, res.offset, res.strides)
    sop = Operand(0, x._buf.dtype, x._buf.id, x.offset, x.strides)
    instr = Instr(6, [p, n], dop, [sop], line=t.line())
    instr.extra = (offset, pad)
    t.add(instr)
    return out if dst is None else None


# --- exponential -------------------------------------------------------------------------------

def exponential(*args, **kwargs):
    """dst = exp(src - max_value) (max_value a number or a float32 [P, 1] tile), in float32,
    stored in dst's dtype; with reduce_cmd reset_reduce / reduce / load_reduce (from
    reduce_init) the Vector Engine's accumulators add dst over all free axes, and reduce_res
    ([P, 1]) receives them. 0.x: exponential(dst, src, max_value=0.0, reduce_res=None,
    reduce_cmd=idle, reduce_init=0.0); without dst the result is returned (src's float dtype
    or float32, or dtype=)."""
    name = "exponential"
    dst, v = parse_call(
        name, args, kwargs, ("src", "max_value", "reduce_res", "reduce_cmd", "reduce_init"),
        {"max_value": 0.0, "reduce_res": None, "reduce_cmd": reduce_cmd.idle,
         "reduce_init": 0.0, "dtype": None}, keyword_only=("dtype",))
    src = _tile(name, "src", v["src"])
    if src.ndim > 4:
        fail(f"nisa.{name}: src {list(src.shape)} has {src.ndim} dimensions; at most 4")
    x = _flat(src, name, "src")
    p, f = x.shape
    cmd = reduce_cmd(int(v["reduce_cmd"]))
    if cmd == reduce_cmd.reset:
        fail(f"nisa.{name}: reduce_cmd reset; it must be idle, reset_reduce, reduce or "
             f"load_reduce")
    init = v["reduce_init"]
    if cmd != reduce_cmd.load_reduce and not (
            isinstance(init, (int, float, np.number)) and float(init) == 0.0):
        fail(f"nisa.{name}: reduce_init is only read with reduce_cmd=load_reduce; leave it 0.0")
    if cmd == reduce_cmd.load_reduce:
        init = _per_partition(name, "reduce_init", _float32_tile(name, "reduce_init", init), p)
    mx = _per_partition(name, "max_value", _float32_tile(name, "max_value", v["max_value"]), p)
    if v["dtype"] is not None and dst is not None:
        fail(f"nisa.{name}: dtype is the Beta 1 result's dtype; with dst the result takes dst's")
    default = src._buf.dtype if _trace.is_float(src._buf.dtype) else "float32"
    out = _out(dst, src.shape, v["dtype"] or default)
    out = _tile(name, "dst", out)
    if out.ndim > 4:
        fail(f"nisa.{name}: dst {list(out.shape)} has {out.ndim} dimensions; at most 4")
    if out._buf.dtype == "uint32":
        fail(f"nisa.{name}: dst dtype uint32 is not supported")
    out2 = _same_rows(name, "dst", out, p, f)
    res = v["reduce_res"]
    if res is not None and not _trace.is_float(_tile(name, "reduce_res", res)._buf.dtype):
        fail(f"nisa.{name}: reduce_res dtype {res._buf.dtype}; it must be a float dtype")
    e = Expr()
    emit(out2, (p, f), e, e.op("exp", e.op("subtract", e.src(x), e.src(mx))))
    e = Expr()
    accumulate(name, (p, f), e, e.src(out2), "add", cmd, init=init)
    if res is not None:
        read_accumulators(name, res, p)
    return out if dst is None else None
