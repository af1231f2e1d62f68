"""`neuronxcc.nki.compiler` (`ncc`): NKI's direct allocation, where a kernel places its tiles
itself: `nl.ndarray(shape, dtype, buffer=ncc.sbuf.mod_alloc(base_addr=1024))`,
`ncc.psum.alloc(func)`, `ncc.sbuf.auto_alloc()`.

The device places tiles itself (first fit over live tiles, see _trace.Arena), so these give the
buffer they name and the placement is checked for shape only: a kernel computes the same values
wherever its tiles sit unless two of them were meant to overlap, which NKI does not allow
between live tiles either. SBUF / PSUM capacity stays enforced.
"""

from __future__ import annotations

from openneuron.nki import language as nl
from openneuron.nki._trace import fail

__all__ = ["no_reorder", "psum", "sbuf", "skip_middle_end_transformations"]


def skip_middle_end_transformations(kernel):
    """A compiler directive on a kernel (its program runs as traced here): the kernel itself."""
    return kernel


class no_reorder:
    """`nl.sequential_range(n, directives=ncc.no_reorder())`: keep the loop body's order. The
    executor runs a traced program in its order anyway (within what the data allow)."""

    def __repr__(self):
        return "ncc.no_reorder()"


class _Space:
    def __init__(self, buffer, name):
        self.buffer, self.name = buffer, name

    def alloc(self, func):
        """func(index, partition size, free size) -> (partition, byte address) per tile."""
        if not callable(func):
            fail(f"ncc.{self.name}.alloc takes an allocation function (index, partition size, "
                 f"free size) -> (partition, address), got {func!r}")
        return self.buffer

    def mod_alloc(self, *args, **kwargs):
        """Modulo allocation (base address / bank, tile counts): the buffer, placed here."""
        return self.buffer

    def auto_alloc(self):
        return self.buffer

    def __repr__(self):
        return f"ncc.{self.name}"


sbuf = _Space(nl.sbuf, "sbuf")
psum = _Space(nl.psum, "psum")
