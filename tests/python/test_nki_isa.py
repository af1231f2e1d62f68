# openneuron.nki.isa against numpy references, in both generations: Beta 1 (a call returns a new
# tile) and 0.x (destination first: `nisa.op(dst, ...)` / `dst=`), including the published 0.x
# tiled-matmul tutorial shape (PSUM accumulation across a K loop without an explicit zero).
import numpy as np
import pytest

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


def test_nc_matmul_both_generations():
    st, mv = rand(128, 64), rand(128, 300)
    ref = st.T.astype(np.float64) @ mv
    np.testing.assert_allclose(run(lambda a, b: nisa.nc_matmul(a, b), st, mv), ref, rtol=1e-4,
                               atol=1e-4)

    @nki.jit
    def k(a, b):
        ps = nl.ndarray((64, 300), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, nl.load(a), nl.load(b))
        out = nl.ndarray((64, 300), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=ps)
        return out

    np.testing.assert_allclose(k(st, mv), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("accumulate", [None, True, False])
def test_matmul_0x_tiled_k_loop(accumulate):
    """The 0.x tutorial: an uninitialized PSUM tile, one nc_matmul per K tile."""
    @nki.jit
    def k(lhsT, rhs):
        K, M = lhsT.shape
        N = rhs.shape[1]
        result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
        res_psum = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
        if accumulate:
            nisa.memset(res_psum, 0.0)
        for kk in nl.affine_range(K // 128):
            lt = nl.ndarray((128, M), dtype=lhsT.dtype, buffer=nl.sbuf)
            rt = nl.ndarray((128, N), dtype=rhs.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=lt, src=lhsT[kk * 128:(kk + 1) * 128, :])
            nisa.dma_copy(dst=rt, src=rhs[kk * 128:(kk + 1) * 128, :])
            nisa.nc_matmul(dst=res_psum, stationary=lt, moving=rt, accumulate=accumulate)
        res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res_sb, src=res_psum)
        nisa.dma_copy(dst=result, src=res_sb)
        return result

    a, b = rand(384, 128), rand(384, 512)
    full = a.T.astype(np.float64) @ b
    ref = full if accumulate is not False else a[256:].T.astype(np.float64) @ b[256:]
    np.testing.assert_allclose(k(a, b), ref, rtol=1e-4, atol=1e-3)


def test_nc_transpose_engines():
    a = rand(100, 70)
    np.testing.assert_array_equal(run(lambda x: nisa.nc_transpose(x), a), a.T)
    b = rand(16, 24)
    np.testing.assert_array_equal(run(lambda x: nisa.nc_transpose(x, engine=nisa.engine.vector),
                                      b), b.T)
    np.testing.assert_array_equal(run_dst(lambda d, x: nisa.nc_transpose(d, x), (70, 100), a),
                                  a.T)
    with pytest.raises(nki.NkiError, match="at most 32"):
        run(lambda x: nisa.nc_transpose(x, engine=nisa.engine.vector), a)


def test_activation_scale_bias_reduce():
    a, bias = rand(64, 48), rand(64, 1)

    @nki.jit
    def k(x, b):
        red = nl.ndarray((64, 1), dtype=nl.float32)
        t = nisa.activation(op=nl.exp, data=nl.load(x), bias=nl.load(b), scale=0.5,
                            reduce_op=nl.add, reduce_res=red)
        o1 = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(red.shape, dtype=red.dtype, buffer=nl.shared_hbm)
        nl.store(o1, t)
        nl.store(o2, red)
        return o1, o2

    act, red = k(a, bias)
    ref = np.exp(a * 0.5 + bias)
    np.testing.assert_allclose(act, ref, rtol=1e-5)
    np.testing.assert_allclose(red, ref.sum(1, keepdims=True), rtol=1e-5)
    # 0.x and activation_reduce, numpy ufuncs as ops
    r = run_dst(lambda d, x: nisa.activation(d, np.tanh, x, scale=2.0), (64, 48), a)
    np.testing.assert_allclose(r, np.tanh(2 * a), rtol=1e-5, atol=1e-6)

    @nki.jit
    def k2(x):
        red = nl.ndarray((64, 1), dtype=nl.float32)
        nisa.activation_reduce(op=nl.square, data=nl.load(x), reduce_op=nl.add, reduce_res=red)
        o = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, red)
        return o

    np.testing.assert_allclose(k2(a), (a * a).sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("op,ref", [(nl.add, np.add), (np.multiply, np.multiply),
                                    (nl.maximum, np.maximum), (nl.subtract, np.subtract),
                                    (nl.greater, np.greater)])
def test_tensor_tensor(op, ref):
    a, b = rand(32, 40), rand(32, 40)
    expect = ref(a, b).astype(np.float32)
    np.testing.assert_allclose(run(lambda x, y: nisa.tensor_tensor(x, y, op, dtype=nl.float32),
                                   a, b), expect, rtol=1e-6)
    np.testing.assert_allclose(run_dst(lambda d, x, y: nisa.tensor_tensor(d, x, y, op),
                                       (32, 40), a, b), expect, rtol=1e-6)


def test_tensor_scalar_and_scalar_tensor_tensor():
    a, v, c = rand(32, 16), rand(32, 1), rand(32, 16)
    r = run(lambda x, s: nisa.tensor_scalar(x, nl.multiply, s, op1=nl.subtract, operand1=3.0,
                                            reverse1=True), a, v)
    np.testing.assert_allclose(r, 3.0 - a * v, rtol=1e-6)
    r = run_dst(lambda d, x, s: nisa.tensor_scalar(d, x, np.add, s), (32, 16), a, v)
    np.testing.assert_allclose(r, a + v, rtol=1e-6)
    r = run(lambda x, y: nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=2.0,
                                                   op1=nl.add, operand1=y), a, c)
    np.testing.assert_allclose(r, 2 * a + c, rtol=1e-6)


