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


# --- tensor_scalar_reduce, range_select, tensor_copy_predicated, nc_match_replace8 -------------

def test_tensor_scalar_reduce_both_generations():
    x, col = rand(128, 96), rand(128, 1)
    want = x * 1.5

    def body(t):
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        d = nisa.tensor_scalar_reduce(data=t, op0=np.multiply, operand0=1.5, reduce_op=nl.add,
                                      reduce_res=r)
        return _pack(d, r)

    got = run(body, x)
    np.testing.assert_allclose(got[:, :96], want, rtol=1e-6)
    # NOTE: a float32 sum's error scales with the terms' magnitude, not the sum's (a row summing
    # to -0.08 from terms of +-30 missed rtol=1e-5 by 1e-6 under another test order).
    np.testing.assert_allclose(got[:, 96], want.sum(axis=1), rtol=1e-5,
                               atol=2.0**-20 * np.abs(want).sum(axis=1).max())
    for rop, ref in ((nl.maximum, np.max), (np.minimum, np.min), (nl.multiply, np.prod)):
        y = rand(128, 12, lo=0.5, hi=1.5)

        def body2(t, c, rop=rop):  # 0.x, a [P, 1] operand, reverse0, reduce_res negated
            d = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.sbuf)
            r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar_reduce(d, t, np.subtract, c, rop, r, reverse0=True,
                                      reduce_res_negate=True)
            return _pack(d, r)

        got = run(body2, y, col)
        np.testing.assert_allclose(got[:, :12], col - y, rtol=1e-6)
        np.testing.assert_allclose(got[:, 12], -ref(col - y, axis=1), rtol=1e-5)


def _pack(d, r):
    """[P, F] and [P, 1] tiles side by side in one float32 tile."""
    p, f = d.shape[0], int(np.prod(d.shape[1:]))
    out = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.sbuf)
    out[:, 0:f] = nl.copy(d.reshape((p, f)) if d.ndim > 2 else d, dtype=nl.float32)
    out[:, f:f + 1] = nl.copy(r, dtype=nl.float32)
    return out


def test_tensor_scalar_reduce_accumulators_dtypes_and_3d():
    a, b, init = rand(128, 4, 8), rand(128, 4, 8), rand(128, 1)

    @nki.jit
    def k(a_in, b_in, i_in):
        a_t, b_t, i_t = nl.load(a_in), nl.load(b_in), nl.load(i_in)
        d = nl.ndarray((128, 4, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(d, a_t, nl.add, 1.0, nl.add)  # reset_reduce, kept
        nisa.tensor_scalar_reduce(d, b_t, nl.add, 1.0, nl.add, r[:, 0:1],
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.tensor_scalar_reduce(d, b_t, nl.abs, None, nl.maximum, r[:, 1:2],
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=i_t)
        nisa.tensor_scalar_reduce(dst=d, data=a_t, op0=nl.multiply, operand0=2.0,
                                  reduce_op=nl.add, reduce_res=r[:, 2:3])
        out = nl.ndarray((128, 35), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:3], r)
        nl.store(out[:, 3:35], nl.copy(d.reshape((128, 32)), dtype=nl.float32))
        return out

    got = k(a, b, init)
    bf = bf16
    s1 = bf(a + 1).reshape(128, -1).sum(1) + bf(b + 1).reshape(128, -1).sum(1)
    np.testing.assert_allclose(got[:, 0], s1, rtol=1e-5)
    m = np.maximum(init[:, 0], bf(np.abs(b)).reshape(128, -1).max(1))
    np.testing.assert_allclose(got[:, 1], m, rtol=1e-6)
    np.testing.assert_allclose(got[:, 2], bf(a * 2).reshape(128, -1).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(got[:, 3:], bf(a * 2).reshape(128, -1))


def bf16(v):
    """float32 -> bfloat16 (round to nearest even) -> float32."""
    u = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return u.view(np.float32)


def test_tensor_scalar_reduce_mask_and_limits():
    x = rand(128, 64)
    _, i_f = nl.mgrid[0:128, 0:64]

    def masked(t):
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=t, op0=nl.add, operand0=0.0, reduce_op=nl.add,
                                  reduce_res=r, mask=(i_f < 10))
        return r

    np.testing.assert_allclose(run(masked, x)[:, 0], x[:, :10].sum(1), rtol=1e-5, atol=1e-5)

    def call(**kw):
        def body(t):
            r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            args = {"data": t, "op0": nl.add, "operand0": 1.0, "reduce_op": nl.add,
                    "reduce_res": r}
            args.update(kw)
            nisa.tensor_scalar_reduce(**args)
            return r
        return run(body, x)

    with pytest.raises(nki.NkiError, match="reduce_op subtract is not supported") as e:
        call(reduce_op=nl.subtract)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="bitvec"):
        call(op0=nl.bitwise_and)
    with pytest.raises(nki.NkiError, match="reduce_res .* is required"):
        call(reduce_res=None)
    with pytest.raises(nki.NkiError, match="load_reduce needs reduce_init"):
        call(reduce_cmd=nisa.reduce_cmd.load_reduce)
    with pytest.raises(nki.NkiError, match="reduce_init is only read with"):
        call(reduce_init=1.0)
    with pytest.raises(nki.NkiError, match="no instruction of this kernel started"):
        call(reduce_cmd=nisa.reduce_cmd.reduce)
    with pytest.raises(nki.NkiError, match=r"operand0 \[128, 2\] must be a number or one value"):
        run(lambda t: nisa.tensor_scalar_reduce(
            data=t, op0=nl.add, operand0=t[:, 0:2], reduce_op=nl.add,
            reduce_res=nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)), x)
    with pytest.raises(nki.NkiError, match="unexpected argument 'reduce_cmdd'"):
        call(reduce_cmdd=1)


