"""Control flow decided when the kernel runs: the loops nl.dynamic_range, nl.fori_loop and
nl.while_loop (NKI's hardware loops) and nl.if_else. The body is traced once, between branch
instructions (csrc/nki/program.h kBranch, control.cpp) that run it as many times as its bounds
say; a register is a one-element int32 SBUF tile (_isa_dynamic.py), an NkiScalar one too
(_scalar.py).

    counted loop                          while loop
      counter <- start, stop' <- stop       cond <- init
    head: exit if counter >= stop'        head: exit if cond == 0
          (else i <- counter)                   (else r <- cond)
      body(i)                               cond <- body(r)
      counter += step, jump head            jump head

Bounds are read once, when the loop starts (by value, as the hardware loop does); the body's
register is a copy (writing it does not change the loop). Other state goes through tiles or HBM
written in place: a Python variable rebound in the body names a new tile in the trace, not the
next iteration's value. Tiles made before the loop stay in use through it (capacity and
placement). language.py re-exports the four."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki._emit import new_buffer
from openneuron.nki._scalar import NkiScalar, emit_scalar, scalar_operand
from openneuron.nki._tensor import NkiTensor
from openneuron.nki._trace import KIND_BRANCH, Instr, Operand, fail

_ALWAYS, _EXIT_GE, _EXIT_ZERO, _STEP = 0, 1, 2, 3
_STEP_LIMIT = 1 << 24  # the executor's loop step (an immediate)


def _register() -> NkiTensor:
    return new_buffer((1, 1), "int32", "sbuf")


def _scalar_tile(name: str, what: str, v) -> NkiTensor:
    if not isinstance(v, NkiTensor) or v.size != 1 or v._buf.kind != "sbuf" or \
            not v._buf.dtype.startswith(("int", "uint")):
        fail(f"{name}: {what} must be an int, an NkiScalar or a register (nisa.register_alloc, a "
             f"1x1 integer SBUF tile), got {v!r}")
    return v


def _copied(name: str, what: str, v) -> NkiTensor:
    """A new register holding v (an int, an NkiScalar or a register) now, exactly."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        if not -(1 << 31) <= int(v) < (1 << 31):
            fail(f"{name}: {what} {int(v)} is out of range: loop bounds are int32")
        v = int(v)
    elif not isinstance(v, NkiTensor):
        fail(f"{name}: {what} must be an int, an NkiScalar or a register (nisa.register_alloc), "
             f"got {type(v).__name__}")
    else:
        _scalar_tile(name, what, v)
    return emit_scalar(name, "copy", v, dst=_register())


def _branch(cond: int, srcs=(), dst: NkiTensor | None = None, step: int = 0) -> Instr:
    t = _trace.current()
    d = Operand(0, "int32", dst._buf.id, dst.offset, [0]) if dst is not None else Operand(1)
    if dst is not None:
        _emit._touch_write(dst._buf, True)
    ins = Instr(KIND_BRANCH, [1], d, [scalar_operand("branch", s)[0] for s in srcs],
                line=t.line())
    ins.extra = (cond, step)
    return t.add(ins)


def _open(name: str) -> dict:
    """Starts recording a loop. One left by an exception (or a generator closed by `break`)
    stays open: check_closed."""
    t = _trace.current()
    loop = {"head": len(t.instrs), "line": _trace.user_line(), "name": name, "deferred": []}
    t.loops.append(loop)
    return loop


def _close(loop: dict, repeats: bool = True):
    """Ends it: a loop's span recorded (`repeats`; not for nl.if_else), the tiles it kept
    released."""
    t = _trace.current()
    if t.loops[-1] is not loop:  # a loop inside this one was left
        _left(t, t.loops[-1])
    t.loops.pop()
    if repeats:
        t.loop_spans.append((loop["head"], len(t.instrs) - 1))
    for buf in loop["deferred"]:
        t.free_tile(buf)  # to the loop around this one, if it too holds the tile


