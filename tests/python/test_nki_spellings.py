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


def test_shared_constant_is_a_hidden_input():
    """nl.shared_constant: data known when traced, on numpy arrays and neuron tensors (copied
    once per device), bfloat16 through ml_dtypes, the same in every grid instance; writing it or
    returning it is an error."""
    import torch

    scale = np.linspace(-1, 1, 64, dtype=np.float32).reshape(64, 1)

    @nki.jit
    def k(a):
        c = nl.shared_constant(scale)
        eye = nl.shared_constant(np.identity(64, dtype=np.int8), dtype=nl.bfloat16)
        out = nl.ndarray((64, 2 * a.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(a[:, i * 32:(i + 1) * 32])
        prod = nl.copy(nisa.nc_matmul(nl.load(eye, dtype=nl.float32), t))  # eye^T @ t = t
        nl.store(out[:, i * 32:(i + 1) * 32], prod * nl.load(c))
        nl.store(out[:, 64 + i * 32:64 + (i + 1) * 32], t)
        return out

    a = rand(64, 64)
    want = np.concatenate([a * scale, a], axis=1)
    np.testing.assert_allclose(k[2](a), want, rtol=1e-6)
    dev = torch.from_numpy(a).to("neuron")
    for _ in range(2):  # the second launch reuses the device copy
        np.testing.assert_allclose(k[2](dev).cpu().numpy(), want, rtol=1e-6)
    assert len(k[2].specialize(dev).device_constants) == 1

    @nki.jit
    def writes(a):
        c = nl.shared_constant(np.zeros((4, 4), np.float32))
        nl.store(c, nl.load(a))  # WRITE
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(c))
        return out

    with pytest.raises(nki.NkiError, match="read-only") as e:
        writes(rand(4, 4))
    assert "test_nki_spellings.py" in str(e.value)

    @nki.jit
    def returns(a):
        return nl.shared_constant(np.zeros((4, 4), np.float32))

    with pytest.raises(nki.NkiError, match="returns an nl.shared_constant"):
        returns(rand(4, 4))


def test_psum_accumulation_group_starts_by_overwriting():
    """`acc[...] += nisa.nc_matmul(...)` into PSUM nothing has written starts the accumulation
    (NKI: the first matmul into a PSUM location overwrites), per bank of a block tile; an
    elementwise += into an unwritten tile still reads its NaN."""
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((3, nl.par_dim(64), 128), dtype=nl.float32, buffer=nl.psum)
        out = nl.ndarray((3, 64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        for blk in nl.affine_range(3):
            for kt in nl.affine_range(2):
                acc[blk] += nisa.nc_matmul(nl.load(a[blk, kt * 128:(kt + 1) * 128]),
                                           nl.load(b[blk, kt * 128:(kt + 1) * 128]))
            nl.store(out[blk], nl.copy(acc[blk]))
        return out

    a, b = rand(3, 256, 64), rand(3, 256, 128)
    want = np.einsum("bkm,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(k(a, b), want, rtol=1e-4, atol=1e-4)

    @nki.jit
    def elementwise(a):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        acc[...] += nl.load(a)
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(acc))
        return out

    assert np.isnan(elementwise(rand(64, 128))).all()


def test_modulo_allocation_counts_physical_tiles():
    """ncc.psum.mod_alloc(num_bank_tiles=(2,)) maps 32 blocks on 2 banks: it fits, and the
    device's own accounting leaves it out (direct allocations overlap by design); a placement
    past the memory's end is an error."""
    @nki.jit
    def k(a):
        t = nl.ndarray((32, nl.par_dim(128), 512), dtype=nl.float32,
                       buffer=ncc.psum.mod_alloc(base_bank=6, num_bank_tiles=(2,)))
        auto = nl.ndarray((8, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        out = nl.ndarray((32, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(32):
            t[i] = nl.load(a) * float(i)
            auto[i % 8] = nl.copy(t[i])
            nl.store(out[i], auto[i % 8])
        return out

    a = rand(128, 512)
    np.testing.assert_allclose(k(a), a[None] * np.arange(32, dtype=np.float32)[:, None, None],
                               rtol=1e-6)

    @nki.jit
    def past_end(a):
        nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32,
                   buffer=ncc.psum.mod_alloc(base_bank=7, num_bank_tiles=(2,)))  # END
        return a

    with pytest.raises(nki.NkiError, match="direct allocation .* end past"):
        past_end(a)


def test_library_helpers_nkiobject_buffer_predicates_no_reorder():
    """What aws-neuron/nki-library kernels lean on: nl.NKIObject configuration classes,
    nl.is_hbm / is_sbuf / is_psum / is_on_chip, `with nl.no_reorder():`, nl.float8_e4m3fn and
    nl.bool_ dtypes, nisa.nc_version.gen4 / matmul_perf_mode / get_nc_sub_version."""
    class Cfg(nl.NKIObject):
        pass

    cfg = Cfg(scale=3.0, rows=16)
    assert (cfg.scale, cfg.rows) == (3.0, 16)
    assert nisa.nc_version.gen4 == 4 and nisa.get_nc_sub_version() == 0
    assert nisa.matmul_perf_mode("double_row") is nisa.matmul_perf_mode.double_row
    assert nl.float8_e4m3fn == nl.float8_e4m3  # one format: torch's float8_e4m3fn

    @nki.jit
    def k(a, flags):
        assert nl.is_hbm(a) and nl.is_hbm(nl.shared_hbm) and not nl.is_on_chip(a)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        with nl.no_reorder():
            t = nl.load(a)
            assert nl.is_sbuf(t) and nl.is_on_chip(t) and not nl.is_psum(t)
            m = nl.load(flags)
            nl.store(out, nl.where(m, t * cfg.scale, t))
        return out

    a = rand(cfg.rows, 8)
    flags = RNG.integers(0, 2, size=(cfg.rows, 8)).astype(nl.bool_)
    np.testing.assert_allclose(k(a, flags), np.where(flags, 3 * a, a), rtol=1e-6)


def test_device_print_shows_values_at_that_point(capsys):
    """nl.device_print: the tile's values where the call is, printed when the launch ends (a
    line per grid instance), on numpy arrays and on neuron tensors (the launch then waits)."""
    import torch

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(a[i * 2:(i + 1) * 2])
        nl.device_print("loaded", t)
        t[...] = t * 2.0
        nl.device_print("doubled", t)
        nl.store(out[i * 2:(i + 1) * 2], t)
        return out

    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    for arg in (a, torch.from_numpy(a).to("neuron")):
        out = k[2](arg)
        np.testing.assert_array_equal(out.cpu().numpy() if hasattr(out, "cpu") else out, 2 * a)
        lines = capsys.readouterr().out.replace("\n ", " ").splitlines()
        assert lines == ["loaded [program 0] [[0. 1. 2.] [3. 4. 5.]]",
                         "loaded [program 1] [[ 6.  7.  8.] [ 9. 10. 11.]]",
                         "doubled [program 0] [[ 0.  2.  4.] [ 6.  8. 10.]]",
                         "doubled [program 1] [[12. 14. 16.] [18. 20. 22.]]"], lines


def test_gather_flattened_takes_along_each_row():
    """nl.gather_flattened: each partition's own indices into its flattened free elements
    (numpy's take_along_axis), any integer index dtype, on numpy arrays and neuron tensors; an
    index past the row is an error when the kernel runs, naming the line."""
    import torch

    @nki.jit
    def k(d, i):
        out = nl.ndarray(i.shape, dtype=d.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(d), nl.load(i)))  # GATHER
        return out

    d = rand(40, 4, 16)
    flat = d.reshape(40, 64)
    for dt in (np.uint32, np.int32, np.uint16):
        idx = ((np.arange(40 * 12).reshape(40, 12) * 7) % 64).astype(dt)
        want = np.take_along_axis(flat, idx.astype(np.int64), axis=1)
        np.testing.assert_array_equal(k(d, idx), want)
    dev = k(torch.from_numpy(d).to("neuron"), torch.from_numpy(idx.astype(np.int32)).to("neuron"))
    np.testing.assert_array_equal(dev.cpu().numpy(), want)
    bad = idx.astype(np.int32)
    bad[7, 3] = 64
    with pytest.raises(RuntimeError, match="test_nki_spellings.py:.*gather_flattened index 64"):
        k(d, bad)


def test_double_row_matmul_and_3d_mgrid_names():
    """nisa.nc_matmul(perf_mode="double_row"...) on float8 [K, 2, M] x [K, 2, N] sums both rows
    (einsum "kli,klj->ij"); a 3-D nl.mgrid names its axes .p, .x, .y; .view to the tensor's
    own dtype is the tensor."""
    import torch

    @nki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
        g = nl.mgrid[0:a.shape[0], 0:2, 0:a.shape[2]]
        t = nl.ndarray((a.shape[0], 2, 16), dtype=nl.float8_e5m2, buffer=nl.sbuf)
        t[g.p, g.x, g.y] = nl.load(a.view(nl.float8_e5m2))
        c = nisa.nc_matmul(t[g.p, g.x, g.y], nl.load(b), perf_mode=nisa.matmul_perf_mode.double_row)
        nl.store(out, nl.copy(c))
        return out

    g = torch.Generator().manual_seed(3)
    a = (torch.randn(128, 2, 8, generator=g) * 2).to(torch.float8_e5m2)
    b = (torch.randn(128, 2, 64, generator=g) * 2).to(torch.float8_e5m2)
    want = torch.einsum("kli,klj->ij", a.double(), b.double())
    bound = 256 * 2.0**-24 * torch.einsum("kli,klj->ij", a.double().abs(), b.double().abs())
    assert ((k(a, b).double() - want).abs() <= bound).all()


def test_activate2_two_scalar_steps_then_activation_and_reduce():
    """nisa.activate2: op((data op0 imm0) op1 imm1) with nl.bypass / reverse, [P, 1] or
    scalar immediates; reduce_regs by add / max / abs_max (reset to the op's identity)."""
    @nki.jit
    def k(a, bias):
        x = nl.load(a)
        b = nl.load(bias)
        outs = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(3)]
        red = nl.ndarray((a.shape[0], 3), dtype=nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((a.shape[0], 3), dtype=nl.float32, buffer=nl.sbuf)
        res = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf) for _ in range(3)]
        nisa.activate2(dst=res[0], op=nl.gelu, data=x, imm0=2.0, imm1=b, op0=nl.multiply,
                       op1=nl.add, reduce_op=nl.add, reduce_res=r[:, 0:1],
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activate2(dst=res[1], op=nl.exp, data=x, imm0=1.0, imm1=0.0, op0=nl.subtract,
                       op1=nl.bypass, reverse0=True, reduce_op=nl.maximum, reduce_res=r[:, 1:2],
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activate2(dst=res[2], op=nl.copy, data=x, imm0=0.0, imm1=0.0, op0=nl.bypass,
                       op1=nl.bypass, reduce_op=nl.abs_max, reduce_res=r[:, 2:3],
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        for o, t in zip(outs, res):
            nl.store(o, t)
        nl.store(red, r)
        return (*outs, red)

    import math
    a, bias = rand(32, 48), rand(32, 1)
    gelu, ex, same, red = k(a, bias)
    z = 2 * a + bias
    want_gelu = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    np.testing.assert_allclose(gelu, want_gelu, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(ex, np.exp(1 - a), rtol=2e-6)
    np.testing.assert_array_equal(same, a)
    np.testing.assert_allclose(red[:, 0], want_gelu.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(red[:, 1], np.exp(1 - a).max(axis=1), rtol=2e-6)
    np.testing.assert_array_equal(red[:, 2], a[np.arange(32), np.abs(a).argmax(axis=1)])


def test_nc_n_gather_dma_compute_and_reductions_the_engines_have():
    """nisa.nc_n_gather (uint32 indices, per partition), nisa.dma_compute (a sum of sources,
    HBM or SBUF), and a reduction op the engines lack is an error, never a silent sum."""
    @nki.jit
    def k(d, i, a, b):
        g = nl.ndarray(i.shape, dtype=d.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=g, data=nl.load(d), indices=nl.load(i))
        out_g = nl.ndarray(i.shape, dtype=d.dtype, buffer=nl.shared_hbm)
        nl.store(out_g, g)
        out_s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out_s, srcs=[a, nl.load(b), a], reduce_op=nl.add)
        return out_g, out_s

    d = rand(16, 32)
    idx = ((np.arange(16 * 5).reshape(16, 5) * 3) % 32).astype(np.uint32)
    a, b = rand(16, 8), rand(16, 8)
    g, s = k(d, idx, a, b)
    np.testing.assert_array_equal(g, np.take_along_axis(d, idx.astype(np.int64), axis=1))
    np.testing.assert_allclose(s, 2 * a + b, rtol=1e-6)

    @nki.jit
    def bad(a):
        out = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.tensor_reduce(np.subtract, nl.load(a), axis=1, keepdims=True))
        return out

    with pytest.raises(nki.NkiError, match="subtract is not a reduction"):
        bad(a)