FP32_MIN = np.finfo(np.float32).min


def range_ref(x, b0, b1, c0, c1, start, fill=FP32_MIN):
    """The numpy equivalent NKI documents."""
    idx = np.zeros(x.shape, np.float32)
    idx[:] = start + np.arange(x[0].size).reshape(x.shape[1:])
    m = c0(idx, b0.reshape((-1,) + (1,) * (x.ndim - 1))) & \
        c1(idx, b1.reshape((-1,) + (1,) * (x.ndim - 1)))
    sel = np.where(m, x, np.float32(fill)).astype(np.float32)
    return sel, sel.reshape(x.shape[0], -1).max(axis=1, keepdims=True)


def test_range_select_the_published_examples():
    x = RNG.random((128, 512)).astype(np.float32)
    b0, b1 = np.zeros((128, 1), np.float32), np.full((128, 1), 64, np.float32)

    @nki.jit
    def example(on_true, bound0, bound1, compare_op0, compare_op1, range_start):
        select_res = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.hbm)
        reduce_result = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.hbm)
        on_true_tile = nl.load(on_true[...])
        bound0_tile = nl.load(bound0[...])
        bound1_tile = nl.load(bound1[...])
        reduce_res_tile = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
        result[...] = nisa.range_select(
            on_true_tile=on_true_tile, comp_op0=compare_op0, comp_op1=compare_op1,
            bound0=bound0_tile, bound1=bound1_tile, reduce_cmd=nisa.reduce_cmd.reset_reduce,
            reduce_res=reduce_res_tile, reduce_op=np.max, range_start=range_start,
            on_false_value=nl.fp32.min)
        nl.store(select_res[...], value=result[...])
        nl.store(reduce_result[...], value=reduce_res_tile[...])
        return select_res, reduce_result

    sel, red = example(x, b0, b1, np.greater_equal, np.less, 32)
    want, want_red = range_ref(x, b0, b1, np.greater_equal, np.less, 32)
    np.testing.assert_array_equal(sel, want)
    np.testing.assert_array_equal(red, want_red)

    @nki.jit
    def chaining(on_true, bound0, bound1, range_start):
        select_res = nl.ndarray(on_true.shape, dtype=np.float32, buffer=nl.hbm)
        reduce_result = nl.ndarray((on_true.shape[0], 1), dtype=np.float32, buffer=nl.hbm)
        on_true_tile = nl.load(on_true[...])
        bound0_tile, bound1_tile = nl.load(bound0[...]), nl.load(bound1[...])
        reduce_res_sbuf = nl.ndarray((on_true.shape[0], 1), dtype=np.float32, buffer=nl.sbuf)
        result_sbuf = nl.ndarray(on_true.shape, dtype=np.float32, buffer=nl.sbuf)
        args = {"comp_op0": np.greater_equal, "comp_op1": np.less, "bound0": bound0_tile,
                "bound1": bound1_tile, "reduce_op": np.max, "on_false_value": nl.fp32.min}
        result_sbuf[...] = nisa.range_select(on_true_tile=on_true_tile, range_start=range_start,
                                             reduce_cmd=nisa.reduce_cmd.reset_reduce, **args)
        ones = nl.full(on_true.shape, fill_value=1, dtype=np.float32, buffer=nl.sbuf)
        step = on_true_tile.shape[0]
        for i in range(1, 2):
            on_true_tile[...] = nl.add(on_true_tile, ones)
            result_sbuf[...] = nisa.range_select(on_true_tile=on_true_tile,
                                                 reduce_cmd=nisa.reduce_cmd.reduce,
                                                 range_start=range_start + i * step, **args)
        on_true_tile[...] = nl.add(on_true_tile, ones)
        result_sbuf[...] = nisa.range_select(on_true_tile=on_true_tile,
                                             reduce_cmd=nisa.reduce_cmd.reduce,
                                             reduce_res=reduce_res_sbuf[...],
                                             range_start=range_start + 2 * step, **args)
        nl.store(select_res[...], value=result_sbuf[...])
        nl.store(reduce_result[...], value=reduce_res_sbuf[...])
        return select_res, reduce_result

    b1 = np.full((128, 1), 350, np.float32)
    sel, red = chaining(x, b0, b1, 32)
    best, g = np.full((128, 1), -np.inf, np.float32), x.copy()
    for i in range(3):  # the kernel adds one each time (float32)
        want, m = range_ref(g, b0, b1, np.greater_equal, np.less, 32 + 128 * i)
        best, g = np.maximum(best, m), g + np.float32(1)
    np.testing.assert_array_equal(sel, want)
    np.testing.assert_array_equal(red, best)