def _counted(name, start, stop, step):
    if isinstance(step, NkiTensor) or not isinstance(step, (int, np.integer)) or \
            isinstance(step, bool) or int(step) < 1 or int(step) > _STEP_LIMIT:
        fail(f"{name}: step must be a positive int known when the kernel is traced (the "
             f"hardware loop takes it as an immediate), got {step!r}")
    counter = _copied(name, "start", start)
    bound = _copied(name, "stop", stop)
    # the loop value: a register when a bound is one (NKI's rule), else an NkiScalar
    registers = any(type(v) is NkiTensor for v in (start, stop))
    i = _register() if registers else NkiScalar(_register()._buf)
    loop = _open(name)
    head = _branch(_EXIT_GE, (counter, bound), dst=i)
    yield i
    back = _branch(_STEP, dst=counter, step=int(step))
    back.target = (head, 0)
    head.target = (back, 1)
    _close(loop)


def dynamic_range(start, stop=None, step=1, **_):
    """A loop run on the device: `for i in nl.dynamic_range(n)` traces its body once and runs it
    for i = start, start + step, ... < stop, those read when the loop starts (ints, NkiScalars
    or registers from nisa.register_alloc / register_load); i is a register when a bound is
    one, else an NkiScalar (an ap scalar_offset, an nl.ds start, arithmetic). `break` and
    `return` inside the body are errors."""
    if stop is None:
        start, stop = 0, start
    return _counted("nl.dynamic_range", start, stop, step)


def fori_loop(lower, upper, body_fun, step=1, **_):
    """body_fun(i) for i in range(lower, upper, step) on the device (dynamic_range's loop);
    i (a register or an NkiScalar, as there) passed by value."""
    if not callable(body_fun):
        fail(f"nl.fori_loop: body_fun must be callable, got {type(body_fun).__name__}")
    for i in _counted("nl.fori_loop", lower, upper, step):
        body_fun(i)


def while_loop(init, body_fun, **_):
    """r = init; while r != 0: r = body_fun(r), on the device: the condition is checked before
    each iteration; body_fun gets the condition's value as a register (a copy) and returns the
    register holding the next one."""
    if not callable(body_fun):
        fail(f"nl.while_loop: body_fun must be callable, got {type(body_fun).__name__}")
    cond = _copied("nl.while_loop", "init", init)
    r = _register()
    loop = _open("nl.while_loop")
    head = _branch(_EXIT_ZERO, (cond,), dst=r)
    nxt = body_fun(r)
    if not isinstance(nxt, NkiTensor) or nxt.size != 1 or nxt._buf.kind != "sbuf" or \
            not nxt._buf.dtype.startswith(("int", "uint")):
        fail(f"nl.while_loop: body_fun must return the register holding the next condition "
             f"(nisa.register_alloc / register_load), got {nxt!r}")
    emit_scalar("nl.while_loop", "copy", nxt, dst=cond)
    back = _branch(_ALWAYS)
    back.target = (head, 0)
    head.target = (back, 1)
    _close(loop)


def if_else(cond, then_fn, else_fn=None, **_):
    """then_fn() when cond is nonzero, else else_fn() (if given), chosen when the kernel runs:
    cond an NkiScalar (a comparison of scalars, nisa.scalar_load) or a register; a Python
    bool or int chooses now (only that callback is traced)."""
    for what, fn in (("then_fn", then_fn), ("else_fn", else_fn)):
        if fn is not None and not callable(fn):
            fail(f"nl.if_else: {what} must be callable, got {type(fn).__name__}")
    if not isinstance(cond, NkiTensor):
        if not isinstance(cond, (bool, int, np.integer)):
            fail(f"nl.if_else: cond must be an NkiScalar, a register or a Python bool / int, got "
                 f"{type(cond).__name__}")
        if cond:
            then_fn()
        elif else_fn is not None:
            else_fn()
        return
    flag = _scalar_tile("nl.if_else", "cond", cond)
    branch = _open("nl.if_else")
    skip = _branch(_EXIT_ZERO, (flag,))
    then_fn()
    over = _branch(_ALWAYS)
    if else_fn is not None:
        else_fn()
    end = _branch(_ALWAYS)  # to the next instruction: the place `over` jumps past
    skip.target = (over, 1)
    over.target = (end, 0)
    end.target = (end, 1)
    _close(branch, repeats=False)


def _left(t, loop):
    raise _trace.NkiError(
        f"{loop['line']}: in kernel '{t.kernel_name}': the body of {loop['name']} was left by "
        f"break, return or an exception: a run-time loop's body is traced once and runs whole "
        f"each iteration; to end a loop early, use nl.while_loop with a condition register")


def check_closed(t):
    """At the end of a trace: a loop still open was left by `break` or `return` in its body."""
    if t.loops:
        _left(t, t.loops[-1])
