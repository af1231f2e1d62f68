"""The tracer behind openneuron.nki (DESIGN §8): one run of a kernel body with concrete loop
indices and program ids records a flat instruction program (affine access patterns, masks as
affine predicates) for the C++ executor in csrc/nki. It owns the hardware limits (checked as
each call is recorded, errors naming the kernel's line), on-chip memory accounting (a tile lives
while its Python object does) and the program's encoding. The API on top is language.py /
isa.py; kernels, caching and launches are _kernel.py."""

from __future__ import annotations

import os
import struct
import sys
import threading

import numpy as np

from openneuron import _C

_TABLES = _C._nki_tables()
OPS = {name: code for name, (code, _) in _TABLES["ops"].items()}
ARITY = {name: arity for name, (_, arity) in _TABLES["ops"].items()}
DTYPE_CODES = {name: code for name, (code, _) in _TABLES["dtypes"].items()}
DTYPE_SIZES = {name: size for name, (_, size) in _TABLES["dtypes"].items()}
MAX_DIMS = _TABLES["max_dims"]
MAX_REGISTERS = _TABLES["max_registers"]

# The NeuronCore's on-chip limits (NeuronCore-v2/v3, as NKI documents them).
PMAX = 128  # partitions
SBUF_PARTITION_BYTES = 192 * 1024  # 24 MiB / 128 partitions
PSUM_PARTITION_BYTES = 16 * 1024  # 2 MiB / 128 partitions: 8 banks
# Tiles Python still references may exceed capacity while traced (check_capacity decides by
# use), up to this many times it.
_REFERENCED_LIMIT = 8
PSUM_BANK_BYTES = 2 * 1024
GEMM_STATIONARY_FMAX = 128
GEMM_MOVING_FMAX = 512
PSUM_FMAX = 512
BN_STATS_FMAX = 512

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_MAGIC = 0x4E4B4931
KIND_BRANCH = 8  # csrc/nki/program.h Kind::kBranch


class NkiError(ValueError):
    """A kernel broke a rule of the NKI programming model or a hardware limit; the message names
    the kernel and the line of the offending call."""


_local = threading.local()


def current() -> Trace:
    t = getattr(_local, "trace", None)
    if t is None:
        raise NkiError("nki.language / nki.isa calls run only inside a kernel: decorate the "
                       "function with @nki.jit and call it with arrays or tensors")
    return t