def test_range_select_0x_dtypes_bounds_and_mask():
    x = rand(128, 4, 16)
    b0 = RNG.integers(0, 40, size=(128, 1)).astype(np.float32)
    b1 = b0 + RNG.integers(0, 30, size=(128, 1)).astype(np.float32)

    @nki.jit
    def k(t_in, lo_in, hi_in):
        t, lo, hi = nl.load(t_in), nl.load(lo_in), nl.load(hi_in)
        d = nl.ndarray((128, 4, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)  # 0.x: reset_reduce default
        nisa.range_select(d, t, nl.greater, nl.less_equal, lo, hi, reduce_res=r,
                          range_start=-3, on_false_value=nl.fp32.min)
        out = nl.ndarray((128, 65), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:64], nl.copy(d.reshape((128, 64)), dtype=nl.float32))
        nl.store(out[:, 64:65], r)
        return out

    got = k(x, b0, b1)
    want, red = range_ref(x, b0, b1, np.greater, np.less_equal, -3)
    np.testing.assert_array_equal(got[:, :64], bf16(want.reshape(128, 64)))  # fp32.min -> -inf
    assert np.isneginf(got[:, :64]).any()
    np.testing.assert_array_equal(got[:, 64:], red)
    _, i_f = nl.mgrid[0:128, 0:64]
    y = rand(128, 64)
    masked = run(lambda t, lo, hi: nisa.range_select(
        on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=lo, bound1=hi,
        mask=(i_f < 32)), y, b0, b1)
    np.testing.assert_array_equal(masked[:, :32], range_ref(y, b0, b1, np.greater_equal,
                                                            np.less, 0)[0][:, :32])
    assert np.isnan(masked[:, 32:]).all()  # lanes the mask leaves are never written


