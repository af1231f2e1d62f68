"""nisa instructions with an operand at an offset read when the kernel runs:
tensor_copy_dynamic_src / tensor_copy_dynamic_dst (the executor's dynamic copy, csrc/nki
program.h kDynamicCopy: the offset checked when it runs, an error naming the kernel line when it
leaves the tensor), and the 0.x registers that hold such offsets (register_alloc / move / load /
store: each register a one-element int32 SBUF tile). The view itself comes from indexing with a
run-time value (_tensor.index: offsets[0, i] + iy, a register, nl.ds(register, n)). isa.py
re-exports them."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._emit import Expr, emit, new_buffer
from openneuron.nki._tensor import NkiTensor
from openneuron.nki._trace import fail


def _operands(name, args, dst, src):
    """(dst, src) of a Beta 1 call (src positional, dst= by name or returned) or a 0.x call
    (dst, src positional)."""
    args = list(args)
    if len(args) == 2 and dst is None and src is None:
        dst, src = args
    elif len(args) == 1 and src is None:
        src = args[0]
    elif len(args) == 1 and dst is None:
        dst = args[0]
    elif args:
        fail(f"nisa.{name} takes src (Beta 1) or dst and src (0.x)")
    if src is None:
        fail(f"nisa.{name}: missing src")
    return dst, src


def _copy(name, dst, src, mask, moves):
    """dst <- src with `moves` ("src" or "dst") at its run-time offset."""
    for what, t in (("src", src), ("dst", dst)):
        if not isinstance(t, NkiTensor) or t._buf.kind == "hbm":
            got = repr(t) if isinstance(t, NkiTensor) else type(t).__name__
            fail(f"nisa.{name}: {what} must be an SBUF or PSUM tile, got {got}")
    fixed, other = (dst, "dst") if moves == "src" else (src, "src")
    if fixed.dyn is not None:
        fail(f"nisa.{name}: {other} is indexed by a run-time value; this instruction moves "
             f"{moves} (use nisa.tensor_copy_dynamic_{other})")
    p_src = src.shape[0] if src.shape else 1
    p_dst = dst.shape[0] if dst.shape else 1
    if p_src != p_dst or src.size != dst.size:
        fail(f"nisa.{name}: src {list(src.shape)} and dst {list(dst.shape)} need the same "
             f"number of partitions and of elements per partition")
    e = Expr()
    emit(dst, dst.shape, e, e.src(src), mask=mask, dynamic=f"nisa.{name}")


def tensor_copy_dynamic_src(*args, mask=None, dtype=None, dst=None, src=None, **_):
    """dst <- src, src an SBUF/PSUM view indexed along a free axis by a run-time value (one
    element of an integer SBUF tile or a register, plus an affine index: src[ix, offsets[0, i]
    + iy], src[:, nl.ds(reg, n)]). Beta 1: tensor_copy_dynamic_src(src, mask=, dtype=) returns
    an SBUF tile; 0.x: tensor_copy_dynamic_src(dst, src) writes dst. A value that puts src
    outside its tile fails when the kernel runs, naming this line."""
    name = "tensor_copy_dynamic_src"
    dst, src = _operands(name, args, dst, src)
    out = dst
    if out is None:
        if not isinstance(src, NkiTensor):
            fail(f"nisa.{name}: src must be an SBUF or PSUM tile")
        out = new_buffer(src.shape, _trace.dtype_name(dtype or src.dtype), "sbuf")
    elif dtype is not None and _trace.dtype_name(dtype) != out._buf.dtype:
        fail(f"nisa.{name}: dtype {_trace.dtype_name(dtype)} differs from dst's "
             f"{out._buf.dtype}")
    _copy(name, out, src, mask, "src")
    return out


def tensor_copy_dynamic_dst(*args, mask=None, dtype=None, dst=None, src=None, **_):
    """dst <- src, dst an SBUF/PSUM view indexed along a free axis by a run-time value (as
    tensor_copy_dynamic_src's src). Beta 1: tensor_copy_dynamic_dst(dst=, src=, mask=); 0.x:
    tensor_copy_dynamic_dst(dst, src). A value that puts dst outside its tile fails when the
    kernel runs, naming this line."""
    name = "tensor_copy_dynamic_dst"
    dst, src = _operands(name, args, dst, src)
    if dst is None:
        fail(f"nisa.{name}: missing dst")
    if dtype is not None and isinstance(dst, NkiTensor) and \
            _trace.dtype_name(dtype) != dst._buf.dtype:
        fail(f"nisa.{name}: dtype {_trace.dtype_name(dtype)} differs from dst's {dst._buf.dtype}")
    _copy(name, dst, src, mask, "dst")


# --- 0.x registers: one-element int32 SBUF tiles ------------------------------------------------

def _register(name, reg):
    if not isinstance(reg, NkiTensor) or reg.size != 1 or reg._buf.kind != "sbuf" or \
            reg._buf.dtype != "int32" or reg.dyn is not None:
        fail(f"nisa.{name}: expected a register (from nisa.register_alloc), got {reg!r}")
    return reg


def _scalar_tile(name, what, t, hbm=False):
    if not isinstance(t, NkiTensor) or t.size != 1 or t._buf.kind == "psum" or \
            (t._buf.kind == "hbm" and not hbm):
        fail(f"nisa.{name}: {what} must be a one-element tensor in SBUF"
             f"{' or HBM' if hbm else ''}, got {t!r}")
    return t


def _exact(name, dst, src):
    """dst <- src through the executor's integer scalar instruction (exact over int32) when
    both are int32; else an elementwise copy (a float converted, through a float32 lane)."""
    from openneuron.nki._scalar import emit_scalar
    if dst._buf.dtype == "int32" and (not isinstance(src, NkiTensor) or src._buf.dtype == "int32"):
        emit_scalar(f"nisa.{name}", "copy", src, dst=dst)
    else:
        _emit.copy_into(dst, src, allow_hbm=True)


def _imm(name, x):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or \
            not -(1 << 31) <= int(x) < (1 << 31):
        fail(f"nisa.{name}: the value must be an int32, got {x!r}")
    return int(x)


def register_alloc(x=0, **_):
    """A register holding the integer x: a one-element int32 SBUF tile, usable as a run-time
    index (src[:, nl.ds(reg, n)]) of nisa.tensor_copy_dynamic_src / _dst, a scalar_offset or a
    loop bound."""
    reg = new_buffer((1, 1), "int32", "sbuf")
    _exact("register_alloc", reg, _imm("register_alloc", x))
    return reg


def register_move(dst, imm, **_):
    """dst (a register) <- the integer imm."""
    _exact("register_move", _register("register_move", dst), _imm("register_move", imm))


def register_load(dst, src, **_):
    """dst (a register) <- the value of src, a one-element tensor in SBUF or HBM (int32 exactly;
    another dtype converted)."""
    _exact("register_load", _register("register_load", dst),
           _scalar_tile("register_load", "src", src, hbm=True))


def register_store(dst, src, **_):
    """dst, a one-element tensor in SBUF or HBM <- the register src."""
    _exact("register_store", _scalar_tile("register_store", "dst", dst, hbm=True),
           _register("register_store", src))