def test_tensor_reduce_and_partition_reduce():
    a = rand(16, 8, 12)
    np.testing.assert_allclose(run(lambda x: nisa.tensor_reduce(nl.max, x, axis=(1, 2)), a),
                               a.max(axis=(1, 2)))
    np.testing.assert_allclose(
        run(lambda x: nisa.tensor_reduce(np.add, x, axis=2, negate=True, keepdims=True), a),
        -a.sum(axis=2, keepdims=True), rtol=1e-5)
    b = rand(64, 20)
    np.testing.assert_allclose(run(lambda x: nisa.tensor_partition_reduce(np.add, x), b),
                               b.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        run_dst(lambda d, x: nisa.tensor_reduce(d, nl.add, x, axis=1, keepdims=True), (64, 1), b),
        b.sum(1, keepdims=True), rtol=1e-5)


def test_tensor_copy_iota_memset_reciprocal():
    a = rand(32, 16, lo=0.5)
    np.testing.assert_array_equal(run(lambda x: nisa.tensor_copy(x, dtype=nl.float16), a),
                                  a.astype(np.float16))
    np.testing.assert_array_equal(run_dst(lambda d, x: nisa.tensor_copy(d, x), (32, 16), a), a)
    np.testing.assert_allclose(run(lambda x: nisa.reciprocal(x), a), 1 / a, rtol=1e-6)

    @nki.jit
    def k(x):
        i = nisa.iota(nl.arange(64)[:, None] * 4 + nl.arange(8)[None, :], dtype=nl.int32)
        m = nisa.memset((64, 8), 7.5, nl.float32)
        o1 = nl.ndarray((64, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, i)
        m2 = nl.ndarray((64, 8), dtype=nl.float32)
        nisa.memset(m2, 2.0)
        nl.store(o2, nl.add(m, m2))
        return o1, o2

    i, m = k(a)
    np.testing.assert_array_equal(i, np.arange(64)[:, None] * 4 + np.arange(8)[None, :])
    np.testing.assert_array_equal(m, np.full((64, 8), 9.5, np.float32))


def test_affine_select_causal():
    a = rand(64, 64)

    def body(x):
        i_q, i_k = nl.mgrid[0:64, 0:64]
        return nisa.affine_select(i_q >= i_k, x, -9984.0)

    np.testing.assert_array_equal(run(body, a), np.where(np.tril(np.ones((64, 64))) > 0, a,
                                                         np.float32(-9984.0)))


def test_bn_stats_bn_aggr():
    a = rand(64, 1024)

    @nki.jit
    def k(x):
        stats = nl.ndarray((64, 12), dtype=nl.float32)
        for c in nl.affine_range(2):
            stats[:, c * 6:(c + 1) * 6] = nisa.bn_stats(nl.load(x[:, c * 512:(c + 1) * 512]))
        mv = nisa.bn_aggr(stats)
        out = nl.ndarray((64, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, mv)
        return out

    r = k(a)
    np.testing.assert_allclose(r[:, 0], a.mean(1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(r[:, 1], a.var(1), rtol=1e-4)
    with pytest.raises(nki.NkiError, match="bn_stats_fmax"):
        run(lambda x: nisa.bn_stats(x), rand(8, 600))


def test_dma_copy_hbm_to_hbm_and_dropout():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    a = rand(300, 40)
    np.testing.assert_array_equal(k(a), a)
    ones = np.ones((128, 256), np.float32)
    d = run(lambda x: nisa.dropout(x, 0.5), ones)
    assert abs((d == 0).mean() - 0.5) < 0.02
    d2 = run_dst(lambda dst, x: nisa.dropout(dst, x, 0.0), (128, 256), ones)
    np.testing.assert_array_equal(d2, ones)


def test_nc_matmul_limits_name_the_line():
    @nki.jit
    def k(x, y):
        nisa.nc_matmul(nl.load(x), nl.load(y))  # LINE

    with pytest.raises(nki.NkiError, match="gemm_moving_fmax") as e:
        k(rand(64, 64), rand(64, 600))
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="SBUF tile"):
        run(lambda x, y: nisa.nc_matmul(nisa.nc_transpose(x), y), rand(64, 64), rand(64, 64))


def test_max8_both_generations_with_repeats():
    x = rand(128, 100)
    x[:, 5] = x[:, 70] = 9.0  # a value present twice fills two places
    want = -np.sort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(run(lambda t: nisa.max8(src=t), x), want)
    np.testing.assert_array_equal(run_dst(lambda d, t: nisa.max8(d, t), (128, 8), x), want)
    y = rand(64, 4, 5)  # free axes flattened: 20 per partition
    np.testing.assert_array_equal(run(lambda t: nisa.max8(src=t), y),
                                  -np.sort(-y.reshape(64, 20), axis=1)[:, :8])
    h = run(lambda t: nisa.max8(src=t, dtype=nl.float16), x)  # compared in fp32, then cast
    np.testing.assert_array_equal(h, want.astype(np.float16))
    with pytest.raises(nki.NkiError, match="max8: src has 4 elements per partition"):
        run(lambda t: nisa.max8(src=t), rand(128, 4))