def user_line() -> str:
    """file:line of the innermost frame outside this package (the kernel's call)."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PACKAGE_DIR:
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def fail(message: str):
    """Raises NkiError naming the kernel and its current line."""
    t = getattr(_local, "trace", None)
    where = user_line()
    name = t.kernel_name if t is not None else "?"
    raise NkiError(f"{where}: in kernel '{name}': {message}")


# --- dtypes ------------------------------------------------------------------------------------

_DTYPE_ALIASES = {"bool": "uint8", "bool_": "uint8", "float": "float32", "tfloat32": "float32",
                  "half": "float16", "int": "int32", "short": "int16",
                  "float8_e4m3fn": "float8_e4m3"}
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2")


def dtype_name(dt) -> str:
    """The canonical name ("float32", "bfloat16", ...) of any dtype spelling a kernel may use:
    numpy types/dtypes, torch dtypes, strings, nl constants."""
    if isinstance(dt, str):
        name = dt
    elif hasattr(dt, "_nki_dtype"):
        name = dt._nki_dtype
    elif type(dt).__module__ == "torch" and type(dt).__name__ == "dtype":
        name = str(dt).replace("torch.", "")
    else:
        try:
            name = np.dtype(dt).name
        except TypeError:
            fail(f"unsupported dtype {dt!r}")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_CODES:
        fail(f"dtype {name} is not supported on the neuron device's NKI executor (supported: "
             f"{', '.join(DTYPE_CODES)})")
    return name


def is_float(name: str) -> bool:
    return name in FLOAT_DTYPES


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if is_float(a) and is_float(b):
        return "float32"
    if is_float(a):
        return a
    if is_float(b):
        return b
    return "int32"


# --- buffers and on-chip memory ----------------------------------------------------------------

class Buffer:
    """One allocation: an HBM tensor (kernel input, output or scratch) or an SBUF/PSUM tile.
    Its on-chip bytes are released when the last view of it is dropped."""

    def __init__(self, trace: Trace, kind: str, shape: tuple, dtype: str, role: str,
                 blocks: int = 1, direct=None):
        self.trace = trace
        self.blocks = blocks  # tiles side by side in each partition: (B, nl.par_dim(P), F)
        # a direct allocation (neuronxcc.nki.compiler): (base address or None, physical tiles)
        self.direct = direct
        self.kind = kind  # "hbm" | "sbuf" | "psum"
        self.shape = tuple(shape)
        self.dtype = dtype
        self.role = role  # "input" | "hbm" (allocated in the kernel) | "tile"
        self.id = trace.new_buffer_id(self)
        self.numel = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        self.nbytes = self.numel * DTYPE_SIZES[dtype]
        trace.buffers[self.id][2] = self.nbytes
        self.state = "init"  # "uninit" until written; an uninit read gets a NaN fill first
        self.fill = None
        self.placed = False
        self.mm_open = set()  # PSUM views matmuls wrote that nothing has read since (isa.py)
        if kind in ("sbuf", "psum"):
            trace.alloc_tile(self)
            self.placed = True

    def __del__(self):
        trace = self.trace
        if self.placed and trace is not None and trace.active:
            trace.free_tile(self)


class Arena:
    """First-fit placement of live tiles within one partition (64-byte aligned): a tile holds
    the same byte range [offset, offset + bytes per partition) in every partition, as on the
    hardware (see layout())."""

    def __init__(self):
        self.free = []  # sorted (offset, size)
        self.end = 0
        self.peak = 0

    def alloc(self, size: int) -> int:
        size = (size + 63) // 64 * 64
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                if sz == size:
                    del self.free[i]
                else:
                    self.free[i] = (off + size, sz - size)
                return off
        off = self.end
        self.end += size
        self.peak = max(self.peak, self.end)
        return off

    def release(self, off: int, size: int):
        size = (size + 63) // 64 * 64
        self.free.append((off, size))
        self.free.sort()
        merged = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        if merged and merged[-1][0] + merged[-1][1] == self.end:
            self.end = merged[-1][0]
            merged.pop()
        self.free = merged


# --- instructions ------------------------------------------------------------------------------

class Operand:
    """A view bound to an instruction's iteration axes: buffer id, element offset and one stride
    per axis; or a constant; or an iota (offset + sum stride * index as a value)."""

    __slots__ = ("buf", "dtype", "offset", "strides", "type", "value")

    def __init__(self, type_, dtype="float32", buf=None, offset=0, strides=(), value=0.0):
        self.type = type_  # 0 view, 1 const, 2 iota
        self.dtype = dtype
        self.buf = buf
        self.offset = offset
        self.strides = list(strides)
        self.value = value


class Instr:
    __slots__ = (
        "acc_op",
        "accumulate",
        "dst",
        "enabled",
        "extent",
        "extra",
        "kind",
        "line",
        "nreduce",
        "post_scale",
        "preds",
        "reduce_op",
        "src",
        "steps",
        "target",
    )

    def __init__(self, kind, extent, dst, src=(), steps=(), preds=(), nreduce=0,
                 reduce_op="add", accumulate=False, acc_op="add", post_scale=1.0, line=-1):
        self.kind = kind
        self.extent = list(extent)
        self.dst = dst
        self.src = list(src)
        self.steps = list(steps)
        self.preds = list(preds)
        self.nreduce = nreduce
        self.reduce_op = reduce_op
        self.accumulate = accumulate
        self.acc_op = acc_op
        self.post_scale = post_scale
        self.line = line
        self.enabled = True
        self.extra = ()  # kind-specific words after the predicates (a gather's bounds)
        self.target = None  # a branch's (instruction, k): it jumps k instructions after that one


def _f64_word(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


class Trace:
    """One grid instance's recording: its instructions, buffers and on-chip usage."""

    def __init__(self, kernel_name: str, program_ids: tuple, grid: tuple, lines: list,
                 line_index: dict, buffer_ids):
        self.kernel_name = kernel_name
        self.program_ids = program_ids
        self.grid = grid
        self.instrs: list[Instr] = []
        self.fills = set()  # positions in instrs of the tiles' NaN fills (_emit)
        self.lines = lines  # shared by the instances of one program
        self.line_index = line_index
        # id -> [kind, dtype, nbytes, role, offset (in a partition for tiles), shape]
        self.buffers = {}
        self.buffer_ids = buffer_ids
        self.arena = Arena()
        self.tiles = {}  # tile id -> [elements per partition, partition offset, linear offset]
        self.partitions = 0  # the most partitions any tile spans
        self.pitch = 0  # bytes from one partition to the next in the executor's arena
        self.sbuf_used = 0
        self.psum_used = 0
        self.sbuf_peak = 0
        self.psum_peak = 0
        # (id, kind, bytes per partition, shape, dtype, first instruction, where allocated)
        self.tile_allocs = []
        self.hbm_allocs = []  # ids of HBM buffers the kernel allocated, in order
        self.constants = []  # (id, numpy data) of nl.shared_constant tensors, in order
        self.prints = []  # (id, prefix) of nl.device_print copies, hidden outputs, in order
        self.psum_written = {}  # PSUM tile id -> blocks (banks) some instruction has written
        self.block_counts = {}  # tile id -> blocks, for (B, nl.par_dim(P), F) tiles
        # run-time loops (_control.py): those open, outermost first, each
        # {"head": index of its first branch, "line": where, "deferred": buffers}; and the
        # (head, back) instruction spans of those closed
        self.loops = []
        self.loop_spans = []
        self.active = True

    def new_buffer_id(self, buf: Buffer) -> int:
        i = next(self.buffer_ids)
        self.buffers[i] = [buf.kind, buf.dtype, 0, buf.role, None, buf.shape]
        if buf.role == "hbm":
            self.hbm_allocs.append(i)
        return i

    def line(self) -> int:
        where = user_line()
        i = self.line_index.get(where)
        if i is None:
            i = self.line_index[where] = len(self.lines)
            self.lines.append(where)
        return i

    # on-chip memory
    def alloc_tile(self, buf: Buffer):
        p = buf.shape[0] if buf.shape else 1
        if p > PMAX:
            fail(f"tile partition dimension {p} (shape {list(buf.shape)}) exceeds "
                 f"{PMAX} (nl.tile_size.pmax); the first dimension of an SBUF/PSUM tile is its "
                 f"partition dimension: split it into tiles of at most {PMAX} rows")
        per_partition = (buf.nbytes // p) if p else 0
        # The bytes capacity counts. A direct allocation is the kernel's to place (overlapping
        # others by design, as modulo allocations reuse tiles): it must end within the memory
        # and counts nothing here; the device still gives every block memory of its own.
        physical = per_partition
        if buf.direct is not None:
            base, tiles = buf.direct
            unit = PSUM_BANK_BYTES if buf.kind == "psum" else per_partition // buf.blocks
            cap = PSUM_PARTITION_BYTES if buf.kind == "psum" else SBUF_PARTITION_BYTES
            if base is not None and base + unit * tiles > cap:
                fail(f"{buf.kind.upper()} direct allocation of {list(buf.shape)} {buf.dtype}: "
                     f"{tiles} tile(s) of {unit} bytes from byte {base} of a partition end past "
                     f"its {cap}")
            physical = 0
        if buf.kind == "psum":
            if per_partition // buf.blocks > PSUM_BANK_BYTES:
                fail(f"PSUM tile {list(buf.shape)} {buf.dtype} needs {per_partition // buf.blocks}"
                     f" bytes per partition; a PSUM tile must fit one 2 KiB bank "
                     f"(nl.tile_size.psum_fmax = {PSUM_FMAX} float32 per partition; a tile of "
                     f"block axes, (B, nl.par_dim(P), F), takes a bank per block)")
            self.psum_used += physical
        else:
            self.sbuf_used += physical
        # Capacity is checked when the trace is complete (check_capacity), by when each tile is
        # last used; placement here goes by Python's references, which outlive that (a loop's
        # last tile stays bound to its variable), so only a runaway is stopped now.
        held = self.psum_used if buf.kind == "psum" else self.sbuf_used
        cap = PSUM_PARTITION_BYTES if buf.kind == "psum" else SBUF_PARTITION_BYTES
        if physical > cap:
            fail(f"{buf.kind.upper()} is full: this tile {list(buf.shape)} {buf.dtype} needs "
                 f"{physical} bytes per partition, more than the {cap} there are; use "
                 f"smaller tiles")
        if held > _REFERENCED_LIMIT * cap:
            fail(f"{buf.kind.upper()} is full: tiles the kernel still references hold {held} "
                 f"bytes per partition, {_REFERENCED_LIMIT}x the {cap} there are, with this tile "
                 f"{list(buf.shape)} {buf.dtype}; drop references to tiles no longer needed")
        self.tile_allocs.append((buf.id, buf.kind, physical, list(buf.shape), buf.dtype,
                                 len(self.instrs), user_line()))
        buf.alloc_at = len(self.instrs)
        off = self.arena.alloc(per_partition) if per_partition else 0
        self.buffers[buf.id][2] = buf.nbytes
        self.buffers[buf.id][4] = off
        self.tiles[buf.id] = [buf.numel // p if p else 0, off, None]
        self.partitions = max(self.partitions, p)
        buf.per_partition = per_partition
        buf.physical = physical
        if buf.blocks > 1:
            self.block_counts[buf.id] = buf.blocks

    def check_capacity(self):
        """SBUF / PSUM capacity with the compiler's liveness: a tile is in use from the first
        instruction that reads or writes it (its allocation, when none does) to the last. Sets
        the peaks; over capacity is an error naming where the tile that goes over was
        allocated."""
        uses = {}
        for i, ins in enumerate(self.instrs):
            # a NaN fill (_emit._placeholder_fill) models uninitialized memory: no use
            if ins.enabled and i not in self.fills:
                for o in (ins.dst, *ins.src):
                    if o is not None and o.type == 0 and o.buf is not None:
                        uses.setdefault(o.buf, []).append(i)
        last = {bid: u[-1] for bid, u in uses.items()}
        kinds = {a[0]: a[1] for a in self.tile_allocs}

        def forwarded(bid):
            """`x[...] = nisa.op(...)`: the op's result, copied at once into a tile of its own
            memory and used nowhere else, is written in place by the compiler (no room)."""
            u = uses.get(bid, [])
            if len(u) != 2 or u[1] != u[0] + 1:
                return False
            made, nxt = self.instrs[u[0]].dst, self.instrs[u[1]].dst
            return made is not None and made.buf == bid and nxt is not None and \
                nxt.buf != bid and kinds.get(nxt.buf) == kinds[bid]

        for kind, cap in (("sbuf", SBUF_PARTITION_BYTES), ("psum", PSUM_PARTITION_BYTES)):
            events = []
            for bid, k, size, shape, dtype, start, where in self.tile_allocs:
                if k == kind and size and not forwarded(bid):
                    # NOTE: from the first use, not the nl.ndarray call: nki-library's
                    # find_nonzero_indices allocates a chunk's four tiles at once and uses
                    # them one after another (196 KiB at once, 129 KiB live)
                    end = max(start, last.get(bid, start))
                    made = start
                    start = uses[bid][0] if bid in uses else start
                    for head, back in self.loop_spans:
                        # made before a run-time loop and used in it: in use all through it
                        if made < head <= end:
                            start, end = min(start, head), max(end, back)
                    events.append((start, 1, size, shape, dtype, where))
                    events.append((end + 1, 0, -size, shape, dtype, where))
            used = peak = 0
            for _, _, delta, shape, dtype, where in sorted(events, key=lambda e: e[:2]):
                used += delta
                if used > cap:
                    what = ("(24 MiB / 128 partitions); use smaller tiles or finish with a tile "
                            "before allocating the next" if kind == "sbuf" else
                            "(8 banks of 2 KiB); finish with a PSUM tile before allocating "
                            "the next")
                    raise NkiError(f"{where}: in kernel '{self.kernel_name}': "
                                   f"{kind.upper()} is full: this tile {shape} {dtype} takes "
                                   f"{delta} bytes per partition and brings the tiles in use to "
                                   f"{used} of {cap} {what} (a tile is in use from the first "
                                   f"instruction that reads or writes it to the last)")
                peak = max(peak, used)
            setattr(self, f"{kind}_peak", peak)

    def free_tile(self, buf: Buffer):
        # A tile from before a run-time loop that the body drops may still be read by the next
        # iteration: its memory is not reused before the loop ends (_control.close_loop).
        for loop in self.loops:
            if loop["head"] > buf.alloc_at:
                loop["deferred"].append(buf)
                return
        self.release_tile(buf)

    def release_tile(self, buf: Buffer):
        if buf.kind == "psum":
            self.psum_used -= buf.physical
        else:
            self.sbuf_used -= buf.physical
        if buf.per_partition:
            self.arena.release(self.buffers[buf.id][4], buf.per_partition)

    def add(self, instr: Instr) -> Instr:
        self.instrs.append(instr)
        d = instr.dst
        if instr.enabled and d is not None and d.type == 0 and d.buf in self.tiles and \
                self.buffers[d.buf][0] == "psum":
            self.psum_written.setdefault(d.buf, set()).update(
                psum_blocks(self, d.buf, d.offset, d.strides, instr.extent))
        return instr

    def layout(self) -> int:
        """Places the tiles in the executor's arena once the trace is complete and returns the
        bytes they take. Partition q of a tile at partition offset `off` starts at byte
        q * pitch + off, so tiles of any shape that share no partition bytes share no arena
        bytes, and a row (partition) of one tile never aliases another row of any tile: the
        executor then runs whole tile loops in row blocks (csrc/nki/program.cpp). A tile that
        some operand walks across partitions within one axis (an `ap` pattern over the
        flattened tile) gets its own contiguous, row-major bytes after the partitions."""
        # NOTE: an odd number of 64-byte lines per partition keeps the rows of a block in
        # different L1 sets (a 4 KiB multiple would put them all in one).
        lines = (self.arena.peak + 63) // 64
        self.pitch = (lines + 1 - lines % 2) * 64 if lines else 0
        end = self.pitch * self.partitions
        for ins in self.instrs:
            if not ins.enabled:
                continue
            for o in (ins.dst, *ins.src):
                if o.type != 0 or o.buf not in self.tiles:
                    continue
                tile = self.tiles[o.buf]
                if tile[2] is None and partition_view(o, ins.extent, tile[0], 1) is None:
                    tile[2] = end
                    end += (self.buffers[o.buf][2] + 63) // 64 * 64
        return end


def psum_blocks(t: Trace, bid: int, offset: int, strides, extent) -> range:
    """The blocks (one per bank: a tile's whole free size, or one block of a (B,
    nl.par_dim(P), F) tile) that elements offset + sum(i * stride) of PSUM tile bid touch."""
    per_partition = t.tiles[bid][0]
    if per_partition == 0:
        return range(0)
    block = per_partition // t.block_counts.get(bid, 1)
    lo = hi = offset % per_partition
    for st, n in zip(strides, extent):
        if n > 1 and st % per_partition:
            reach = st * (n - 1)
            lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return range(max(lo, 0) // block, min(hi, per_partition - 1) // block + 1)


def encode(program_traces: list, slots: dict, slot_bytes: list, arena_slot: int) -> np.ndarray:
    """The executor's encoding of every instance (csrc/nki/program.cpp reads it). slots maps an
    HBM buffer id to its slot; every other buffer lives in the arena at its assigned offset."""
    words = [_MAGIC, len(slot_bytes), *slot_bytes, len(program_traces)]
    for t in program_traces:
        live = [i for i in t.instrs if i.enabled]
        pos = {id(ins): k for k, ins in enumerate(live)}
        words.append(len(live))
        for ins in live:
            nd = len(ins.extent)
            words += [ins.kind, nd, *ins.extent, ins.nreduce, OPS[ins.reduce_op],
                      int(ins.accumulate), OPS[ins.acc_op], _f64_word(ins.post_scale), ins.line]
            _encode_operand(words, ins.dst, t, slots, arena_slot, ins.extent)
            words.append(len(ins.src))
            for o in ins.src:
                _encode_operand(words, o, t, slots, arena_slot, ins.extent)
            words.append(len(ins.steps))
            for op, a, b, c in ins.steps:
                words += [OPS[op], a, b, c]
            words.append(len(ins.preds))
            for c, coefs in ins.preds:
                words += [c, *coefs]
            if ins.kind == KIND_BRANCH:  # (condition, step) -> condition, target, step
                to, k = ins.target
                words += [ins.extra[0], pos[id(to)] + k, ins.extra[1]]
            else:
                words += list(ins.extra)
    return np.asarray(words, dtype=np.int64)


def partition_view(o: Operand, extent, per_partition: int, pitch: int):
    """A tile operand's (element offset, strides) in partition-major memory, `pitch` elements
    from one partition to the next, relative to the tile's partition offset: each axis either
    steps whole partitions (its stride a multiple of the elements per partition) or stays
    within every partition it visits. None when some axis crosses partitions otherwise."""
    strides = list(o.strides) + [0] * (len(extent) - len(o.strides))
    if per_partition == 0:
        return o.offset, strides
    p0, f0 = divmod(o.offset, per_partition)
    lo = hi = f0
    mapped = []
    for st, n in zip(strides, extent):
        if st % per_partition == 0:
            mapped.append(st // per_partition * pitch)
            continue
        reach = st * (n - 1) if n > 1 else 0
        if reach < 0:
            lo += reach
        else:
            hi += reach
        mapped.append(st)
    if lo < 0 or hi >= per_partition:
        return None
    return p0 * pitch + f0, mapped


def _encode_operand(words, o: Operand, t: Trace, slots, arena_slot, extent):
    slot, offset = 0, o.offset
    strides = list(o.strides) + [0] * (len(extent) - len(o.strides))
    if o.type == 0:
        if o.buf in slots:
            slot = slots[o.buf]
        else:
            slot = arena_slot
            size = DTYPE_SIZES[o.dtype]
            tile = t.tiles.get(o.buf)
            if tile is None:  # HBM scratch
                offset += t.buffers[o.buf][4] // size
            elif tile[2] is not None:  # row-major (see Trace.layout)
                offset += tile[2] // size
            else:
                view = partition_view(o, extent, tile[0], t.pitch // size)
                offset, strides = view[0] + tile[1] // size, view[1]
    words += [o.type, DTYPE_CODES[o.dtype], slot, offset, *strides, _f64_word(o.value)]