def test_range_select_limits():
    x, b = rand(128, 16), np.zeros((128, 1), np.float32)

    def call(**kw):
        args = {"comp_op0": nl.greater_equal, "comp_op1": nl.less}
        args.update(kw)
        return run(lambda t, lo: nisa.range_select(on_true_tile=t, bound0=lo, bound1=lo, **args),
                   x, b)

    with pytest.raises(nki.NkiError, match="on_false_value must be nl.fp32.min") as e:
        call(on_false_value=-1e30)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="comp_op0 add"):
        call(comp_op0=nl.add)
    with pytest.raises(nki.NkiError, match="reduce_op must be nl.maximum"):
        call(reduce_op=nl.add)
    with pytest.raises(nki.NkiError, match="float32-exact range"):
        call(range_start=1 << 24)
    with pytest.raises(nki.NkiError, match="range_start must be a compile-time integer"):
        call(range_start=1.5)
    with pytest.raises(nki.NkiError, match="bound0 dtype int32"):
        run(lambda t, lo: nisa.range_select(on_true_tile=t, comp_op0=nl.less, comp_op1=nl.less,
                                            bound0=lo, bound1=lo), x, b.astype(np.int32))
    with pytest.raises(nki.NkiError, match="on_true_tile dtype int32"):
        run(lambda t, lo: nisa.range_select(on_true_tile=t, comp_op0=nl.less, comp_op1=nl.less,
                                            bound0=lo, bound1=lo), x.astype(np.int32), b)


def test_tensor_copy_predicated_the_published_example_and_0x():
    a = RNG.random((128, 512)).astype(np.float32) * 100
    b = RNG.random((128, 512)).astype(np.float32) * 100

    @nki.jit
    def example(predicate, on_true_tensor, on_false_tensor):
        out_tensor = nl.ndarray([128, 512], dtype=on_true_tensor.dtype, buffer=nl.shared_hbm)
        pre_tile = nl.load(predicate)
        src_tile = nl.load(on_true_tensor)
        ix, iy = nl.mgrid[0:128, 0:512]
        dst_tile = nl.zeros(shape=src_tile.shape, dtype=src_tile.dtype)
        dst_tile[ix, iy] = nl.load(on_false_tensor)
        nisa.tensor_copy_predicated(src=src_tile, dst=dst_tile, predicate=pre_tile)
        nl.store(out_tensor, dst_tile)
        return out_tensor

    pred = np.less_equal(a, 30.0)
    np.testing.assert_array_equal(example(pred, a, b), np.where(pred, a, b))
    p16 = (RNG.random((128, 3, 8)) > 0.5).astype(np.uint16) * 7
    x, y = rand(128, 3, 8), rand(128, 3, 8)

    @nki.jit
    def k(p_in, x_in, y_in):  # 0.x, reverse_pred, a number as src, 3-D tiles, bfloat16
        p, s = nl.load(p_in), nl.load(x_in)
        d = nl.copy(nl.load(y_in), dtype=nl.bfloat16)
        nisa.tensor_copy_predicated(d, nl.copy(s, dtype=nl.bfloat16), p, reverse_pred=True)
        e = nl.load(y_in)
        nisa.tensor_copy_predicated(e, 2.5, p)
        out = nl.ndarray((2, 128, 3, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], nl.copy(d, dtype=nl.float32))
        nl.store(out[1], e)
        return out

    got = k(p16, x, y)
    np.testing.assert_array_equal(got[0], np.where(p16 == 0, bf16(x), bf16(y)))
    np.testing.assert_array_equal(got[1], np.where(p16 != 0, 2.5, y))


def test_tensor_copy_predicated_mask_and_limits():
    x, y = rand(128, 32), rand(128, 32)
    pred = np.ones((128, 32), np.uint8)
    i_p, _ = nl.mgrid[0:128, 0:32]

    def body(p, s, d):
        nisa.tensor_copy_predicated(src=s, dst=d, predicate=p, mask=(i_p < 64))
        return d

    got = run(body, pred, x, y)
    np.testing.assert_array_equal(got, np.concatenate([x[:64], y[64:]]))
    with pytest.raises(nki.NkiError, match="predicate dtype int8") as e:
        run(lambda p, s, d: nisa.tensor_copy_predicated(d, s, p), pred.astype(np.int8), x, y)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="src dtype int32 differs from dst's float32"):
        run(lambda p, s, d: nisa.tensor_copy_predicated(d, s, p), pred, x.astype(np.int32), y)
    with pytest.raises(nki.NkiError, match=r"predicate \[128, 16\] must have 128 partitions"):
        run(lambda p, s, d: nisa.tensor_copy_predicated(d, s, p), pred[:, :16].copy(), x, y)
    with pytest.raises(nki.NkiError, match="dst is required"):
        run(lambda p, s: nisa.tensor_copy_predicated(src=s, predicate=p), pred, x)


