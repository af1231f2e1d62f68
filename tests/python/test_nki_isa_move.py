# openneuron.nki.isa's data movement across partitions against numpy references, in both
# generations: dma_transpose (its documented permutations and the hardware DGE's limits) and
# nc_stream_shuffle (within each 32-partition quadrant). The rest of nisa: test_nki_isa.py.
import numpy as np
import pytest
from nki_test_util import RNG, rand, run, run_dst

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

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
    assert "test_nki_isa_move.py:" in str(e.value)
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
    assert "test_nki_isa_move.py:" in str(e.value)
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


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int16, np.float16])
def test_copies_of_one_dtype_move_bytes(dtype):
    """nl.load / nl.store, a strided nisa.dma_copy (every other column, a transposing view) and
    nisa.tensor_copy between views of one dtype keep every bit, as a DMA does: int32 / uint32
    past 2^24 (a float32 lane would round them), a float16 NaN's payload."""
    @nki.jit
    def k(x):
        out = nl.ndarray((3,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out[0], t)
        u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t)
        nisa.dma_copy(dst=out[1, :, 0:x.shape[1]:2], src=u[:, 1:x.shape[1]:2])
        nisa.dma_copy(dst=out[1, :, 1:x.shape[1]:2], src=u[:, 0:x.shape[1]:2])
        nisa.dma_copy(dst=out[2], src=x)
        return out

    bits = RNG.integers(0, 1 << 32, size=(16, 8), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.int32).astype(dtype) if dtype != np.float16 else \
        (bits & 0xFFFF).astype(np.uint16).view(np.float16)
    if dtype == np.float16:
        x[0, 0] = np.uint16(0x7E01).view(np.float16)  # a NaN with a payload
    got = k(x)
    swapped = x.copy()
    swapped[:, 0::2], swapped[:, 1::2] = x[:, 1::2], x[:, 0::2]
    view = (lambda a: a.view(np.uint16)) if dtype == np.float16 else (lambda a: a)
    np.testing.assert_array_equal(view(got[0]), view(x))
    np.testing.assert_array_equal(view(got[1]), view(swapped))
    np.testing.assert_array_equal(view(got[2]), view(x))
