# The spellings NKI's published examples (aws-neuron-sdk nki/test) use beyond the core API,
# each against numpy: Beta 1's engine constants and nki.trace, SPMD dimensions over logical
# NeuronCores (nl.spmd_dim / nl.nc), direct allocation (neuronxcc.nki.compiler), tiles with
# leading block axes (B, nl.par_dim(P), F), and nl.shared_identity_matrix.
import numpy as np
import pytest

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki
from openneuron.nki import compiler as ncc

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def test_engine_constants_and_values():
    assert nisa.vector_engine is nisa.engine.vector and nisa.scalar_engine is nisa.engine.scalar
    assert nisa.tensor_engine is nisa.engine.tensor and nisa.gpsimd_engine is nisa.engine.gpsimd
    # NKI's numbering (an engine passed as an int means the same engine)
    assert [nisa.engine[n].value for n in ("unknown", "tensor", "scalar", "gpsimd", "dma",
                                           "vector", "sync")] == [0, 1, 2, 3, 4, 5, 6]

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nisa.nc_transpose(nisa.tensor_copy(t, engine=nisa.vector_engine),
                                        engine=nisa.vector_engine))
        return out

    a = rand(32, 32)
    np.testing.assert_array_equal(k(a), a.T)


def test_trace_decorator_with_simulate_kernel():
    @nki.trace
    def k(a, out):
        nl.store(out, nl.load(a) * 2.0)

    a, out = rand(16, 8), np.zeros((16, 8), np.float32)
    nki.simulate_kernel(k, a, out)
    np.testing.assert_array_equal(out, 2 * a)


@pytest.mark.parametrize("dim", [lambda: nl.spmd_dim(nl.nc(2), 2), lambda: nl.nc(2) * 2,
                                 lambda: nl.spmd_dim(2, nl.nc(2)), lambda: 2 * nl.nc(2)])
def test_spmd_dimensions_over_logical_cores(dim):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        nl.store(out[i, j], nl.load(a[i, j]) + float(i * 10 + j))
        return out

    d = dim()
    assert int(d) == 4
    a = rand(4, 2, 1, 3)
    want = a + (np.arange(4)[:, None] * 10 + np.arange(2)[None, :])[:, :, None, None]
    np.testing.assert_allclose(k[d, 2](a), want, rtol=1e-6)
    with pytest.raises(nki.NkiError, match="positive"):
        nl.spmd_dim(nl.nc(2), 0)


def test_block_axes_before_the_partition_dim():
    """(B, nl.par_dim(P), F): B tiles of [P, F] in the free bytes of P partitions (the SBUF
    budget counts B * F per partition); t[b] is one tile; stored whole, the view is the
    [B, P, F] tensor."""
    @nki.jit
    def k(a):
        B, P, F = a.shape
        t = nl.ndarray((B, nl.par_dim(P), F), dtype=a.dtype, buffer=nl.sbuf)
        e = nl.ndarray((B, nl.par_dim(P), F), dtype=a.dtype, buffer=nl.sbuf)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for b in nl.affine_range(B):
            t[b] = nl.load(a[b])
            e[b] = nl.exp(t[b])
            nl.store(out[b], value=e[b])
        copy = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(copy, value=t)
        return out, copy

    a = rand(4, 128, 512)  # 2 x 4 x 512 float32 = 16 KiB a partition; [4, 128, 512]: 256 KiB
    out, copy = k(a)
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-6)
    np.testing.assert_array_equal(copy, a)

    @nki.jit
    def too_big(a):
        nl.ndarray((64, nl.par_dim(128), 1024), dtype=nl.float32, buffer=nl.sbuf)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    with pytest.raises(nki.NkiError, match="SBUF is full"):
        too_big(rand(4, 4))


def test_direct_allocation_and_shared_identity_matrix():
    """A transpose through the Tensor Engine as NKI's modulo-allocation example writes it:
    tiles placed with ncc.sbuf / ncc.psum, the identity from nl.shared_identity_matrix."""
    def mod_alloc(base_addr, **_):
        return lambda idx, pdim_size, fdim_size: (0, base_addr)

    @nki.jit
    def transpose(a, out):
        ip, jf = nl.arange(128)[:, None], nl.arange(128)[None, :]
        identity = nl.shared_identity_matrix(n=128, dtype=nl.bfloat16)
        for n0 in nl.affine_range(a.shape[0] // 128):
            for m0 in nl.affine_range(a.shape[1] // 128):
                t = nl.ndarray((nl.par_dim(128), 128), dtype=a.dtype,
                               buffer=ncc.sbuf.alloc(mod_alloc(base_addr=1024)))
                t[ip, jf] = nl.load(a[n0 * 128 + ip, m0 * 128 + jf])
                eye = nl.ndarray((nl.par_dim(128), 128), dtype=a.dtype,
                                 buffer=ncc.sbuf.mod_alloc(base_addr=0))
                eye[ip, jf] = nl.load(identity, dtype=a.dtype)
                tp = nl.ndarray((nl.par_dim(128), 128), dtype=a.dtype,
                                buffer=ncc.psum.mod_alloc(base_bank=0))
                tp[ip, jf] = nisa.nc_matmul(t[ip, jf], eye)
                nl.store(out[m0 * 128 + ip, n0 * 128 + jf], value=nl.copy(tp[ip, jf]))

    a, out = rand(256, 384), np.zeros((384, 256), np.float32)
    nki.simulate_kernel(transpose, a, out)
    np.testing.assert_array_equal(out, a.T)
    with pytest.raises(nki.NkiError, match="allocation function"):
        nki.simulate_kernel(nki.jit(lambda a: nl.ndarray((8, 8), dtype=nl.float32,
                                                         buffer=ncc.sbuf.alloc(3))), a)
