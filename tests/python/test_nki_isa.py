# openneuron.nki.isa against numpy references, in both generations: Beta 1 (a call returns a new
# tile) and 0.x (destination first: `nisa.op(dst, ...)` / `dst=`), including the published 0.x
# tiled-matmul tutorial shape (PSUM accumulation across a K loop without an explicit zero).
import numpy as np
import pytest
from nki_test_util import RNG, rand, run, run_dst

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki


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
        -a.sum(axis=2, keepdims=True), rtol=1e-5, atol=1e-5)  # a sum near 0: its last bits
    b = rand(64, 20)
    np.testing.assert_allclose(run(lambda x: nisa.tensor_partition_reduce(np.add, x), b),
                               b.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        run_dst(lambda d, x: nisa.tensor_reduce(d, nl.add, x, axis=1, keepdims=True), (64, 1), b),
        b.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


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
        m3 = nl.ndarray((64, 8), dtype=nl.float32)
        nisa.memset(dst=m3, value=0.25)  # 0.x, both by name (dma_transpose's example)
        nl.store(o2, nl.add(nl.add(m, m2), m3))
        return o1, o2

    i, m = k(a)
    np.testing.assert_array_equal(i, np.arange(64)[:, None] * 4 + np.arange(8)[None, :])
    np.testing.assert_array_equal(m, np.full((64, 8), 9.75, np.float32))


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


def find_ref(x, vals):
    """The first position of each value in its partition's row."""
    return np.array([[np.nonzero(x[p] == v)[0][0] for v in vals[p]] for p in range(len(x))])


def test_nc_find_index8_both_generations():
    x = rand(128, 100)
    x[:, 5] = x[:, 70] = 9.0  # both places of a repeated value name its first occurrence
    want = find_ref(x, -np.sort(-x, axis=1)[:, :8])
    assert (want[:, :2] == 5).all()
    got = run(lambda t: nisa.nc_find_index8(data=t, vals=nisa.max8(src=t)), x)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, want)
    got16 = run(lambda t: nisa.nc_find_index8(data=t, vals=nisa.max8(src=t), dtype=nl.uint16), x)
    assert got16.dtype == np.uint16
    np.testing.assert_array_equal(got16, want)

    def body(d, t):
        m = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(m, t)
        return nisa.nc_find_index8(d, t, m)

    np.testing.assert_array_equal(run_dst(body, (128, 8), x, dtype=nl.uint32), want)
    np.testing.assert_array_equal(
        run_dst(lambda d, t: nisa.nc_find_index8(dst=d, data=t, vals=nisa.max8(src=t)), (128, 8),
                x, dtype=nl.uint16), want)
    y = rand(64, 4, 5)  # free axes flattened; vals [64, 2, 4]
    vals = np.sort(y.reshape(64, 20), axis=1)[:, 3:11].reshape(64, 2, 4).copy()
    want_y = find_ref(y.reshape(64, 20), vals.reshape(64, 8))
    np.testing.assert_array_equal(run(lambda t, v: nisa.nc_find_index8(data=t, vals=v), y, vals),
                                  want_y)


def test_nc_find_index8_value_not_found_per_generation():
    """0.x documents all ones for a value data lacks; Beta 1 leaves it undefined (here: the
    element count). The other values keep their positions."""
    x = np.random.default_rng(7).uniform(-2, 2, (128, 64)).astype(np.float32)  # RNG's stream
    # stays the later tests' (test_tensor_scalar_reduce's sums are tolerance-tight)
    vals = np.stack([x[:, 10], np.full(128, 7.0, np.float32)] * 4, axis=1).copy()  # 7: absent
    want = np.tile([10, 64], (128, 4))
    np.testing.assert_array_equal(run(lambda t, v: nisa.nc_find_index8(data=t, vals=v), x, vals),
                                  want)
    for dtype, ones in ((nl.uint32, 0xFFFFFFFF), (nl.uint16, 0xFFFF)):
        got = run_dst(lambda d, t, v: nisa.nc_find_index8(d, t, v), (128, 8), x, vals,
                      dtype=dtype)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, np.where(want == 64, ones, want))
    _, i_f = nl.mgrid[0:128, 0:64]  # masked out counts as absent
    got = run_dst(lambda d, t, v: nisa.nc_find_index8(d, t, v, mask=(i_f < 8)), (128, 8), x,
                  vals, dtype=nl.uint32)
    np.testing.assert_array_equal(got, np.full((128, 8), 0xFFFFFFFF))


def test_nc_find_index8_mask_and_limits():
    x = rand(128, 64)
    vals = np.stack([x[:, 10], x[:, 40]] * 4, axis=1).copy()
    _, i_f = nl.mgrid[0:128, 0:64]
    # lanes f < 32 only: column 40 is not found (the element count, 64)
    got = run(lambda t, v: nisa.nc_find_index8(data=t, vals=v, mask=(i_f < 32)), x, vals)
    np.testing.assert_array_equal(got, np.tile([10, 64], (128, 4)))
    with pytest.raises(nki.NkiError, match="uint16 or uint32, not int32") as e:
        run(lambda t, v: nisa.nc_find_index8(data=t, vals=v, dtype=nl.int32), x, vals)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="8 values per partition"):
        run(lambda t, v: nisa.nc_find_index8(data=t, vals=v), x, vals[:, :7].copy())
    with pytest.raises(nki.NkiError, match="data has 4 elements per partition"):
        run(lambda t, v: nisa.nc_find_index8(data=t, vals=v), rand(128, 4), vals)


