# openneuron.nki.isa's Vector Engine instructions built on its accumulators and predicates,
# against numpy references written from NKI's documentation, in both generations:
# tensor_scalar_reduce, range_select, tensor_copy_predicated, nc_match_replace8, activation's
# reduce_cmd (the Scalar Engine's registers). The rest of nisa: test_nki_isa.py.
import numpy as np
import pytest
from nki_test_util import RNG, rand, run, run_dst  # noqa: F401

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

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
    assert "test_nki_isa_vector.py:" in str(e.value)
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
    assert "test_nki_isa_vector.py:" in str(e.value)
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
    assert "test_nki_isa_vector.py:" in str(e.value)
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
    assert "test_nki_isa_vector.py:" in str(e.value)
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
    assert "test_nki_isa_vector.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="no instruction of this kernel started"):
        run(lambda t: nisa.activation(nl.exp, t, reduce_cmd=nisa.reduce_cmd.reduce), a)
