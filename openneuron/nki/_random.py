"""Random numbers in NKI kernels: nl.rand / nl.random_seed, dropout's masks and nisa.rng,
rand2, set_rng_seed, rand_set_state, rand_get_state. The engines' generator state is a hidden float32 [128, 2] tile
of the trace (per partition a key of two 24-bit integers); each draw is the executor's `random`
op over (key, lane index), after which the key advances, so nothing random is fixed when the
kernel is traced. A kernel that does not seed itself starts from keys drawn from the launch's
seed (the neuron generator's state for neuron tensors, the CPU generator's for numpy arrays):
a new draw each launch, reproduced by torch.manual_seed. One state serves every engine."""

from __future__ import annotations

import numpy as np

from openneuron.nki import _emit, _trace
from openneuron.nki import language as nl
from openneuron.nki._emit import Expr, emit, new_buffer
from openneuron.nki._isa_vector import _per_partition, _tile, parse_call
from openneuron.nki._tensor import IndexExpr, NkiTensor
from openneuron.nki._trace import fail
from openneuron.nki.isa import _flat

_KEY = float(1 << 24)  # a key word is an integer in [0, 2^24): exact in float32


def _state():
    """The generator state tile, its keys drawn from the launch's seed on first use."""
    t = _trace.current()
    st = getattr(t, "rng_state", None)
    if st is None:
        st = new_buffer((_trace.PMAX, 2), "float32", "sbuf")
        t.rng_state = st
        grid = t.grid or ()
        inst = int(np.ravel_multi_index(t.program_ids, grid)) if grid else 0
        if inst >= 1 << 15:
            fail(f"random numbers in a grid of more than {1 << 15} instances")
        e = Expr()
        at = e.src(IndexExpr((_trace.PMAX, 2), inst * _trace.PMAX * 2, (2, 1)))
        emit(st, (_trace.PMAX, 2), e,
             e.op("floor", e.op("multiply", e.op("launch_random", at), e.src(_KEY))))
    return st


def _draw(p, S):
    """Expr and register of one uniform [0, 1) value per element of S (S[0] = p partitions);
    the caller emits it, then _advance()."""
    st = _state()
    n = int(np.prod(S, dtype=np.int64))
    if n > 1 << 24:
        fail(f"{n} random values in one instruction; at most 2^24")
    lin = IndexExpr(S, 0, [int(np.prod(S[d + 1:], dtype=np.int64)) for d in range(len(S))])
    e = Expr()
    k0, k1 = e.src(_column(st, 0, p)), e.src(_column(st, 1, p))
    return e, e.op("random", k0, k1, e.src(lin))


def _column(st, k, p):
    return NkiTensor(st._buf, st.offset + k, (p, 1), (st.strides[0], 0))


def _advance():
    """Each partition's key to two fresh words drawn from it (lane indices -1, -2: never a
    draw's)."""
    st = _state()
    nxt = new_buffer((_trace.PMAX, 2), "float32", "sbuf")
    e = Expr()
    k0, k1 = e.src(_column(st, 0, _trace.PMAX)), e.src(_column(st, 1, _trace.PMAX))
    at = e.src(IndexExpr((_trace.PMAX, 2), -2, (0, 1)))
    emit(nxt, (_trace.PMAX, 2), e,
         e.op("floor", e.op("multiply", e.op("random", k0, k1, at), e.src(_KEY))))
    _emit.copy_into(st, nxt)


def _fill(name, out, scale=None, offset=None):
    """out <- uniform [0, 1) values (times scale plus offset, each a number or a [P, 1] view)."""
    S = tuple(out.shape)
    if not S or S[0] == 0 or out.size == 0:
        return
    if S[0] > _trace.PMAX:
        fail(f"{name}: {S[0]} partitions; at most {_trace.PMAX}")
    e, u = _draw(S[0], S)
    if scale is not None:
        u = e.op("add", e.op("multiply", u, e.src(scale)), e.src(offset))
    emit(out, S, e, u, allow_hbm=True)
    _advance()


def dropout_into(out, x, rate, mask=None):
    """out <- x with each element zeroed with probability rate (a number or a [P, 1] tile),
    from the generator state: each call, partition and grid instance draws its own mask, and a
    seeded kernel repeats its masks."""
    S = tuple(x.shape)
    if not S or x.size == 0:
        return
    e, u = _draw(S[0], S)
    emit(out, S, e, e.op("select", e.op("less", u, e.src(rate)), e.src(0.0), e.src(x)),
         mask=mask)
    _advance()


# --- nki.language ------------------------------------------------------------------------------

def rand(shape, dtype=None, buffer=None, name="", **_):
    """A new tensor of uniform random values in [0, 1) (float32 unless dtype says), drawn when
    the kernel runs."""
    t = nl.ndarray(shape, dtype if dtype is not None else "float32", buffer, name)
    _fill("nl.rand", t)
    return t


def random_seed(seed):
    """Seeds the generator from a [1, 1] tile of one 32-bit value: later draws are the same on
    every run (and after the same seed again)."""
    _seed("nl.random_seed", seed)


# --- nki.isa -----------------------------------------------------------------------------------