def match_replace_ref(data, vals, imm, reverse=False):
    """NKI's numpy model (Beta 1: vals in order; 0.x: from the last, as documented)."""
    d = data.reshape(data.shape[0], -1).astype(np.float32).copy()
    v = vals.reshape(vals.shape[0], -1).astype(np.float32)
    idx = np.zeros(v.shape, np.uint32)
    for i in range(d.shape[0]):
        for j in (range(7, -1, -1) if reverse else range(8)):
            hits = np.where(d[i] == v[i, j])[0]
            if hits.size:
                idx[i, j] = hits[0]
                d[i, hits[0]] = imm
    return d.reshape(data.shape), idx


def test_nc_match_replace8_the_published_examples():
    a = RNG.random((128, 512)).astype(np.float32)

    @nki.jit
    def example(in_tensor, imm):
        n, m = in_tensor.shape
        out_tensor = nl.ndarray([n, m], dtype=in_tensor.dtype, buffer=nl.hbm)
        idx_tensor = nl.ndarray([n, 8], dtype=nl.uint32, buffer=nl.hbm)
        dst_idx = nl.ndarray((n, 8), dtype=idx_tensor.dtype)
        ix, iy = nl.mgrid[0:n, 0:8]
        inp_tile = nl.load(in_tensor)
        max_vals = nisa.max8(src=inp_tile)
        out_tile = nisa.nc_match_replace8(dst_idx=dst_idx[ix, iy], data=inp_tile[:, :],
                                          vals=max_vals, imm=imm)
        nl.store(out_tensor, value=out_tile)
        nl.store(idx_tensor[ix, iy], value=dst_idx[ix, iy])
        return out_tensor, idx_tensor

    out, idx = example(a, float("-inf"))
    top = -np.sort(-a, axis=1)[:, :8]
    want, want_idx = match_replace_ref(a, top, -np.inf)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(idx, want_idx)
    assert (np.isneginf(out).sum(axis=1) == 8).all()
    b = RNG.random((128, 4, 4)).astype(np.float32)  # 3-D data, imm 0

    @nki.jit
    def in_place(data_tensor):
        n, bb, m = data_tensor.shape
        out_tensor = nl.ndarray([n, bb, m], dtype=data_tensor.dtype, buffer=nl.hbm)
        idx_tensor = nl.ndarray([n, 8], dtype=nl.uint32, buffer=nl.hbm)
        idx_tile = nisa.memset(shape=(n, 8), value=0, dtype=nl.uint32)
        iq, ir, iw = nl.mgrid[0:n, 0:bb, 0:m]
        ip, io = nl.mgrid[0:n, 0:8]
        inp_tile = nl.load(data_tensor[iq, ir, iw])
        max_vals = nisa.max8(src=inp_tile)
        inp_tile[iq, ir, iw] = nisa.nc_match_replace8(dst_idx=idx_tile[ip, io],
                                                      data=inp_tile[iq, ir, iw],
                                                      vals=max_vals[ip, io], imm=0.0)
        nl.store(out_tensor, value=inp_tile)
        nl.store(idx_tensor, value=idx_tile)
        return out_tensor, idx_tensor

    out, idx = in_place(b)
    want, want_idx = match_replace_ref(b, -np.sort(-b.reshape(128, 16), axis=1)[:, :8], 0.0)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(idx, want_idx)


