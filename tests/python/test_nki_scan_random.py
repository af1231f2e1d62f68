# openneuron.nki's running reductions and random numbers against numpy references written from
# NKI's documentation: nisa.tensor_scalar_cumulative (reduce_cmd on the Vector Engine's shared
# accumulators), nisa.sequence_bounds, nisa.nonzero_with_count, nisa.exponential; on numpy
# arrays and neuron tensors, in the generations each exists in.
import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(3)


def rand(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def cumulative_ref(x, op0, op1, imm0, reg, reverse0=False):
    """NKI's pseudocode, in float32: reg = op1(op0(x[i], imm0), reg); out[i] = reg."""
    x = x.reshape(x.shape[0], -1).astype(np.float32)
    reg = np.broadcast_to(np.float32(reg), (x.shape[0], 1)).astype(np.float32).copy()
    imm0 = np.broadcast_to(np.float32(imm0), (x.shape[0], 1)).astype(np.float32)
    out = np.empty_like(x)
    for i in range(x.shape[1]):
        v = op0(imm0, x[:, i:i + 1]) if reverse0 else op0(x[:, i:i + 1], imm0)
        reg = op1(v, reg).astype(np.float32)
        out[:, i:i + 1] = reg
    return out


def cumulative_kernel(shape, op0, op1, imm0, imm1=None, cmd=nisa.reduce_cmd.reset_reduce,
                      dtype=nl.float32, chain=False, reverse0=False, vector=False):
    @nki.jit
    def k(src, *vecs):
        x = nl.load(src)
        a0 = nl.load(vecs[0]) if vector else imm0
        a1 = (nl.load(vecs[1]) if vector else imm1) if imm1 is not None else None
        d = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
        assert nisa.tensor_scalar_cumulative(d, x, op0, op1, a0, a1, reduce_cmd=cmd,
                                             reverse0=reverse0) is None
        if chain:
            nisa.tensor_scalar_cumulative(dst=d, src=x, op0=op0, op1=op1, imm0=a0,
                                          reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out
    return k


OPS = [(np.add, nl.add), (np.subtract, nl.subtract), (np.multiply, nl.multiply),
       (np.maximum, nl.maximum), (np.minimum, nl.minimum)]


@pytest.mark.parametrize("ref1,op1", OPS)
def test_tensor_scalar_cumulative_ops(ref1, op1):
    lo, hi = (0.9, 1.1) if ref1 is np.multiply else (-2.0, 2.0)
    x = rand(128, 40, lo=lo, hi=hi)
    got = cumulative_kernel((128, 40), nl.multiply, op1, 1.25)(x)
    reset = {np.add: 0.0, np.subtract: 0.0, np.multiply: 1.0, np.maximum: -np.inf,
             np.minimum: np.inf}[ref1]
    np.testing.assert_allclose(got, cumulative_ref(x, np.multiply, ref1, 1.25, reset),
                               rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_vectors_load_reduce_and_reverse():
    x, col, init = rand(64, 3, 8), rand(64, 1), rand(64, 1)
    k = cumulative_kernel((64, 3, 8), nl.subtract, nl.add, None, imm1=0.0,
                          cmd=nisa.reduce_cmd.load_reduce, reverse0=True, vector=True)
    got = k(x, col, init)
    want = cumulative_ref(x, np.subtract, np.add, col, init, reverse0=True).reshape(64, 3, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # scalars: load_reduce from imm1, then a second call continuing the accumulator
    y = rand(128, 16)
    got = cumulative_kernel((128, 16), nl.add, nl.add, 0.5, imm1=2.0,
                            cmd=nisa.reduce_cmd.load_reduce, chain=True)(y)
    first = cumulative_ref(y, np.add, np.add, 0.5, 2.0)
    want = cumulative_ref(y, np.add, np.add, 0.5, first[:, -1:])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_dtypes_and_neuron_tensors():
    x = rand(128, 32)
    k = cumulative_kernel((128, 32), nl.add, nl.add, 0.0, dtype=nl.bfloat16)
    got = k(x)
    want = torch.from_numpy(cumulative_ref(x, np.add, np.add, 0.0, 0.0)).to(torch.bfloat16)
    # the accumulator is float32; only the stored values round
    torch.testing.assert_close(torch.from_numpy(np.asarray(got, np.float32)).to(torch.bfloat16),
                               want, rtol=0, atol=0)
    k = cumulative_kernel((128, 32), nl.multiply, nl.maximum, 2.0)
    got = k(torch.from_numpy(x).to("neuron"))
    assert got.device.type == "neuron"
    np.testing.assert_allclose(got.cpu().numpy(), np.maximum.accumulate(x * 2, axis=1),
                               rtol=1e-6)


def test_tensor_scalar_cumulative_beta1_returns_the_result():
    x = rand(32, 16)

    @nki.jit
    def k(src):
        r = nisa.tensor_scalar_cumulative(nl.load(src), nl.add, nl.add, 1.0)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    np.testing.assert_allclose(k(x), np.cumsum(x + 1, axis=1), rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_errors():
    x = rand(128, 8)
    with pytest.raises(nki.NkiError, match="op1 divide") as e:
        cumulative_kernel((128, 8), nl.add, nl.divide, 0.0)(x)
    assert "test_nki_scan_random.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="dst dtype int32 is not supported"):
        cumulative_kernel((128, 8), nl.add, nl.add, 0.0, dtype=nl.int32)(x)
    with pytest.raises(nki.NkiError, match="needs|pass it"):
        cumulative_kernel((128, 8), nl.add, nl.add, 0.0, cmd=nisa.reduce_cmd.load_reduce)(x)
    with pytest.raises(nki.NkiError, match="no instruction of this kernel started"):
        cumulative_kernel((128, 8), nl.add, nl.add, 0.0, cmd=nisa.reduce_cmd.reduce)(x)
    with pytest.raises(nki.NkiError, match=r"imm0 \[128, 2\] must be a number or one value"):
        cumulative_kernel((128, 8), nl.add, nl.add, None, vector=True)(x, rand(128, 2))


# --- sequence_bounds -----------------------------------------------------------------------------

def bounds_ref(seq):
    """The documentation's numpy reference (runs of equal ids; 0 is padding)."""
    n = len(seq)
    lo, hi = np.zeros(n), np.zeros(n)
    lo[0] = 0 if seq[0] != 0 else n
    for i in range(1, n):
        lo[i] = n if seq[i] == 0 else (lo[i - 1] if seq[i] == seq[i - 1] else i)
    hi[-1] = n if seq[-1] != 0 else -1
    for i in range(n - 2, -1, -1):
        hi[i] = -1 if seq[i] == 0 else (hi[i + 1] if seq[i] == seq[i + 1] else i + 1)
    return np.stack([lo, hi])[None]


@nki.jit
def _bounds_beta1(ids):
    r = nisa.sequence_bounds(segment_ids=nl.load(ids))
    out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_sequence_bounds(dtype):
    seqs = [np.array([0, 1, 1, 2, 2, 2, 0, 3, 3]), np.array([5]), np.array([0]),
            np.array([4, 4, 0, 0, 4, 7, 7, 7, 1, 0]),
            np.sort(np.random.default_rng(0).integers(0, 40, 300))]

    beta1 = _bounds_beta1

    @nki.jit
    def dst_first(ids):
        d = nl.ndarray((1, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.sbuf)
        nisa.sequence_bounds(d, nl.load(ids))
        out = nl.ndarray(d.shape, dtype=d.dtype, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    for s in seqs:
        ids = s.astype(dtype)[None]
        for k in (beta1, dst_first):
            got = k(ids)
            assert got.dtype == dtype and got.shape == (1, 2, len(s))
            np.testing.assert_array_equal(got, bounds_ref(s))
    got = beta1(torch.from_numpy(seqs[0].astype(dtype)[None]).to("neuron"))
    np.testing.assert_array_equal(got.cpu().numpy(), bounds_ref(seqs[0]))


def test_sequence_bounds_errors():
    k = _bounds_beta1

    with pytest.raises(nki.NkiError, match="partition dimension 1") as e:
        k(np.ones((2, 8), np.float32))
    assert "test_nki_scan_random.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="must be float32 or int32"):
        k(np.ones((1, 8), np.int16))


# --- nonzero_with_count --------------------------------------------------------------------------

def nonzero_ref(x, old, offset, pad):
    """The documentation's reference: in partitions 0, 16, ..., the nonzero positions (+ offset),
    padding, then the count; the other partitions keep `old`."""
    out = old.copy()
    for p in range(0, x.shape[0], 16):
        nz = np.nonzero(x[p])[0]
        out[p, :] = pad
        out[p, :len(nz)] = nz + offset
        out[p, -1] = len(nz)
    return out


@nki.jit
def _nonzero(x, offset=0, pad=-1, fill=9):
    P, T = x.shape
    d = nl.ndarray((P, T + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(d, value=fill)
    nisa.nonzero_with_count(dst=d, src=nl.load(x), index_offset=offset, padding_val=pad)
    out = nl.ndarray(d.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(out, d)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (16, 5), (128, 64), (40, 33)])
def test_nonzero_with_count(dtype, shape):
    x = RNG.integers(-2, 3, shape).astype(dtype) * (RNG.random(shape) < 0.4)
    if dtype == np.float32:
        x.flat[::7] = np.nan  # nonzero
        x.flat[1::11] = -0.0  # zero
    old = np.full((shape[0], shape[1] + 1), 9, np.int32)
    for offset, pad in ((0, -1), (1000, 0), (-3, 123456)):
        got = _nonzero(x, offset, pad)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, nonzero_ref(x, old, offset, pad))
    got = _nonzero(torch.from_numpy(x).to("neuron"), 5, -2)
    np.testing.assert_array_equal(got.cpu().numpy(), nonzero_ref(x, old, 5, -2))


def test_nonzero_with_count_positional_and_returned():
    x = (RNG.random((32, 10)) < 0.5).astype(np.float32)

    @nki.jit
    def k(a):
        t = nl.load(a)
        d = nl.ndarray((32, 11), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(d, value=0)
        nisa.nonzero_with_count(d, t, 2, -5)  # 0.x: dst, src, index_offset, padding_val
        r = nisa.nonzero_with_count(src=t)  # a new [32, 11] int32 tile
        out = nl.ndarray((2, 32, 11), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out[0], d)
        nl.store(out[1, 0:1, :], r[0:1, :])
        nl.store(out[1, 1:32, :], d[1:32, :])
        return out

    got = k(x)
    zeros = np.zeros((32, 11), np.int32)
    np.testing.assert_array_equal(got[0], nonzero_ref(x, zeros, 2, -5))
    np.testing.assert_array_equal(got[1, 0], nonzero_ref(x, zeros, 0, -1)[0])


def test_nonzero_with_count_errors():
    def kernel(src_dtype=nl.float32, dst_dtype=nl.int32, dst_cols=9, **kw):
        @nki.jit
        def k(a):
            t = nl.ndarray((16, 8), dtype=src_dtype, buffer=nl.sbuf)
            nisa.memset(t, value=1)
            d = nl.ndarray((16, dst_cols), dtype=dst_dtype, buffer=nl.sbuf)
            nisa.nonzero_with_count(dst=d, src=t, **kw)
            out = nl.ndarray((16, dst_cols), dtype=dst_dtype, buffer=nl.shared_hbm)
            nl.store(out, d)
            return out
        return k

    a = np.zeros((1, 1), np.float32)
    with pytest.raises(nki.NkiError, match=r"src dtype bfloat16; it must be float32 or int32") \
            as e:
        kernel(src_dtype=nl.bfloat16)(a)
    assert "test_nki_scan_random.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="dst dtype float32; it must be int32"):
        kernel(dst_dtype=nl.float32)(a)
    with pytest.raises(nki.NkiError, match=r"dst \[16, 8\] must be \[16, 9\]"):
        kernel(dst_cols=8)(a)
    with pytest.raises(nki.NkiError, match="padding_val must be an integer"):
        kernel(padding_val=0.5)(a)
    with pytest.raises(nki.NkiError, match="index_offset .* does not fit the int32 result"):
        kernel(index_offset=2**31 - 4)(a)


# --- exponential ---------------------------------------------------------------------------------

def test_exponential_with_the_shared_accumulator():
    x, mx, init = rand(128, 2, 24), rand(128, 1), rand(128, 1)

    @nki.jit
    def k(src, m, i0):
        t, mt, it = nl.load(src), nl.load(m), nl.load(i0)
        d = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(d, t, max_value=mt, reduce_res=r[:, 0:1],
                         reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=d, src=t, max_value=1.0, reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.exponential(d, t, 0.5, r[:, 1:2], nisa.reduce_cmd.load_reduce, it)
        c = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)  # continues it
        nisa.tensor_scalar_cumulative(c, t[:, 0, 0:16], nl.multiply, nl.add, 0.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        r[:, 2:3] = nl.copy(c[:, 15:16])
        out = nl.ndarray((128, 51), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:48], d.reshape((128, 48)))
        nl.store(out[:, 48:51], r)
        return out

    got = k(x, mx, init)
    e0 = np.exp(x.reshape(128, 48) - mx)
    e2 = np.exp(x.reshape(128, 48) - 0.5)
    np.testing.assert_allclose(got[:, :48], e2, rtol=1e-5)
    np.testing.assert_allclose(got[:, 48], e0.sum(1), rtol=1e-5)
    np.testing.assert_allclose(got[:, 49], init[:, 0] + e2.sum(1), rtol=1e-5)
    np.testing.assert_allclose(got[:, 50], init[:, 0] + e2.sum(1), rtol=1e-5)


def test_exponential_dtypes_beta1_and_errors():
    x = rand(64, 32)

    @nki.jit
    def k(src):
        r = nisa.exponential(src=nl.load(src), max_value=2.0, dtype=nl.bfloat16)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    got = k(torch.from_numpy(x).to("neuron"))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), torch.exp(torch.from_numpy(x) - 2).to(torch.bfloat16))

    @nki.jit
    def bad(src):
        t = nl.load(src)
        d = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(d, t, reduce_init=1.0, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return src

    with pytest.raises(nki.NkiError, match="reduce_init is only read") as e:
        bad(x)
    assert "test_nki_scan_random.py:" in str(e.value)


# --- random numbers: drawn when the kernel runs ------------------------------------------------

def out_of(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@nki.jit
def two_rand_tiles(x):
    a = nl.rand((128, 512))
    b = nl.rand((128, 512), dtype=nl.float32)
    out = nl.ndarray((2, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out[0], a)
    nl.store(out[1], b)
    return out


def test_rand_is_uniform_new_each_launch_and_follows_manual_seed():
    x = np.zeros((1, 1), np.float32)
    torch.manual_seed(5)
    a = two_rand_tiles(x)
    assert a.shape == (2, 128, 512) and a.min() >= 0 and a.max() < 1
    assert abs(a.mean() - 0.5) < 0.01 and abs(a.std() - 12 ** -0.5) < 0.01
    assert not np.array_equal(a[0], a[1])  # each call draws anew
    assert not np.array_equal(a[0, 0], a[0, 1])  # so does each partition
    b = two_rand_tiles(x)
    assert not np.array_equal(a, b)  # each launch draws anew
    torch.manual_seed(5)
    np.testing.assert_array_equal(two_rand_tiles(x), a)  # the CPU generator's state decides
    xt = torch.zeros((1, 1), device="neuron")
    torch.manual_seed(6)
    c = two_rand_tiles(xt).cpu()
    assert not torch.equal(c, two_rand_tiles(xt).cpu())
    torch.manual_seed(6)
    assert torch.equal(two_rand_tiles(xt).cpu(), c)  # the neuron generator's


def test_rand_grid_instances_differ_and_dtypes():
    @nki.jit
    def k(x):
        out = nl.ndarray((4, 64, 32), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        r = nl.rand((64, 32), dtype=nl.bfloat16)
        nl.store(out[nl.program_id(0)], r)
        return out

    got = k[4](np.zeros((1, 1), np.float32))
    g = np.asarray(got, np.float32)
    assert g.min() >= 0 and g.max() <= 1
    assert len({g[i].tobytes() for i in range(4)}) == 4


def test_random_seed_repeats_the_sequence():
    @nki.jit
    def k(x):
        seed = nl.full((1, 1), 42, dtype=nl.int32, buffer=nl.sbuf)
        nl.random_seed(seed)
        a = nl.rand((128, 64))
        b = nl.rand((128, 64))
        nl.random_seed(seed)
        c = nl.rand((128, 64))
        out = nl.ndarray((3, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        for i, t in enumerate((a, b, c)):
            nl.store(out[i], t)
        return out

    x = np.zeros((1, 1), np.float32)
    got = k(x)
    np.testing.assert_array_equal(got[0], got[2])
    assert not np.array_equal(got[0], got[1])
    np.testing.assert_array_equal(k(x), got)  # seeded: the same on every launch


def test_rng_bits_rand2_and_state_round_trip():
    @nki.jit
    def k(x):
        u16 = nl.ndarray((128, 256), dtype=nl.uint16, buffer=nl.sbuf)
        nisa.rng(u16)
        i8 = nl.ndarray((128, 256), dtype=nl.int8, buffer=nl.sbuf)
        nisa.rng(dst=i8, engine=nisa.engine.vector)
        st = nl.ndarray((128, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(st)
        r0 = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand2(r0, -3.0, 5.0)
        nisa.rand_set_state(st)
        r1 = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand2(r1, nl.full((128, 1), -3.0, dtype=nl.float32),
                   nl.full((128, 1), 5.0, dtype=nl.float32))
        out = nl.ndarray((128, 640), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:256], nl.copy(u16, dtype=nl.float32))
        nl.store(out[:, 256:512], nl.copy(i8, dtype=nl.float32))
        nl.store(out[:, 512:576], r0)
        nl.store(out[:, 576:640], r1)
        return out

    got = k(np.zeros((1, 1), np.float32))
    u16, i8, r0, r1 = got[:, :256], got[:, 256:512], got[:, 512:576], got[:, 576:]
    assert np.all(u16 == np.floor(u16)) and u16.min() >= 0 and u16.max() <= 65535
    assert u16.max() > 60000 and u16.min() < 5000
    assert i8.min() >= -128 and i8.max() <= 127 and i8.min() < -100 and i8.max() > 100
    assert r0.min() >= -3 and r0.max() < 5 and r0.min() < -2.5 and r0.max() > 4.5
    np.testing.assert_array_equal(r0, r1)  # the state restored, the same draw


def test_random_errors():
    def kernel(body):
        @nki.jit
        def k(x):
            body()
            return x
        return k

    def rng32():
        nisa.rng(nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf))

    with pytest.raises(nki.NkiError, match="32 random bits") as e:
        kernel(rng32)(np.zeros((1, 1), np.float32))
    assert "test_nki_scan_random.py:" in str(e.value)

    def rand2_bad():
        nisa.rand2(nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf), 1.0, 1.0)

    with pytest.raises(nki.NkiError, match="min 1.0 must be less than max 1.0"):
        kernel(rand2_bad)(np.zeros((1, 1), np.float32))

    def seed_bad():
        nisa.set_rng_seed(nl.full((1, 2), 3, dtype=nl.int32, buffer=nl.sbuf))

    with pytest.raises(nki.NkiError, match=r"\[1, 1\] tile"):
        kernel(seed_bad)(np.zeros((1, 1), np.float32))

    def state_bad():
        nisa.rand_set_state(nl.full((128, 5), 3, dtype=nl.uint32, buffer=nl.sbuf))

    with pytest.raises(nki.NkiError, match=r"\[P, 6\] \(GpSimd\) or \[P, 24\]"):
        kernel(state_bad)(np.zeros((1, 1), np.float32))


def test_dropout_draws_a_mask_per_call_and_instance_and_follows_the_seed():
    @nki.jit
    def k(x, seeded=False):
        if seeded:
            nisa.set_rng_seed(nl.full((1, 1), 7, dtype=nl.int32, buffer=nl.sbuf))
        t = nl.load(x)
        out = nl.ndarray((2, 2) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i, 0], nl.dropout(t, 0.25))
        d = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dropout(d, t, nl.full((128, 1), 0.25, dtype=nl.float32))
        nl.store(out[i, 1], d)
        return out

    x = np.ones((128, 256), np.float32)
    got = k[2](x)
    assert abs((got == 0).mean() - 0.25) < 0.01
    masks = {got[i, j].tobytes() for i in range(2) for j in range(2)}
    assert len(masks) == 4  # per call and per grid instance
    torch.manual_seed(3)
    a = k[2](x)
    torch.manual_seed(3)
    np.testing.assert_array_equal(k[2](x), a)
    s = k[2](x, seeded=True)
    np.testing.assert_array_equal(k[2](x, seeded=True), s)  # the kernel's seed decides
    assert not np.array_equal(s, a)