def scan_ref(a, b, initial, op0, op1, reverse0=False, reverse1=False, dtype=np.float32):
    """NKI's documented numpy model; each result rounded to the output dtype."""
    out = np.empty(a.shape, dtype=dtype)
    prev = np.broadcast_to(np.asarray(initial, np.float32).reshape(-1), a.shape[:1])
    for i in range(a.shape[1]):
        t = op0(prev, a[:, i]) if reverse0 else op0(a[:, i], prev)
        out[:, i] = (op1(b[:, i], t) if reverse1 else op1(t, b[:, i])).astype(np.float32)
        prev = out[:, i].astype(np.float32)
    return out


def test_tensor_tensor_scan_the_published_example():
    a, b = rand(128, 1024, lo=0, hi=1), rand(128, 1024, lo=0, hi=1)

    @nki.jit
    def k(a_tensor, b_tensor):
        c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a_tensor), nl.load(b_tensor)
        c = nl.ndarray(shape=(128, 1024), dtype=nl.float32)
        c[:, 0:512] = nisa.tensor_tensor_scan(x[:, 0:512], y[:, 0:512], initial=0,
                                              op0=np.multiply, op1=np.add)
        c[:, 512:1024] = nisa.tensor_tensor_scan(x[:, 512:1024], y[:, 512:1024],
                                                 initial=c[:, 511], op0=np.multiply, op1=np.add)
        nl.store(c_tensor, c)
        return c_tensor

    np.testing.assert_array_equal(k(a, b), scan_ref(a, b, 0.0, np.multiply, np.add))


def test_tensor_tensor_scan_forms_ops_and_dtypes():
    a, b, init = rand(96, 40), rand(96, 40), rand(96, 1)
    want = scan_ref(a, b, init, np.subtract, np.maximum, reverse0=True)
    np.testing.assert_array_equal(
        run(lambda x, y, i: nisa.tensor_tensor_scan(x, y, i, nl.subtract, nl.maximum,
                                                    reverse0=True), a, b, init), want)
    np.testing.assert_array_equal(  # 0.x, positional, reverse1
        run_dst(lambda d, x, y: nisa.tensor_tensor_scan(d, x, y, 0.5, np.add, np.subtract, False,
                                                        True), (96, 40), a, b),
        scan_ref(a, b, 0.5, np.add, np.subtract, reverse1=True))
    h = run(lambda x, y: nisa.tensor_tensor_scan(x, y, 1.0, np.multiply, np.add,
                                                 dtype=nl.float16), a, b)
    assert h.dtype == np.float16  # the carry is the float16 result, as the numpy model reads it
    np.testing.assert_array_equal(h, scan_ref(a, b, 1.0, np.multiply, np.add, dtype=np.float16))
    a3, b3 = rand(32, 4, 6), rand(32, 4, 6)  # free axes flattened
    np.testing.assert_array_equal(
        run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, np.add, np.add), a3, b3),
        scan_ref(a3.reshape(32, 24), b3.reshape(32, 24), 0.0, np.add, np.add).reshape(32, 4, 6))


def test_tensor_tensor_scan_mask_and_limits():
    a, b = rand(128, 16), rand(128, 16)
    i_p, i_f = nl.mgrid[0:128, 0:16]

    @nki.jit
    def k(x, y):
        out = nl.full((128, 16), -5.0, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.full((128, 16), -5.0, dtype=nl.float32)
        t[...] = nisa.tensor_tensor_scan(nl.load(x), nl.load(y), 0.0, np.add, np.add,
                                         mask=(i_p < 64) & (i_f >= 4))
        nl.store(out, t)
        return out

    got = k(a, b)
    want = np.full((128, 16), np.nan, np.float32)  # the unwritten lanes of the result tile
    want[:64, 4:] = scan_ref(a[:64, 4:], b[:64, 4:], 0.0, np.add, np.add)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(nki.NkiError, match="same partitions and elements") as e:
        run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, np.add, np.add), a, rand(128, 8))
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="one value per partition"):
        run(lambda x, y: nisa.tensor_tensor_scan(x, y, y, np.add, np.add), a, b)
    with pytest.raises(nki.NkiError, match="unsupported binary operator"):
        run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, np.exp, np.add), a, b)