def _seed(name, src):
    src = _tile(name.split(".")[-1], "src_seeds", src)
    if src.size != 1:
        fail(f"{name}: the seed must be a [1, 1] tile, got {list(src.shape)}")
    if _trace.DTYPE_SIZES[src._buf.dtype] != 4:
        fail(f"{name}: the seed's dtype {src._buf.dtype} is not a 32-bit type")
    st = _state()
    one = NkiTensor(src._buf, src.offset, (_trace.PMAX, 1), (0, 0))
    _emit.copy_into(_column(st, 0, _trace.PMAX), one)
    _emit.copy_into(_column(st, 1, _trace.PMAX), float(0x5EED))


def set_rng_seed(*args, **kwargs):
    """nisa.set_rng_seed(src_seeds): seeds the generator from a [1, 1] 32-bit tile (a value past
    2^24 is taken as float32 rounds it)."""
    _, v = parse_call("set_rng_seed", (None, *args), kwargs, ("src_seeds",), {})
    _seed("nisa.set_rng_seed", v["src_seeds"])


def _state_words(name, what, x):
    x = _tile(name, what, x)
    if x._buf.dtype != "uint32":
        fail(f"nisa.{name}: {what} dtype {x._buf.dtype}; it must be uint32")
    if x.ndim != 2 or x.shape[1] not in (6, 24):
        fail(f"nisa.{name}: {what} {list(x.shape)} must be [P, 6] (GpSimd) or [P, 24] (Vector)")
    return x


def rand_set_state(*args, **kwargs):
    """nisa.rand_set_state(src_seeds): each partition's key from its row of uint32 words ([P, 6]
    or [P, 24]); the first two words are the key (24 bits each as float32 reads them), the rest
    are not read. rand_get_state's output restores the same state."""
    _, v = parse_call("rand_set_state", (None, *args), kwargs, ("src_seeds",), {})
    src = _state_words("rand_set_state", "src_seeds", v["src_seeds"])
    st = _state()
    p = src.shape[0]
    e = Expr()
    emit(st[0:p, :], (p, 2), e, e.op("copy", e.src(src[:, 0:2])))


def rand_get_state(*args, **kwargs):
    """nisa.rand_get_state(dst): dst ([P, 6] or [P, 24] uint32) <- each partition's key in its
    first two words, zeros after."""
    dst, _ = parse_call("rand_get_state", args, kwargs, (), {})
    if dst is None:
        fail("nisa.rand_get_state: dst is required")
    dst = _state_words("rand_get_state", "dst", dst)
    st = _state()
    p = dst.shape[0]
    _emit.copy_into(dst[:, 0:2], st[0:p, :])
    _emit.copy_into(dst[:, 2:], 0.0)


def rng(*args, **kwargs):
    """nisa.rng(dst): random bits in an 8- or 16-bit integer dst (the low bits of a random word:
    uniform over the dtype's range). 32-bit destinations are refused: the executor's lanes are
    float32, which hold 24 random bits, not 32."""
    dst, _ = parse_call("rng", args, kwargs, (), {})
    if dst is None:
        fail("nisa.rng: dst is required")
    dst = _tile("rng", "dst", dst)
    dt = dst._buf.dtype
    if dt not in ("int8", "int16", "uint8", "uint16", "int32", "uint32"):
        fail(f"nisa.rng: dst dtype {dt}; it must be an integer type")
    if dt in ("int32", "uint32"):
        fail(f"nisa.rng: dst dtype {dt}: 32 random bits do not fit this executor's float32 lanes; "
             f"draw uint16 (or nisa.rand2 / nl.rand for floats)")
    bits = 8 * _trace.DTYPE_SIZES[dt]
    dst = _flat(dst, "rng", "dst")
    S = tuple(dst.shape)
    if dst.size == 0:
        return
    e, u = _draw(S[0], S)
    v = e.op("floor", e.op("multiply", u, e.src(float(1 << bits))))
    if dt.startswith("int"):  # the word's low bits read as a signed number
        half = e.src(float(1 << (bits - 1)))
        v = e.op("select", e.op("greater_equal", v, half),
                 e.op("subtract", v, e.src(float(1 << bits))), v)
    emit(dst, S, e, v)
    _advance()
    return


def rand2(*args, **kwargs):
    """nisa.rand2(dst, min, max): dst <- uniform random values in [min, max) (min / max numbers
    or float32 [P, 1] tiles), converted to dst's dtype."""
    dst, v = parse_call("rand2", args, kwargs, ("min", "max"), {})
    if dst is None:
        fail("nisa.rand2: dst is required")
    dst = _flat(_tile("rand2", "dst", dst), "rand2", "dst")
    p = dst.shape[0]
    lo, hi = v["min"], v["max"]
    for what, x in (("min", lo), ("max", hi)):
        if isinstance(x, NkiTensor) and x._buf.dtype != "float32":
            fail(f"nisa.rand2: {what} dtype {x._buf.dtype}; it must be float32")
    if not isinstance(lo, NkiTensor) and not isinstance(hi, NkiTensor) and not lo < hi:
        fail(f"nisa.rand2: min {lo} must be less than max {hi}")
    lo = _per_partition("rand2", "min", lo, p)
    hi = _per_partition("rand2", "max", hi, p)
    if isinstance(lo, float) and isinstance(hi, float):
        _fill("nisa.rand2", dst, hi - lo, lo)
        return
    width = new_buffer((p, 1), "float32", "sbuf")
    e = Expr()
    emit(width, (p, 1), e, e.op("subtract", e.src(hi), e.src(lo)))
    _fill("nisa.rand2", dst, width, lo)
    return
