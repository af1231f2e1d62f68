"""Values a kernel holds while it is traced: NkiTensor (a strided view of an HBM tensor or an
SBUF/PSUM tile), affine index expressions (nl.arange, nl.mgrid and arithmetic on them), masks
(affine predicates), nl.ds. Indexing turns them into access patterns: an element offset and one
stride per axis. Instructions are recorded by _emit.py; the API is language.py / isa.py."""

from __future__ import annotations

import numpy as np

from openneuron.nki._trace import fail

try:  # numpy arrays of bfloat16 / float8 (NKI's simulator takes them too), when installed
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with the project's set-up
    _ml_dtypes = None

# float8_e4m3 is stored as torch's float8_e4m3fn (no infinities, +-448): ml_dtypes' type of
# the same bits, not its IEEE-style float8_e4m3 (+-240), which numpy would pick by name.
_ML_NAMES = {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3fn",
             "float8_e5m2": "float8_e5m2"}


class DTypeConst:
    """A dtype numpy itself lacks (bfloat16, float8...): compares equal to its name; with
    ml_dtypes installed, numpy takes it too (`np.ones(n, dtype=nl.bfloat16)`). Not a str
    subclass: numpy would parse the name first, and "float8_e4m3" names another format."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    @property
    def _nki_dtype(self):
        return self.name

    @property
    def dtype(self):
        npdt = numpy_dtype(self.name)
        if npdt is None:
            raise AttributeError(f"numpy has no {self.name} here (ml_dtypes has bfloat16 and "
                                 f"float8: pip install ml_dtypes), or pass torch tensors")
        return npdt

    def __eq__(self, other):
        return self.name == (other.name if isinstance(other, DTypeConst) else other)

    def __hash__(self):
        return hash(self.name)

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"nl.{self.name}"


def numpy_dtype(name: str):
    """The numpy dtype of a dtype name, None where numpy (with ml_dtypes, if installed) lacks
    it."""
    if name in _ML_NAMES:
        return np.dtype(getattr(_ml_dtypes, _ML_NAMES[name])) if _ml_dtypes is not None else None
    try:
        return np.dtype(name)
    except TypeError:  # tfloat32
        return None


BFLOAT16 = DTypeConst("bfloat16")
FLOAT8_E4M3 = DTypeConst("float8_e4m3")
FLOAT8_E5M2 = DTypeConst("float8_e5m2")
_PUBLIC_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32,
                  "uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16,
                  "uint32": np.uint32, "bfloat16": BFLOAT16, "float8_e4m3": FLOAT8_E4M3,
                  "float8_e5m2": FLOAT8_E5M2}


def public_dtype(name: str):
    return _PUBLIC_DTYPES[name]


class BufferKind:
    """nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, nl.private_hbm."""

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind

    def __repr__(self):
        return f"nl.{self.name}"


SBUF = BufferKind("sbuf", "sbuf")
PSUM = BufferKind("psum", "psum")
HBM = BufferKind("hbm", "hbm")
SHARED_HBM = BufferKind("shared_hbm", "hbm")
PRIVATE_HBM = BufferKind("private_hbm", "hbm")
_KIND_OBJECTS = {"sbuf": SBUF, "psum": PSUM, "hbm": SHARED_HBM}


def buffer_kind(buffer) -> str:
    if buffer is None:
        return "sbuf"
    if isinstance(buffer, BufferKind):
        return buffer.kind
    if isinstance(buffer, str) and buffer in ("sbuf", "psum", "hbm", "shared_hbm", "private_hbm"):
        return "hbm" if "hbm" in buffer else buffer
    fail(f"unknown buffer {buffer!r}: use nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm")


# --- index expressions and masks ---------------------------------------------------------------

def _broadcast_shapes(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        fail(f"index expressions of shapes {[list(s) for s in shapes]} do not broadcast")


def _expand(coefs, shape, target):
    """coefs over `shape`, right-aligned into `target` (a broadcast axis has coefficient 0)."""
    pad = len(target) - len(shape)
    out = [0] * len(target)
    for j, c in enumerate(coefs):
        out[pad + j] = c if shape[j] != 1 else 0
    return out


class IndexExpr:
    """An affine index: const + sum(coefs[k] * position[k]) over a grid of `shape`."""

    __slots__ = ("coefs", "const", "shape")

    def __init__(self, shape, const, coefs):
        self.shape = tuple(shape)
        self.const = int(const)
        self.coefs = tuple(int(c) for c in coefs)

    def _combine(self, other, sign):
        if isinstance(other, IndexExpr):
            shape = _broadcast_shapes(self.shape, other.shape)
            a = _expand(self.coefs, self.shape, shape)
            b = _expand(other.coefs, other.shape, shape)
            return IndexExpr(shape, self.const + sign * other.const,
                             [x + sign * y for x, y in zip(a, b)])
        if isinstance(other, (int, np.integer)):
            return IndexExpr(self.shape, self.const + sign * int(other), self.coefs)
        return NotImplemented

    def __add__(self, o):
        return self._combine(o, 1)

    __radd__ = __add__

    def __sub__(self, o):
        return self._combine(o, -1)

    def __rsub__(self, o):
        return (-self)._combine(o, 1)

    def __neg__(self):
        return IndexExpr(self.shape, -self.const, [-c for c in self.coefs])

    def __mul__(self, k):
        if not isinstance(k, (int, np.integer)):
            return NotImplemented
        return IndexExpr(self.shape, self.const * int(k), [c * int(k) for c in self.coefs])

    __rmul__ = __mul__

    def __floordiv__(self, k):
        fail("an index expression divided is not affine; index with nl.arange/nl.mgrid "
             "arithmetic (+, -, * by integers) only")

    def __getitem__(self, key):
        """[:, None] / [None, :]: new axes of size 1, as numpy."""
        key = key if isinstance(key, tuple) else (key,)
        shape, coefs, j = [], [], 0
        for k in key:
            if k is None:
                shape.append(1)
                coefs.append(0)
            elif isinstance(k, slice) and k == slice(None):
                shape.append(self.shape[j])
                coefs.append(self.coefs[j])
                j += 1
            else:
                fail("an index expression takes only [:, None]-style new axes")
        shape += self.shape[j:]
        coefs += self.coefs[j:]
        return IndexExpr(shape, self.const, coefs)

    def _cmp(self, other, kind):
        diff = (other - self) if kind in ("lt", "le") else (self - other)
        if diff is NotImplemented:
            return NotImplemented
        if not isinstance(diff, IndexExpr):
            diff = IndexExpr(self.shape, diff, [0] * len(self.shape))
        strict = kind in ("lt", "gt")
        return Pred(diff.shape, [(diff.const - (1 if strict else 0), diff.coefs)])

    def __lt__(self, o):
        return self._cmp(o, "lt")

    def __le__(self, o):
        return self._cmp(o, "le")

    def __gt__(self, o):
        return self._cmp(o, "gt")

    def __ge__(self, o):
        return self._cmp(o, "ge")

    def __eq__(self, o):
        a, b = self._cmp(o, "ge"), self._cmp(o, "le")
        return a & b

    def __ne__(self, o):
        fail("'!=' on index expressions is not one interval; combine '<' and '>' masks")

    __hash__ = None


class Pred:
    """A mask: every inequality const + sum(coefs * position) >= 0 holds, over a grid `shape`."""

    __slots__ = ("ineqs", "shape")

    def __init__(self, shape, ineqs):
        self.shape = tuple(shape)
        self.ineqs = [(int(c), tuple(int(x) for x in k)) for c, k in ineqs]

    def __and__(self, other):
        if not isinstance(other, Pred):
            return NotImplemented
        shape = _broadcast_shapes(self.shape, other.shape)
        return Pred(shape, [(c, _expand(k, self.shape, shape)) for c, k in self.ineqs]
                    + [(c, _expand(k, other.shape, shape)) for c, k in other.ineqs])

    __rand__ = __and__

    def __invert__(self):
        if len(self.ineqs) != 1:
            fail("~ of a mask with several conditions is not one interval")
        c, k = self.ineqs[0]
        return Pred(self.shape, [(-c - 1, [-x for x in k])])

    def __or__(self, other):
        fail("masks combine with '&' only (an NKI mask is a conjunction of affine conditions)")

    def __bool__(self):
        fail("a mask is not a Python bool: pass it as mask=... (or to nisa.affine_select)")
        return False


class DynSlice:
    """nl.ds(start, size): `size` elements from `start` (an int, or a run-time value: one
    element of an integer SBUF tile or a register, with integers added; see DynIndex)."""

    __slots__ = ("size", "start", "step")

    def __init__(self, start, size, step=1):
        dyn = dynamic_index(start)
        self.start = dyn if dyn is not None else int(start)
        self.size, self.step = int(size), int(step)


class DynIndex:
    """An index read when the kernel runs: coef * value + static, `value` one element of an
    integer SBUF tile (a register, a tile element such as offsets[0, i]), `static` an int or an
    affine index expression. Only nisa.tensor_copy_dynamic_src / _dst take a view indexed by
    one (the tracer cannot know the offset: the executor reads it, csrc/nki kDynamicCopy)."""

    __slots__ = ("coef", "static", "value")

    def __init__(self, value, coef=1, static=0):
        self.value, self.coef, self.static = value, int(coef), static

    def _shift(self, other, sign):
        if isinstance(other, (int, np.integer, IndexExpr)):
            return DynIndex(self.value, self.coef, self.static + sign * other)
        if isinstance(other, (NkiTensor, DynIndex)):
            fail("an index holds one run-time value; add integers or nl.arange / nl.mgrid "
                 "expressions to it, not another tile value")
        return NotImplemented

    def __add__(self, o):
        return self._shift(o, 1)

    __radd__ = __add__

    def __sub__(self, o):
        return self._shift(o, -1)

    def __rsub__(self, o):
        return (-self)._shift(o, 1)

    def __neg__(self):
        return DynIndex(self.value, -self.coef, -self.static)

    def __mul__(self, k):
        if not isinstance(k, (int, np.integer)):
            return NotImplemented
        return DynIndex(self.value, self.coef * int(k), self.static * int(k))

    __rmul__ = __mul__


def dynamic_index(x):
    """x as a DynIndex when it is a run-time value (a one-element tile view or a DynIndex),
    else None. The value must be an integer in SBUF, as NKI's dynamic offsets are."""
    if isinstance(x, DynIndex):
        return x
    if not isinstance(x, NkiTensor) or x.size != 1:
        return None
    if x._buf.kind != "sbuf" or x._buf.dtype not in ("int32", "uint32", "int16", "uint16",
                                                        "int8", "uint8"):
        fail(f"a run-time index must be one element of an integer SBUF tile (or a register), "
             f"got a {x._buf.dtype} {x._buf.kind} tile")
    return DynIndex(x)


