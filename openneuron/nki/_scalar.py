"""NkiScalar: one 32-bit integer computed on the device (nisa.scalar_load / scalar_store /
scalar_alu and Python's operators on scalars), usable as an access pattern's scalar_offset, an
nl.ds start, a bound of nl.fori_loop / nl.dynamic_range and the condition of nl.if_else.

Arithmetic is traced, not evaluated: each operator records the executor's integer scalar
instruction (csrc/nki program.h kScalar: int32 that wraps, division toward zero, the remainder
with the dividend's sign, comparisons giving 1 or 0) into a new hidden one-element int32 SBUF
tile, so a scalar is that tile (an NkiTensor: whatever takes a register takes a scalar). Two
Python ints give a Python result without an instruction. isa.py re-exports the functions."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _trace
from openneuron.nki._emit import new_buffer
from openneuron.nki._tensor import NkiTensor
from openneuron.nki._trace import Instr, Operand, fail

KIND_SCALAR = 9  # csrc/nki/program.h Kind::kScalar
_INTS = ("int32", "uint32", "int16", "uint16", "int8", "uint8")
_OPS = {"add", "subtract", "multiply", "divide", "fmod", "maximum", "minimum", "less",
        "less_equal", "greater", "greater_equal", "equal", "not_equal"}
_EXECUTOR_OPS = {"fmod": "mod"}  # the executor's op codes for these names


def _python(op: str, a: int, b: int):
    """Two Python ints: the result now, as the documentation says (bool for a comparison)."""
    if op in ("divide", "fmod") and b == 0:
        fail(f"nisa.scalar_alu: integer division by zero ({a} {'/' if op == 'divide' else '%'} 0)")
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1) if b else 0
    return {"add": a + b, "subtract": a - b, "multiply": a * b, "divide": q,
            "fmod": a - q * b if b else 0, "maximum": max(a, b), "minimum": min(a, b),
            "less": a < b, "less_equal": a <= b, "greater": a > b, "greater_equal": a >= b,
            "equal": a == b, "not_equal": a != b}[op]


def scalar_operand(name, x):
    """(Operand, exact constant) of an operand: a scalar or a one-element integer SBUF / HBM
    tile, or a Python int."""
    if isinstance(x, NkiTensor):
        if x.size != 1 or x._buf.dtype not in _INTS or x._buf.kind == "psum":
            fail(f"{name}: operand {x!r} is not a scalar (a 1x1 int32 tile: nisa.scalar_load)")
        from openneuron.nki import _emit
        _emit._touch_read(x._buf)
        return Operand(0, x._buf.dtype, x._buf.id, x.offset, [0]), 0
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        v = int(x)
        if not -(1 << 31) <= v < (1 << 32):
            fail(f"{name}: {v} does not fit a 32-bit scalar")
        return Operand(1, "int32"), v
    fail(f"{name}: a scalar operand must be an NkiScalar or an int, got {type(x).__name__}")


def emit_scalar(name: str, op: str, a, b=0, dst: NkiTensor | None = None) -> NkiTensor:
    """dst (a new scalar unless given) = op(a, b) as the executor's scalar instruction."""
    from openneuron.nki import _emit
    t = _trace.current()
    oa, ca = scalar_operand(name, a)
    ob, cb = scalar_operand(name, b)
    out = dst if dst is not None else NkiScalar(new_buffer((1, 1), "int32", "sbuf")._buf)
    d = Operand(0, "int32", out._buf.id, out.offset, [0])
    ins = Instr(KIND_SCALAR, [1], d, [oa, ob], line=t.line())
    ins.extra = (_trace.OPS[_EXECUTOR_OPS.get(op, op)], ca, cb)
    t.add(ins)
    _emit._touch_write(out._buf, out.is_full())
    return out