def test_nc_match_replace8_0x_repeats_mask_and_limits():
    # the 0.x documentation's repeated-values example: vals taken from the last
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]] * 16, np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]] * 16, np.float32)

    @nki.jit
    def k(d_in, v_in):
        d, v = nl.load(d_in), nl.load(v_in)
        out = nl.ndarray((16, 11), dtype=nl.float32, buffer=nl.sbuf)
        idx = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(out, d, v, -1.0, dst_idx=idx)
        res = nl.ndarray((16, 19), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(res[:, 0:11], out)
        nl.store(res[:, 11:19], nl.copy(idx, dtype=nl.float32))
        return res

    got = k(data, vals)
    np.testing.assert_array_equal(got[:, 11:], np.tile([2, 10, 9, 8, 7, 6, 5, 4], (16, 1)))
    np.testing.assert_array_equal(got[:, :11], match_replace_ref(data, vals, -1.0, True)[0])
    assert (got[:, :11] == -1).sum() == 16 * 8
    beta1 = run(lambda d, v: nisa.nc_match_replace8(
        data=d, vals=v, imm=-1.0, dst_idx=nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)),
        data, vals)
    np.testing.assert_array_equal(beta1, got[:, :11])
    x = rand(128, 64)  # a mask on data: only lanes f < 32 match or change
    _, i_f = nl.mgrid[0:128, 0:64]
    top = -np.sort(-x[:, :32], axis=1)[:, :8]

    def masked(d, v):
        o = nisa.memset(shape=(128, 64), value=5.0, dtype=nl.float32)
        o[...] = nisa.nc_match_replace8(data=d, vals=v, imm=-7.0, mask=(i_f < 32),
                                        dtype=nl.float16)
        return o

    got = run(masked, x, top)
    want = match_replace_ref(x[:, :32], top, -7.0)[0].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got[:, :32], want)
    assert np.isnan(got[:, 32:]).all()  # the result's lanes outside the mask are never written
    with pytest.raises(nki.NkiError, match="16,384") as e:
        run(lambda d, v: nisa.nc_match_replace8(data=d, vals=v, imm=0.0),
            rand(2, 16385), rand(2, 8))
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match=r"vals \[128, 7\] must have 128 partitions of 8"):
        run(lambda d, v: nisa.nc_match_replace8(data=d, vals=v, imm=0.0), x, top[:, :7].copy())
    with pytest.raises(nki.NkiError, match="dst_idx dtype uint8 cannot hold positions up to 299"):
        run(lambda d, v: nisa.nc_match_replace8(
            data=d, vals=v, imm=0.0, dst_idx=nl.ndarray((128, 8), dtype=nl.uint8)),
            rand(128, 300), top)