def arange(start, stop=None, step=1) -> IndexExpr:
    if stop is None:
        start, stop = 0, start
    n = max(0, -(-(int(stop) - int(start)) // int(step)))
    return IndexExpr((n,), start, (step,))


class _Grid(tuple):
    """nl.mgrid's index expressions, also named .p (partition), .x, .y, .z (the free axes in
    order), as NKI's examples read them."""

    def _axis(self, i, name):
        if i >= len(self):
            fail(f"nl.mgrid(...).{name} names axis {i}; this grid has {len(self)} axes")
        return self[i]

    @property
    def p(self):
        return self[0]

    @property
    def x(self):
        return self._axis(1, "x")

    @property
    def y(self):
        return self._axis(2, "y")

    @property
    def z(self):
        return self._axis(3, "z")


class _MGrid:
    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        ranges = []
        for k in key:
            if not isinstance(k, slice):
                fail("nl.mgrid takes slices: nl.mgrid[0:128, 0:512]")
            start = k.start or 0
            step = k.step or 1
            ranges.append((start, max(0, -(-(k.stop - start) // step)), step))
        shape = tuple(n for _, n, _ in ranges)
        out = []
        for d, (start, _, step) in enumerate(ranges):
            coefs = [0] * len(shape)
            coefs[d] = step
            out.append(IndexExpr(shape, start, coefs))
        return _Grid(out) if len(out) > 1 else out[0]


mgrid = _MGrid()


# --- tensors -----------------------------------------------------------------------------------

def _restride(shape, strides, new_shape):
    """Strides walking a (shape, strides) view's elements in row-major order as new_shape, or
    None (numpy's _attempt_nocopy_reshape)."""
    old = [(n, st) for n, st in zip(shape, strides) if n != 1]
    new = list(new_shape)
    out = [1] * len(new)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new) and oi < len(old):
        a, b = new[ni], old[oi][0]
        while a != b:
            if a < b:
                a *= new[nj]
                nj += 1
            else:
                b *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return out


class NkiTensor:
    """A view: buffer, element offset, shape, strides. On SBUF/PSUM the first axis is the
    partition axis. `checks` bound each indexed axis of an advanced-indexed view: (const,
    coefs per axis of this view, size), checked against masks when an instruction uses it."""

    __slots__ = ("__weakref__", "_buf", "checks", "dyn", "ind", "offset", "shape", "strides")

    def __init__(self, buf, offset=0, shape=None, strides=None, checks=(), dyn=None, ind=None):
        self._buf = buf
        self.offset = int(offset)
        self.shape = tuple(int(s) for s in (buf.shape if shape is None else shape))
        if strides is None:
            strides, acc = [], 1
            for s in reversed(self.shape):
                strides.append(acc)
                acc *= s
            strides = tuple(reversed(strides))
        self.strides = tuple(int(s) for s in strides)
        self.checks = tuple(checks)
        # (value, coef, scale): the element offset moves `scale` per unit of the run-time
        # `value`; its axis's check in `checks` is marked ("dyn", axis, coef) (index()).
        self.dyn = dyn
        # (index tile, scale, lowest, highest): an HBM view whose axis 0 (partition p) sits at
        # row index[p], rows `scale` elements apart, the view as given being row 0; indices
        # from lowest to highest keep it in the tensor (the DMA's indirect access,
        # _index_indirect, ap(vector_offset=)); `strides[0]` is what moves with p besides.
        self.ind = ind

    # attributes kernels read
    @property
    def dtype(self):
        return public_dtype(self._buf.dtype)

    @property
    def buffer(self):
        return _KIND_OBJECTS[self._buf.kind]

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        fail(f"the value of {self!r} is not known while the kernel is traced, so it cannot be a "
             f"Python bool (if / while): for a loop on a run-time value use nl.while_loop, "
             f"nl.fori_loop or nl.dynamic_range; for a choice per element, nl.where")
        return False

    def __repr__(self):
        return f"NkiTensor({list(self.shape)}, {self._buf.dtype}, {self._buf.kind})"

    def is_full(self) -> bool:
        """Whether this view covers its whole buffer once (a write makes it initialized)."""
        if self.offset != 0 or self.size != self._buf.numel:
            return False
        pairs = sorted((st, n) for st, n in zip(self.strides, self.shape) if n > 1)
        acc = 1
        for st, n in pairs:
            if st != acc:
                return False
            acc *= n
        return True

    # views
    def __getitem__(self, key):
        return index(self, key)

    def __setitem__(self, key, value):
        from openneuron.nki import _emit
        dst = index(self, key)
        if isinstance(value, NkiTensor) and value._buf is dst._buf and \
                value.offset == dst.offset and value.strides == dst.strides:
            return  # `t[i] += x` writes in place, then assigns the view to itself
        _emit.copy_into(dst, value, allow_hbm=dst._buf.kind == "hbm")

    def as_shape(self, shape, keep_partitions=True):
        """This view's elements, in order within each partition, as a view of `shape` with the
        same partition count (0.x instructions pair operands by element count per partition,
        [8, 1, 128] with [8, 128]; a DMA, keep_partitions=False, pairs elements alone); None
        where no strides walk them so (numpy's reshape without a copy) or the view carries
        checks or run-time indices."""
        shape = tuple(int(n) for n in shape)
        if self.checks or self.ind is not None or self.dyn is not None or not shape or \
                (keep_partitions and shape[0] != self.shape[0]) or \
                int(np.prod(shape, dtype=np.int64)) != self.size:
            return None
        strides = _restride(self.shape, self.strides, shape)
        return None if strides is None else NkiTensor(self._buf, self.offset, shape, strides)

    def reshape(self, shape):
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            fail(f"cannot reshape {list(self.shape)} to {list(shape)}")
        if self.ind is not None or self.dyn is not None:
            fail(f"reshape of {self!r}, a view indexed by run-time values; index the reshaped "
                 f"tensor instead")
        if NkiTensor(self._buf, 0, self.shape).strides != self.strides:
            fail("reshape of a non-contiguous view; copy it into a tile first")
        if self._buf.kind != "hbm" and shape[0] != self.shape[0]:
            fail(f"reshape of a tile must keep its partition dimension ({self.shape[0]}), "
                 f"got {list(shape)}")
        return NkiTensor(self._buf, self.offset, shape)

    def broadcast_to(self, shape):
        from openneuron.nki import language as nl
        return nl.broadcast_to(self, shape)

    def view(self, dtype):
        """The same elements as another dtype: its own dtype (a no-op) only; a reinterpreting
        view between dtypes is not supported here."""
        from openneuron.nki import _trace
        name = _trace.dtype_name(dtype)
        if name != self._buf.dtype:
            fail(f"{self!r}.view({name}): reinterpreting {self._buf.dtype} elements as {name} "
                 f"is not supported; pass the data in {name}")
        return self

    def ap(self, pattern, offset=0, vector_offset=None, indirect_dim=0, scalar_offset=None,
           **_):
        """A raw access pattern: [[step, count], ...] over this tensor's elements (the first
        pair is the partition axis of a tile), from `offset` elements past this view's start.
        vector_offset (0.x indirect DMA, HBM only): an SBUF tile of row indices, one per
        partition of the pattern: partition p reads row vector_offset[p] of axis indirect_dim
        (0) instead of stepping by the first pair's step. scalar_offset (0.x): a register or a
        one-element integer SBUF tile, v, read when the kernel runs: the pattern starts v steps
        of axis indirect_dim further (nisa.dma_copy; out of range fails, or with
        oob_mode=skip copies nothing); an integer is added as it is."""
        strides = [int(p[0]) for p in pattern]
        shape = [int(p[1]) for p in pattern]
        if scalar_offset is not None:
            if vector_offset is not None:
                fail("ap(): scalar_offset and vector_offset together are not supported")
            return _ap_scalar_offset(self, strides, shape, int(offset), scalar_offset,
                                     int(indirect_dim))
        if vector_offset is not None:
            return _ap_indirect(self, strides, shape, int(offset), vector_offset,
                                int(indirect_dim))
        # NOTE: a pattern leaving the tensor is an error where an instruction reads or writes
        # it (_emit), not here: nki-library makes such a view for a tile index it then skips
        return NkiTensor(self._buf, self.offset + int(offset), shape, strides)

    def view_dtype(self, dtype):
        fail("reinterpreting a tensor's dtype is not supported on the neuron NKI executor")

    @property
    def T(self):
        from openneuron.nki import language as nl
        return nl.transpose(self)

    # arithmetic on tiles: the nl functions
    def _bin(self, name, other, reverse=False):
        from openneuron.nki import language as nl
        fn = getattr(nl, name)
        return fn(other, self) if reverse else fn(self, other)

    # NOTE: a one-element tile plus or minus an index expression is an index read at run time
    # (offsets[0, i] + iy, NKI's tensor_copy_dynamic_src example), not tile arithmetic.
    def __add__(self, o):
        if isinstance(o, IndexExpr) and self.size == 1:
            return dynamic_index(self) + o
        return self._bin("add", o)

    def __radd__(self, o):
        if isinstance(o, IndexExpr) and self.size == 1:
            return dynamic_index(self) + o
        return self._bin("add", o, True)

    def __sub__(self, o):
        if isinstance(o, IndexExpr) and self.size == 1:
            return dynamic_index(self) - o
        return self._bin("subtract", o)

    def __rsub__(self, o):
        if isinstance(o, IndexExpr) and self.size == 1:
            return o - dynamic_index(self)
        return self._bin("subtract", o, True)

    def __mul__(self, o):
        return self._bin("multiply", o)

    def __rmul__(self, o):
        return self._bin("multiply", o, True)

    def __truediv__(self, o):
        return self._bin("divide", o)

    def __rtruediv__(self, o):
        return self._bin("divide", o, True)

    def __pow__(self, o):
        return self._bin("power", o)

    def __neg__(self):
        from openneuron.nki import language as nl
        return nl.negative(self)

    def __lt__(self, o):
        return self._bin("less", o)

    def __le__(self, o):
        return self._bin("less_equal", o)

    def __gt__(self, o):
        return self._bin("greater", o)

    def __ge__(self, o):
        return self._bin("greater_equal", o)

    def __and__(self, o):
        return self._bin("logical_and", o)

    def __or__(self, o):
        return self._bin("logical_or", o)

    def _inplace(self, name, other):
        from openneuron.nki import _emit
        if name == "add" and self._buf.kind == "psum" and isinstance(other, NkiTensor) and \
                other._buf.mm_open and not self._psum_written():
            # `psum[...] += matmul` starts its accumulation group by overwriting, as NKI's
            # compiler infers (the first write to a PSUM location overwrites)
            _emit.copy_into(self, other)
            return self
        _emit.accumulate_into(self, other, name)
        return self

    def _psum_written(self) -> bool:
        """Whether an instruction has written any bank this PSUM view touches."""
        from openneuron.nki import _trace
        t = _trace.current()
        written = t.psum_written.get(self._buf.id, ())
        return any(b in written for b in _trace.psum_blocks(
            t, self._buf.id, self.offset, self.strides, self.shape))

    def __iadd__(self, o):
        return self._inplace("add", o)

    def __isub__(self, o):
        return self._inplace("subtract", o)

    def __imul__(self, o):
        return self._inplace("multiply", o)

    def __itruediv__(self, o):
        return self._inplace("divide", o)

    __hash__ = object.__hash__


def view_span(v: NkiTensor):
    lo = hi = v.offset
    for st, n in zip(v.strides, v.shape):
        if n == 0:
            return 0, -1
        if st < 0:
            lo += st * (n - 1)
        else:
            hi += st * (n - 1)
    return lo, hi


def _norm_slice(k, size, axis):
    if isinstance(k, DynSlice):
        start, stop, step = k.start, k.start + k.size * k.step, k.step
        if start < 0 or stop > size:
            fail(f"nl.ds({k.start}, {k.size}) is out of bounds for axis {axis} of size {size}")
        return start, k.size, step
    start, stop, step = k.indices(size)
    return start, len(range(start, stop, step)), step


def index(t: NkiTensor, key) -> NkiTensor:
    """t[key]: ints, slices, nl.ds, Ellipsis, or affine index expressions (with ints); one axis
    may be indexed by a run-time value (DynIndex, a one-element integer tile, a register, or
    nl.ds starting at one)."""
    if t.dyn is not None or t.ind is not None:
        fail("a view indexed by a run-time value cannot be indexed again; put every index in "
             "one subscript")
    key = list(key) if isinstance(key, tuple) else [key]
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        fill = t.ndim - (len(key) - 1)
        key = key[:i] + [slice(None)] * fill + key[i + 1:]
    if len(key) > t.ndim:
        fail(f"too many indices ({len(key)}) for a tensor of shape {list(t.shape)}")
    key += [slice(None)] * (t.ndim - len(key))
    if t._buf.kind == "hbm":
        ind_axes = [d for d, k in enumerate(key) if isinstance(k, NkiTensor) and k.ndim >= 1]
        if ind_axes:
            return _index_indirect(t, key, ind_axes)
    dyn_axes = [d for d, k in enumerate(key) if _dynamic_key(k) is not None]
    if dyn_axes:
        return _index_dynamic(t, key, dyn_axes)
    if any(isinstance(k, IndexExpr) for k in key):
        return _index_affine(t, key)
    offset, shape, strides = t.offset, [], []
    for d, k in enumerate(key):
        if isinstance(k, (int, np.integer)):
            k = int(k)
            if not -t.shape[d] <= k < t.shape[d]:
                fail(f"index {k} is out of bounds for axis {d} of size {t.shape[d]} "
                     f"(tensor {list(t.shape)})")
            offset += t.strides[d] * (k % t.shape[d])
        elif isinstance(k, (slice, DynSlice)):
            start, n, step = _norm_slice(k, t.shape[d], d)
            offset += t.strides[d] * start
            shape.append(n)
            strides.append(t.strides[d] * step)
        else:
            fail(f"unsupported index {k!r} for axis {d}")
    return NkiTensor(t._buf, offset, shape, strides)


def _index_affine(t: NkiTensor, key) -> NkiTensor:
    """t[ix, iy]: the result has the axes of the index expressions' broadcast grid, in grid
    order (unit axes dropped as below)."""
    exprs = [k for k in key if isinstance(k, IndexExpr)]
    grid = _broadcast_shapes(*[e.shape for e in exprs])
    # The grid axes some index of this subscript moves along, a single position included
    # (nl.arange(1)[None, :]; mgrid[0:128, 0:2, 0:1] read as t[g.p, g.x, g.y] is [128, 2, 1]);
    # an axis none moves along is dropped, as NKI does (with ix, iw, iy = nl.mgrid[0:128, 0:1,
    # 0:n], t[ix, iy] is [128, n] and g[iw, iy] is [1, n]), except that a view keeps the
    # [P, F] form of a tile: idx[nl.arange(64)[:, None]] of a 1-D tensor is [64, 1], as is
    # t[i_p, 0].
    own = [[0] * (len(grid) - len(e.shape)) + list(e.coefs) for e in exprs]
    kept = [j for j in range(len(grid)) if any(c[j] for c in own)]
    for j in range(len(grid)):
        if len(kept) >= 2:
            break
        if j not in kept:
            kept = sorted(kept + [j])
    shape = [grid[j] for j in kept]
    offset = t.offset
    strides = [0] * len(shape)
    checks = []
    for d, k in enumerate(key):
        if isinstance(k, (int, np.integer)):
            k = int(k)
            if not 0 <= k < t.shape[d]:
                fail(f"index {k} is out of bounds for axis {d} of size {t.shape[d]}")
            offset += t.strides[d] * k
        elif isinstance(k, IndexExpr):
            coefs = _expand(k.coefs, k.shape, grid)
            coefs = [coefs[j] for j in kept]
            offset += t.strides[d] * k.const
            for j, c in enumerate(coefs):
                strides[j] += t.strides[d] * c
            checks.append((k.const, tuple(coefs), t.shape[d], d))
        elif isinstance(k, slice) and k == slice(None) and t.shape[d] == 1:
            pass
        else:
            fail("index expressions (nl.arange / nl.mgrid) mix only with integer indices; "
                 f"axis {d} got {k!r}")
    return NkiTensor(t._buf, offset, shape, strides, checks)


# NOTE: imported last: views indexed by run-time values build on everything above.
from openneuron.nki._runtime_index import (  # noqa: F401
    _ap_indirect,
    _ap_scalar_offset,
    _dynamic_key,
    _index_dynamic,
    _index_indirect,
    index_tile,
)