def test_select_reduce_both_generations_and_accumulators():
    pred = (RNG.uniform(size=(128, 64)) > 0.5).astype(np.uint8)
    x, x2, fill = rand(128, 64), rand(128, 64), rand(128, 1)
    sel = np.where(pred != 0, x, -3.0)
    np.testing.assert_array_equal(
        run(lambda p, t: nisa.select_reduce(p, t, -3.0), pred, x), sel)
    np.testing.assert_array_equal(  # reverse_pred, a [P, 1] on_false, 0.x
        run_dst(lambda d, p, t, f: nisa.select_reduce(d, p, t, f, reverse_pred=True), (128, 64),
                pred, x, fill), np.where(pred == 0, x, fill))

    @nki.jit
    def k(p_in, a_in, b_in):
        p, a, b = nl.load(p_in), nl.load(a_in), nl.load(b_in)
        d = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        r1 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        r2 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(d, p, a, -9.0, reduce_res=r1,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        nisa.select_reduce(d, p, b, -9.0, reduce_res=r2, reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], r1)
        nl.store(out[:, 1:2], r2)
        return out

    got = k(pred, x, x2)
    m1 = np.where(pred != 0, x, -9.0).max(axis=1)
    np.testing.assert_array_equal(got[:, 0], m1)
    np.testing.assert_array_equal(got[:, 1], np.maximum(m1, np.where(pred != 0, x2, -9.0).max(1)))


def test_select_reduce_limits():
    pred, x = np.ones((128, 8), np.uint8), rand(128, 8)

    def with_res(cmd, **kw):
        def body(p, t):
            r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.select_reduce(p, t, 0.0, reduce_res=r, reduce_cmd=cmd, **kw)
            return r
        return body

    with pytest.raises(nki.NkiError, match="reduce_cmd=idle") as e:
        run(with_res(nisa.reduce_cmd.idle), pred, x)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="no instruction of this kernel started"):
        run(with_res(nisa.reduce_cmd.reduce), pred, x)
    with pytest.raises(nki.NkiError, match="reduce_op must be nl.maximum"):
        run(with_res(nisa.reduce_cmd.reset_reduce, reduce_op=nl.add), pred, x)
    with pytest.raises(nki.NkiError, match="predicate dtype float32"):
        run(lambda p, t: nisa.select_reduce(p, t, 0.0), x, x)


def gather_ref(src, index, n_elem, n_valid):
    p = src.shape[0]
    flat = src.reshape(p, -1)
    out = np.empty((p, n_valid, n_elem), src.dtype)
    for c in range(p // 16):
        idx = index[16 * c:16 * c + 16].flatten(order="F")[:n_valid]
        for j, i in enumerate(idx):
            out[16 * c:16 * c + 16, j] = flat[16 * c:16 * c + 16, int(i):int(i) + n_elem]
    return out


def test_local_gather_the_published_example():
    src = RNG.random((128, 512, 4)).astype(np.float32)
    index = np.tile(RNG.integers(0, 512, size=(16, 4), dtype=np.uint16), (8, 1))

    @nki.jit
    def k(src_buffer, index, num_elem_per_idx, num_valid_indices, output_shape):
        output = nl.ndarray(output_shape, dtype=src_buffer.dtype, buffer=nl.shared_hbm)
        o = nisa.local_gather(nl.load(src_buffer), nl.load(index), num_elem_per_idx,
                              num_valid_indices)
        nl.store(output, o)
        return output

    got = k(src, index * 4, 4, 64, (128, 4, 16, 4))
    np.testing.assert_array_equal(got, gather_ref(src, index * 4, 4, 64).reshape(128, 4, 16, 4))


def test_local_gather_cores_valid_count_and_0x():
    src = rand(32, 40)
    index = RNG.integers(0, 39, size=(32, 3)).astype(np.uint16)  # two cores, own indices
    got = run(lambda s, i: nisa.local_gather(s, i, num_elem_per_idx=2, num_valid_indices=37),
              src, index)
    np.testing.assert_array_equal(got, gather_ref(src, index, 2, 37))
    np.testing.assert_array_equal(
        run_dst(lambda d, s, i: nisa.local_gather(d, s, i, 1), (32, 48), src, index),
        gather_ref(src, index, 1, 48).reshape(32, 48))


def test_local_gather_limits():
    src, index = rand(32, 40), np.zeros((32, 2), np.uint16)
    with pytest.raises(nki.NkiError, match="indices are uint16") as e:
        run(lambda s, i: nisa.local_gather(s, i), src, index.astype(np.int32))
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="num_elem_per_idx 3 must be one of"):
        run(lambda s, i: nisa.local_gather(s, i, 3), src, index)
    with pytest.raises(nki.NkiError, match="a multiple of 16"):
        run(lambda s, i: nisa.local_gather(s, i), rand(24, 40), index[:24].copy())
    with pytest.raises(nki.NkiError, match="num_valid_indices 33 must be 1 to 32"):
        run(lambda s, i: nisa.local_gather(s, i, 1, 33), src, index)
    bad = index.copy()
    bad[20, 1] = 39  # core 1, index 20: two elements from 39 leave the 40 of a partition
    with pytest.raises(RuntimeError, match=r"test_nki_isa.py:\d+: .*local_gather index 39"):
        run(lambda s, i: nisa.local_gather(s, i, 2), src, bad)