def test_activation_reduce_cmd_scalar_engine_registers():
    a, b = rand(128, 40), rand(128, 2, 20)

    @nki.jit
    def k(a_in, b_in):
        ta, tb = nl.load(a_in), nl.load(b_in)
        r = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((128, 40), dtype=nl.float32, buffer=nl.sbuf)
        d3 = nl.ndarray((128, 2, 20), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(d, nl.exp, ta, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(d3, nl.exp, tb, scale=0.5, reduce_op=nl.add, reduce_res=r[:, 0:1],
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation(d, nl.exp, ta, reduce_res=r[:, 1:2], reduce_cmd=nisa.reduce_cmd.reset)
        nisa.activation(op=nl.square, data=ta, reduce_op=nl.maximum, reduce_res=r[:, 2:3],
                        reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    got = k(a, b)
    s = np.exp(a).sum(1) + np.exp(0.5 * b).reshape(128, -1).sum(1)
    np.testing.assert_allclose(got[:, 0], s, rtol=1e-5)
    np.testing.assert_array_equal(got[:, 1], 0.0)  # reset: zero, nothing reduced
    np.testing.assert_allclose(got[:, 2], np.maximum(0.0, (a * a).max(1)), rtol=1e-6)
    with pytest.raises(nki.NkiError, match="only\\s+nl.add accumulates onto") as e:
        run(lambda t: nisa.activation(nl.exp, t, reduce_op=nl.maximum,
                                      reduce_cmd=nisa.reduce_cmd.reset_reduce), a)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="no instruction of this kernel started"):
        run(lambda t: nisa.activation(nl.exp, t, reduce_cmd=nisa.reduce_cmd.reduce), a)


# --- dma_transpose, nc_stream_shuffle ------------------------------------------------------------

DMA_PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


@nki.jit
def dma_transpose_0x(x_in):
    """0.x: dst first, straight from HBM."""
    perm = DMA_PERMUTATIONS[len(x_in.shape)]
    shape = [x_in.shape[a] for a in perm]
    d = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(d, x_in, axes=perm)
    out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, d)
    return out


def test_dma_transpose_published_examples_and_shapes():
    a = rand(16, 100)

    @nki.jit
    def hbm_to_sbuf(x):
        b_sb = nisa.dma_transpose(x[:, :])
        out = nl.ndarray(b_sb.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, b_sb)
        return out

    @nki.jit
    def sbuf_to_sbuf(x):
        b_sb = nisa.dma_transpose(nl.load(x)[:, :])
        out = nl.ndarray(b_sb.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, b_sb)
        return out

    np.testing.assert_array_equal(hbm_to_sbuf(a), a.T)
    np.testing.assert_array_equal(sbuf_to_sbuf(a), a.T)
    for shape in ((4, 6, 32), (2, 3, 5, 64)):
        x = rand(*shape)
        perm = DMA_PERMUTATIONS[len(shape)]
        np.testing.assert_array_equal(
            run(lambda t, perm=perm: nisa.dma_transpose(t, axes=perm), x), x.transpose(perm))
        np.testing.assert_array_equal(dma_transpose_0x(x), x.transpose(perm))
    half = run(lambda t: nisa.dma_transpose(t, dtype=nl.float16), a)  # Beta 1 dtype converts
    np.testing.assert_array_equal(half, a.T.astype(np.float16))


def test_dma_transpose_limits():
    with pytest.raises(nki.NkiError, match=r"axes \(0, 1\) for a 2-D source") as e:
        run(lambda t: nisa.dma_transpose(t, axes=(0, 1)), rand(16, 8))
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="has 200 partitions; at most 128"):
        run(lambda t: nisa.dma_transpose(t), rand(16, 200))
    with pytest.raises(nki.NkiError, match="hwdge: source dtype float32"):
        run(lambda t: nisa.dma_transpose(t, dge_mode=nisa.dge_mode.hwdge), rand(16, 8))
    with pytest.raises(nki.NkiError, match="hwdge: a 2-D source needs 16 rows"):
        run(lambda t: nisa.dma_transpose(t, dge_mode=nisa.dge_mode.hwdge),
            rand(8, 8).astype(np.float16))
    np.testing.assert_array_equal(  # within the hardware DGE's limits
        run(lambda t: nisa.dma_transpose(t, dge_mode=nisa.dge_mode.hwdge),
            (x := rand(16, 8).astype(np.float16))), x.T)
    with pytest.raises(nki.NkiError, match="dge_mode swdge is for indirect"):
        run(lambda t: nisa.dma_transpose(t, dge_mode=nisa.dge_mode.swdge), rand(16, 8))
    with pytest.raises(nki.NkiError, match="dst dtype float16 differs"):
        run_dst(lambda d, t: nisa.dma_transpose(d, t), (8, 16), rand(16, 8), dtype=nl.float16)
    with pytest.raises(nki.NkiError, match="transposes 2-D to 4-D"):
        run(lambda t: nisa.dma_transpose(t), rand(16))


def shuffle_ref(src, dst, sm):
    out = dst.copy()
    for q in range(-(-dst.shape[0] // 32)):
        for i, m in enumerate(sm):
            if m != 255 and 32 * q + i < dst.shape[0]:
                out[32 * q + i] = src[32 * q + m]
    return out


def test_nc_stream_shuffle_the_published_examples():
    x = (RNG.random((32, 128)) * 100).astype(np.float32)
    sm = [(i - 1) % 32 for i in range(32)]

    @nki.jit
    def in_place(in_tensor):
        out_tensor = nl.ndarray(shape=(32, 128), dtype=np.float32, buffer=nl.shared_hbm)
        a = nl.load(in_tensor)
        a_mgrid = nl.mgrid[0:32, 0:128]
        nisa.nc_stream_shuffle(src=a[a_mgrid.p, a_mgrid.x], dst=a[a_mgrid.p, a_mgrid.x],
                               shuffle_mask=sm)
        nl.store(out_tensor, value=a)
        return out_tensor

    np.testing.assert_array_equal(in_place(x), x[sm])
    one = (RNG.random((1, 128)) * 100).astype(np.float32)

    @nki.jit
    def broadcast_partition(in_tensor):
        out_tensor = nl.ndarray(shape=(32, 128), dtype=np.float32, buffer=nl.shared_hbm)
        a = nl.load(in_tensor)
        b = nl.ndarray(shape=(32, 128), dtype=np.float32)
        dst_mgrid = nl.mgrid[0:32, 0:128]
        src_mgrid = nl.mgrid[0:1, 0:128]
        nisa.nc_stream_shuffle(src=a[0, src_mgrid.x], dst=b[dst_mgrid.p, dst_mgrid.x],
                               shuffle_mask=[0] * 32)
        nl.store(out_tensor, value=b)
        return out_tensor

    np.testing.assert_array_equal(broadcast_partition(one), np.repeat(one, 32, axis=0))
    y = (RNG.random((128, 128)) * 100).astype(np.float32)

    @nki.jit
    def broadcast_mask(in_tensor):
        out_tensor = nl.ndarray(shape=(128, 128), dtype=np.float32, buffer=nl.shared_hbm)
        a = nl.load(in_tensor)
        b = nl.ndarray(shape=(128, 128), dtype=np.float32)
        mgrid = nl.mgrid[0:128, 0:128]
        nisa.nc_stream_shuffle(src=a[mgrid.p, mgrid.x], dst=b[mgrid.p, mgrid.x], shuffle_mask=sm)
        nl.store(out_tensor, value=b)
        return out_tensor

    np.testing.assert_array_equal(broadcast_mask(y), shuffle_ref(y, y, sm))


def test_nc_stream_shuffle_0x_unchanged_partitions_mask_and_limits():
    x, y = rand(64, 3, 10), rand(64, 3, 10)
    sm = [31 - i if i % 3 else 255 for i in range(32)]
    sm[5:9] = [2, 2, 2, 2]

    def body(s, d):  # 0.x keywords; 255 leaves dst partitions as they were
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=sm)
        return d

    np.testing.assert_array_equal(run(body, x, y), shuffle_ref(x, y, sm))
    _, i_f = nl.mgrid[0:64, 0:30]

    def masked(s, d):
        d2 = d.reshape((64, 30))
        nisa.nc_stream_shuffle(s.reshape((64, 30)), dst=d2, shuffle_mask=sm, mask=(i_f < 12))
        return d2

    want = shuffle_ref(x, y, sm).reshape(64, 30)
    want[:, 12:] = y.reshape(64, 30)[:, 12:]
    np.testing.assert_array_equal(run(masked, x, y), want)
    z = rand(64, 8)
    with pytest.raises(nki.NkiError, match="pass src= and dst=") as e:
        run(lambda s, d: nisa.nc_stream_shuffle(s, d, list(range(32))), z, z)
    assert "test_nki_isa.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="list of 32 integers"):
        run(lambda s, d: nisa.nc_stream_shuffle(src=s, dst=d, shuffle_mask=[0] * 31), z, z)
    with pytest.raises(nki.NkiError, match="list of 32 integers"):
        run(lambda s, d: nisa.nc_stream_shuffle(src=s, dst=d, shuffle_mask=[40] * 32), z, z)
    with pytest.raises(nki.NkiError, match="must be the same"):
        run(lambda s, d: nisa.nc_stream_shuffle(src=s, dst=d, shuffle_mask=[0] * 32),
            z, z.astype(np.float16))
    with pytest.raises(nki.NkiError, match="reads partition 3 of src, which has 2"):
        run(lambda s, d: nisa.nc_stream_shuffle(src=s, dst=d, shuffle_mask=[3] * 32),
            rand(2, 8), z)
    with pytest.raises(nki.NkiError, match="dst starts at partition 16; with 32 active"):
        run(lambda s, d: (nisa.nc_stream_shuffle(src=s[0:16], dst=d[16:32],
                                                 shuffle_mask=list(range(32))), d)[1], z, z)
