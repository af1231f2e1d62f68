"""Helpers of the nisa tests (test_nki_isa*.py): seeded data, and kernels that run a body over
loaded tiles (Beta 1: it returns a tile; 0.x: it writes a destination)."""
import numpy as np

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(1)


def rand(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def run(body, *arrays):
    """Runs body(tiles...) -> tile in a kernel on numpy arrays; returns the tile's values."""
    @nki.jit
    def k(*ins):
        r = body(*[nl.load(a) for a in ins])
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    return k(*arrays)


def run_dst(body, out_shape, *arrays, dtype=nl.float32):
    """0.x: body(dst, tiles...) writes dst."""
    @nki.jit
    def k(*ins):
        dst = nl.ndarray(out_shape, dtype=dtype, buffer=nl.sbuf)
        assert body(dst, *[nl.load(a) for a in ins]) is None
        out = nl.ndarray(out_shape, dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out
    return k(*arrays)
