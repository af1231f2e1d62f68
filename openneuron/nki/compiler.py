"""`neuronxcc.nki.compiler` (`ncc`): NKI's direct allocation, where a kernel places its tiles
itself: `nl.ndarray(shape, dtype, buffer=ncc.sbuf.mod_alloc(base_addr=1024))`,
`ncc.psum.alloc(func)`, `ncc.sbuf.auto_alloc()`.

The device places tiles itself (first fit over live tiles, see _trace.Arena): a kernel computes
the same values wherever its tiles sit unless two of them were meant to overlap, which NKI does
not allow between live tiles either. Directly allocated tiles are the kernel's to place: they
stay out of the device's own capacity accounting, and a modulo allocation's tiles must end
within SBUF / PSUM (Placement).
"""

from __future__ import annotations

import numpy as np

from openneuron.nki import language as nl
from openneuron.nki._tensor import BufferKind
from openneuron.nki._trace import fail

__all__ = ["Placement", "no_reorder", "psum", "sbuf", "skip_middle_end_transformations"]


def skip_middle_end_transformations(kernel):
    """A compiler directive on a kernel (its program runs as traced here): the kernel itself."""
    return kernel


# `nl.sequential_range(n, directives=ncc.no_reorder())`, `with nl.no_reorder():`
no_reorder = nl.no_reorder


class Placement(BufferKind):
    """A direct allocation: an on-chip buffer whose block axes ((B, nl.par_dim(P), F)) map onto
    `tiles` physical tiles per axis, modulo (None: one per block). The device keeps every block
    in memory of its own (a correct kernel never reads a block after its tile was reused, so the
    values are the same); capacity counts the physical tiles."""

    def __init__(self, space, tiles=None, base=None):
        super().__init__(space.name, space.kind)
        self.tiles = None if tiles is None else tuple(int(n) for n in tiles)
        self.base = base  # byte address in a partition (PSUM: bank * 2 KiB); None: a function's

    def physical_blocks(self, block_shape) -> int:
        if self.tiles is None:
            return int(np.prod(block_shape, dtype=np.int64))
        # NKI's modulo_allocate_func: no counts means one tile for every block
        counts = self.tiles or (1,) * len(block_shape)
        return int(np.prod([min(c, b) for c, b in zip(counts, block_shape)], dtype=np.int64))


class _Space:
    def __init__(self, buffer, name):
        self.buffer, self.name = buffer, name

    def alloc(self, func):
        """func(index, partition size, free size) -> (partition, byte address) per tile."""
        if not callable(func):
            fail(f"ncc.{self.name}.alloc takes an allocation function (index, partition size, "
                 f"free size) -> (partition, address), got {func!r}")
        return Placement(self.buffer)

    def mod_alloc(self, base_addr=0, *, base_bank=0, base_partition=0, num_par_tiles=(),
                  num_free_tiles=(), num_bank_tiles=()):
        """Modulo allocation: block b of a (B..., nl.par_dim(P), F) buffer on tile b % count
        (SBUF: num_free_tiles, PSUM: num_bank_tiles, a bank each)."""
        counts = tuple(num_bank_tiles if self.name == "psum" else num_free_tiles)
        if any(int(c) < 1 for c in counts):
            fail(f"ncc.{self.name}.mod_alloc: tile counts must be positive, got {counts}")
        base = int(base_bank) * 2048 if self.name == "psum" else int(base_addr)
        if base < 0:
            fail(f"ncc.{self.name}.mod_alloc: negative base address {base}")
        return Placement(self.buffer, counts, base)

    def auto_alloc(self):
        return self.buffer

    def __repr__(self):
        return f"ncc.{self.name}"


sbuf = _Space(nl.sbuf, "sbuf")
psum = _Space(nl.psum, "psum")