class NkiScalar(NkiTensor):
    """nisa.NkiScalar: an int32 value on the device (a hidden 1x1 int32 SBUF tile here)."""

    __slots__ = ()

    def __repr__(self):
        return "NkiScalar(int32)"

    def _alu(self, op, other, reverse=False):
        a, b = (other, self) if reverse else (self, other)
        return scalar_alu(a, b, op)

    def __add__(self, o):
        return self._alu("add", o)

    def __radd__(self, o):
        return self._alu("add", o, True)

    def __sub__(self, o):
        return self._alu("subtract", o)

    def __rsub__(self, o):
        return self._alu("subtract", o, True)

    def __mul__(self, o):
        return self._alu("multiply", o)

    def __rmul__(self, o):
        return self._alu("multiply", o, True)

    # NOTE: nl.divide on scalars truncates toward zero (its documentation), so // and / both
    # map to it; % is nl.fmod (the dividend's sign)
    def __floordiv__(self, o):
        return self._alu("divide", o)

    def __rfloordiv__(self, o):
        return self._alu("divide", o, True)

    __truediv__ = __floordiv__
    __rtruediv__ = __rfloordiv__

    def __mod__(self, o):
        return self._alu("fmod", o)

    def __rmod__(self, o):
        return self._alu("fmod", o, True)

    def __neg__(self):
        return emit_scalar("NkiScalar", "subtract", 0, self)

    def __pos__(self):
        return self

    def __lt__(self, o):
        return self._alu("less", o)

    def __le__(self, o):
        return self._alu("less_equal", o)

    def __gt__(self, o):
        return self._alu("greater", o)

    def __ge__(self, o):
        return self._alu("greater_equal", o)

    def __eq__(self, o):
        return self._alu("equal", o)

    def __ne__(self, o):
        return self._alu("not_equal", o)

    __hash__ = object.__hash__

    def __index__(self):
        fail("an NkiScalar's value is not known while the kernel is traced: use it as a "
             "scalar_offset, an nl.ds start, a loop bound or an nl.if_else condition")
        return 0

    __int__ = __index__

    @property
    def dtype(self):
        from openneuron.nki import language as nl
        return nl.int32


def scalar_alu(data1, data2, op, name=None, **_):
    """op(data1, data2) on scalars (NkiScalar or int): add, subtract, multiply, divide (toward
    zero), fmod (the remainder with data1's sign), maximum, minimum, and the comparisons (an
    int32 scalar of 1 or 0). Two ints: evaluated now, a Python int (bool for a comparison)."""
    from openneuron.nki.isa import _op_name
    op = "fmod" if getattr(op, "__name__", op) == "fmod" else _op_name(op)
    op = "fmod" if op == "mod" else op
    if op not in _OPS:
        fail(f"nisa.scalar_alu: op {op} is not a scalar operation (one of {', '.join(sorted(_OPS))})")
    if not isinstance(data1, NkiTensor) and not isinstance(data2, NkiTensor):
        for v in (data1, data2):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                fail(f"nisa.scalar_alu: operands are NkiScalars or ints, got {type(v).__name__}")
        return _python(op, int(data1), int(data2))
    return emit_scalar("nisa.scalar_alu", op, data1, data2)


def scalar_load(src, **_):
    """The value of src, a 1x1 int32 tile in SBUF or HBM, as an NkiScalar."""
    if not isinstance(src, NkiTensor) or src.size != 1:
        fail(f"nisa.scalar_load: src must be a 1x1 int32 tensor in SBUF or HBM, got {src!r}")
    if src._buf.dtype != "int32":
        what = "64-bit scalars are not available here" if "64" in src._buf.dtype else \
            "unsigned dtypes are not accepted: use the signed dtype of the same width"
        fail(f"nisa.scalar_load: src is {src._buf.dtype}; {what}")
    if src._buf.kind == "psum":
        fail("nisa.scalar_load: src must be in SBUF or HBM, not PSUM")
    return emit_scalar("nisa.scalar_load", "copy", src)


def scalar_store(dst, value, **_):
    """dst, a 1x1 int32 tile in SBUF or HBM <- the scalar value."""
    if not isinstance(value, NkiScalar):
        fail(f"nisa.scalar_store: value must be an NkiScalar (nisa.scalar_load and arithmetic on "
             f"it); for a constant use nisa.memset; got {type(value).__name__}")
    if not isinstance(dst, NkiTensor) or dst.size != 1 or dst._buf.dtype != "int32" or \
            dst._buf.kind == "psum":
        fail(f"nisa.scalar_store: dst must be a 1x1 int32 tensor in SBUF or HBM, got {dst!r}")
    emit_scalar("nisa.scalar_store", "copy", value, dst=dst)
