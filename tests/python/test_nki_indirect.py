# The DMA's indirect accesses: rows of an HBM tensor gathered into a tile, or a tile's rows
# scattered into HBM, by a tile of row indices read when the kernel runs. Beta 1:
# nl.load(data[idx_tile, iy]), nl.store(data[idx_tile, iy], value=...), nisa.dma_copy with an
# indexed side (oob_mode, dst_rmw_op), nl.atomic_rmw; 0.x: tensor.ap(pattern, vector_offset=idx,
# indirect_dim=0) in nisa.dma_copy and nisa.dma_transpose. Against numpy references written from
# NKI's documentation (its examples where it has them): dtypes, masks, neuron tensors, an
# embedding lookup against torch.nn.functional.embedding, every bad case as an error.
import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(5)


def rand(*shape, dtype=np.float32):
    return RNG.uniform(-2.0, 2.0, size=shape).astype(dtype)


# --- Beta 1: nl.load / nl.store with an index tile -------------------------------------------

@nki.jit
def load_example_1(data_tensor, idx_tensor):
    """nl.load's indirect read example 1 (idx_tensor [64, 1] here: see test_load_examples)."""
    out = nl.ndarray([64, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(512)[None, :]
    idx_tile = nl.load(idx_tensor)  # indices have to be in SBUF
    data_tile = nl.load(data_tensor[idx_tile[i_p, 0], i_f])
    nl.store(out, value=data_tile)
    return out


@nki.jit
def load_example_2(data_tensor):
    """nl.load's indirect read example 2: the indices made by nisa.iota."""
    out = nl.ndarray([64, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(512)[None, :]
    idx_expr = 2 * nl.arange(64)[:, None]
    idx_tile = nisa.iota(idx_expr, dtype=np.int32)
    data_tile = nl.load(data_tensor[idx_tile, i_f])
    nl.store(out, value=data_tile)
    return out


def test_load_examples():
    # NOTE: the documentation loads a 1-D idx_tensor [64] by arange(64)[:, None] and reads
    # idx_tile[i_p, 0]; here that load gives a [64] tile (unit axes no index moves along are
    # dropped), so the [64, 1] tensor stands in for it; data_tensor[idx_tile, i_f] takes either.
    data = rand(128, 512)
    idx = np.arange(0, 128, 2, dtype=np.int32).reshape(64, 1)  # [0, 2, 4, 6, ...]
    np.testing.assert_array_equal(load_example_1(data, idx), data[0::2])
    shuffled = RNG.integers(0, 128, size=(64, 1)).astype(np.int32)  # same trace, new values
    np.testing.assert_array_equal(load_example_1(data, shuffled), data[shuffled[:, 0]])
    np.testing.assert_array_equal(load_example_2(data), data[0::2])


@nki.jit
def store_examples(data_tensor, idx_tensor, tile_values):
    """nl.store's indirect write examples 1 (indices loaded) and 2 (iota), into copies."""
    out1 = nl.ndarray([128, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray([128, 512], dtype=data_tensor.dtype, buffer=nl.shared_hbm)
    for out in (out1, out2):
        ip, jf = nl.mgrid[0:128, 0:512]
        nl.store(out[ip, jf], value=nl.load(data_tensor[ip, jf]))
    data_tile = nl.load(tile_values)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(512)[None, :]
    idx_tile = nl.load(idx_tensor[i_p, 0])  # indices have to be in SB
    nl.store(out1[idx_tile, i_f], value=data_tile[0:64, 0:512])
    idx_expr = 2 * nl.arange(64)[:, None]
    idx_tile2 = nisa.iota(idx_expr, dtype=np.int32)
    nl.store(out2[idx_tile2, i_f], value=data_tile[0:64, 0:512])
    return out1, out2


def test_store_examples():
    data, values = rand(128, 512), rand(64, 512)
    idx = np.arange(0, 128, 2, dtype=np.int32).reshape(64, 1)
    want = data.copy()
    want[0::2] = values
    got1, got2 = store_examples(data, idx, values)
    np.testing.assert_array_equal(got1, want)
    np.testing.assert_array_equal(got2, want)


@nki.jit
def gather(data, idx, rows_per_tile=128):
    """out[i] = data[idx[i]] for a 1-D index tensor of any length, tiles of up to 128 rows
    (the last one masked)."""
    n, d = idx.shape[0], data.shape[1]
    out = nl.ndarray([n, d], dtype=data.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(rows_per_tile)[:, None]
    jf = nl.arange(d)[None, :]
    j0 = nl.arange(1)[None, :]
    for t in nl.affine_range((n + rows_per_tile - 1) // rows_per_tile):
        rows = t * rows_per_tile + ip
        ids = nl.load(idx[rows, j0], mask=(rows < n))
        tile = nl.load(data[ids, jf], mask=(rows < n))
        nl.store(out[rows, jf], value=tile, mask=(rows < n))
    return out


@nki.jit
def scatter(data, idx, values, accumulate=False):
    """A copy of data with row idx[i] <- values[i] (accumulate: += through nl.atomic_rmw)."""
    n, d = values.shape
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:data.shape[0], 0:d]
    nl.store(out[ip, jf], value=nl.load(data[ip, jf]))
    ids = nl.load(idx)
    v = nl.load(values)
    iv, jv = nl.mgrid[0:n, 0:d]
    if accumulate:
        nl.atomic_rmw(out[ids, jv], value=v, op=np.add)
    else:
        nl.store(out[ids, jv], value=v[iv, jv])
    return out


@pytest.mark.parametrize("data_dtype", [np.float32, np.int32, np.float16])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint32])
def test_dtypes_on_numpy(data_dtype, idx_dtype):
    data = (RNG.uniform(-1e3, 1e3, size=(50, 24))).astype(data_dtype)
    idx = RNG.integers(0, 50, size=(37, 1)).astype(idx_dtype)
    got = gather(data, idx, 16)
    assert got.dtype == np.dtype(data_dtype)
    np.testing.assert_array_equal(got, data[idx[:, 0]])


def test_same_dtype_rows_move_as_bytes():
    """int32 past 2^24 gathered HBM to HBM by nisa.dma_copy: the indirect copy moves bytes."""

    @nki.jit
    def k(data, idx):
        out = nl.ndarray([idx.shape[0], data.shape[1]], dtype=data.dtype, buffer=nl.shared_hbm)
        jf = nl.arange(data.shape[1])[None, :]
        nisa.dma_copy(dst=out, src=data[nl.load(idx), jf])
        return out

    data = RNG.integers(-(1 << 30), 1 << 30, size=(20, 9)).astype(np.int32)
    idx = RNG.integers(0, 20, size=(12, 1)).astype(np.uint32)
    np.testing.assert_array_equal(k(data, idx), data[idx[:, 0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.uint32])
def test_dtypes_on_neuron_tensors(dtype, idx_dtype):
    data = torch.randn(40, 33).mul(100).to(dtype)
    idx = torch.randint(0, 40, (130, 1)).to(idx_dtype)
    got = gather(data.to("neuron"), idx.to("neuron"))
    torch.testing.assert_close(got.cpu(), data[idx[:, 0].long()], rtol=0, atol=0)


def test_mask_leaves_masked_rows_alone_and_reads_no_index():
    """The last tile of 128 is masked to 37 rows: the index rows past them are never read
    (they hold whatever the tile held; an out-of-range value there is no error)."""
    data = rand(300, 8)

    @nki.jit
    def k(data, idx):
        out = nl.ndarray([128, 8], dtype=data.dtype, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:8]
        ids = nl.load(idx)  # 128 indices, the last 91 out of range
        tile = nl.full((128, 8), -5.0, dtype=nl.float32)
        nisa.dma_copy(dst=tile[ip, jf], src=data[ids, jf], mask=(ip < 37))
        nl.store(out, value=tile)
        return out

    idx = np.full((128, 1), 10_000, np.int32)
    idx[:37, 0] = RNG.integers(0, 300, size=37)
    want = np.full((128, 8), -5.0, np.float32)
    want[:37] = data[idx[:37, 0]]
    np.testing.assert_array_equal(k(data, idx), want)


def test_scatter_repeated_indices_last_row_wins_atomic_rmw_adds_all():
    data, values = rand(16, 8), rand(6, 8)
    idx = np.array([[3], [9], [3], [0], [9], [3]], np.int32)
    want = data.copy()
    for i, r in enumerate(idx[:, 0]):  # index order: the last writer stays
        want[r] = values[i]
    np.testing.assert_array_equal(scatter(data, idx, values), want)
    want = data.astype(np.float32).copy()
    for i, r in enumerate(idx[:, 0]):  # every row added, in order
        want[r] += values[i]
    np.testing.assert_array_equal(scatter(data, idx, values, accumulate=True), want)


def test_embedding_lookup_matches_torch_embedding_on_neuron():
    """An embedding forward (token ids [B, T] -> rows of a [V, D] table) as public NKI kernels
    write it, on neuron tensors, against torch.nn.functional.embedding on neuron."""

    @nki.jit
    def embedding(table, ids):
        n = ids.shape[0] * ids.shape[1]
        d = table.shape[1]
        flat = ids.reshape((n, 1))
        out = nl.ndarray([n, d], dtype=table.dtype, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(d)[None, :]
        j0 = nl.arange(1)[None, :]
        for t in nl.affine_range((n + 127) // 128):
            rows = t * 128 + ip
            tok = nl.load(flat[rows, j0], mask=(rows < n))
            vec = nl.load(table[tok, jf], mask=(rows < n))
            nl.store(out[rows, jf], value=vec, mask=(rows < n))
        return out

    for dtype in (torch.float32, torch.bfloat16):
        table = torch.randn(1000, 64, dtype=dtype, device="neuron")
        ids = torch.randint(0, 1000, (3, 100), device="neuron")
        got = embedding(table, ids.to(torch.int32)).reshape(3, 100, 64)
        want = torch.nn.functional.embedding(ids, table)
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)


def test_index_tile_among_other_indices():
    """The index tile with index expressions on a 3-D table, alone (whole rows), after an
    integer, with a slice of the row, and in grid instances."""
    d3, d4 = rand(10, 4, 6), rand(3, 10, 6)
    idx = RNG.integers(0, 10, size=(5, 1)).astype(np.int32)

    @nki.jit
    def k(d3, d4, idx):
        outs = [nl.ndarray(s, dtype=nl.float32, buffer=nl.shared_hbm)
                for s in ([5, 4, 6], [5, 4, 6], [5, 6], [5, 3])]
        ids = nl.load(idx)
        _, iy, iz = nl.mgrid[0:5, 0:4, 0:6]
        for out, view in zip(outs, (d3[ids, iy, iz], d3[ids], d4[2, ids, :], d4[2, ids, 1:4])):
            nl.store(out, nl.load(view))
        return tuple(outs)

    got = k(d3, d4, idx)
    rows = idx[:, 0]
    for g, want in zip(got, (d3[rows], d3[rows], d4[2, rows], d4[2, rows, 1:4])):
        np.testing.assert_array_equal(g, want)

    @nki.jit
    def grid(d, idx):
        out = nl.ndarray([3, 5, 6], dtype=d.dtype, buffer=nl.shared_hbm)
        g = nl.program_id(0)
        nl.store(out[g], nl.load(d[g, nl.load(idx), :]))
        return out

    np.testing.assert_array_equal(grid[3](d4, idx), d4[:, rows])


# --- Beta 1: nisa.dma_copy with an indexed side ------------------------------------------------

@nki.jit
def dma_gather_example(in_tensor, step, skip):
    """nisa.dma_copy examples 2 (step 2) / 3 (step 3: out of range, error) / 4 (skip)."""
    n, m = in_tensor.shape
    out = nl.ndarray([n // 2, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    ix, iy = nl.mgrid[0:n // 2, 0:m]
    expr_arange = step * nl.arange(n // 2)[:, None]
    idx_tile = nisa.iota(expr_arange, dtype=np.int32)
    out_tile = nisa.memset(shape=(n // 2, m), value=-1, dtype=in_tensor.dtype)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(src=in_tensor[idx_tile, iy], dst=out_tile[ix, iy], oob_mode=mode)
    nl.store(out, value=out_tile)
    return out


def test_dma_copy_gather_examples():
    a = rand(128, 512)
    np.testing.assert_array_equal(dma_gather_example(a, 2, False), a[0::2])
    with pytest.raises(RuntimeError, match=r"test_nki_indirect.py:\d+: in kernel "
                                           r"'dma_gather_example': indirect load \(gather\) row "
                                           r"index 129 \(partition 43 .*\[0, 127\]"):
        dma_gather_example(a, 3, False)
    want = np.full((64, 512), -1.0, np.float32)
    want[:43] = a[0:128:3]  # 3 * 43 = 129: skipped from there on
    np.testing.assert_array_equal(dma_gather_example(a, 3, True), want)


@nki.jit
def dma_scatter_example(in_tensor, step, skip, rmw):
    """nisa.dma_copy examples 5 (rmw add) / 6 (step 2) / 7 (step 3: error) / 8 (skip)."""
    n, m = in_tensor.shape
    out_tensor = nl.ndarray([2 * n, m], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    ix, iy = nl.mgrid[0:n, 0:m]
    expr_arange = step * nl.arange(n)[:, None]
    inp_tile = nl.load(in_tensor[ix, iy])
    idx_tile = nisa.iota(expr_arange, dtype=np.int32)
    out_tile = nisa.memset(shape=(2 * n, m), value=1 if rmw else -1, dtype=in_tensor.dtype)
    nl.store(out_tensor, value=out_tile)
    if rmw:
        nisa.dma_copy(dst=out_tensor[idx_tile, iy], src=inp_tile, dst_rmw_op=np.add)
    else:
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_copy(dst=out_tensor[idx_tile, iy], src=inp_tile, oob_mode=mode)
    return out_tensor


def test_dma_copy_scatter_examples():
    a = rand(64, 512)
    want = np.ones((128, 512), np.float32)
    want[0::2] += a
    np.testing.assert_array_equal(dma_scatter_example(a, 2, False, True), want)
    want = np.full((128, 512), -1.0, np.float32)
    want[0::2] = a
    np.testing.assert_array_equal(dma_scatter_example(a, 2, False, False), want)
    with pytest.raises(RuntimeError, match=r"test_nki_indirect.py:\d+: .*indirect store "
                                           r"\(scatter\) row index 129 "):
        dma_scatter_example(a, 3, False, False)
    want = np.full((128, 512), -1.0, np.float32)
    want[0:128:3] = a[:43]
    np.testing.assert_array_equal(dma_scatter_example(a, 3, True, False), want)


# --- 0.x: ap(vector_offset=...) in nisa.dma_copy and nisa.dma_transpose -------------------------

@nki.jit
def indirect_gather_kernel(data, indices):
    """The 0.x dma_copy documentation's indirect gather example."""
    P, F = indices.shape[0], data.shape[1]
    output = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    dst = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=dst, src=data.ap(pattern=[[F, P], [1, F]], vector_offset=idx,
                                       indirect_dim=0))
    nisa.dma_copy(dst=output, src=dst)
    return output


@nki.jit
def indirect_scatter_kernel(src_data, indices, base):
    """The 0.x indirect scatter example (into a fresh output holding `base`)."""
    P, F = src_data.shape
    output = nl.ndarray(base.shape, dtype=base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=output, src=base)
    src = nl.ndarray((P, F), dtype=src_data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=src_data)
    idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    nisa.dma_copy(dst=output.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0),
                  src=src)
    return output


def test_0x_dma_copy_gather_and_scatter_examples():
    data = rand(200, 48)
    idx = RNG.permutation(200)[:96].astype(np.uint32).reshape(96, 1)
    np.testing.assert_array_equal(indirect_gather_kernel(data, idx), data[idx[:, 0]])
    values, base = rand(96, 48), rand(200, 48)
    want = base.copy()
    want[idx[:, 0]] = values
    np.testing.assert_array_equal(indirect_scatter_kernel(values, idx, base), want)
    got = indirect_gather_kernel(torch.from_numpy(data).to("neuron"),
                                 torch.from_numpy(idx.astype(np.int32)).to(torch.uint32)
                                 .to("neuron"))
    np.testing.assert_array_equal(got.cpu().numpy(), data[idx[:, 0]])
    bad = idx.copy()
    bad[5, 0] = 200
    with pytest.raises(RuntimeError, match=r"test_nki_indirect.py:\d+: .*row index 200 "
                                           r"\(partition 5 of the uint32 index tile"):
        indirect_gather_kernel(data, bad)


@nki.jit
def gather_transpose_kernel(src_hbm, idx_hbm):
    """The 0.x dma_transpose documentation's indirect example with 1-D indices [128, 1]."""
    P, F = 128, 128
    output = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
    idx_sb = nl.load(idx_hbm)
    dst_sb = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst_sb, value=0)
    src_ap = src_hbm.ap(pattern=[[P, F], [1, P]], vector_offset=idx_sb, indirect_dim=0)
    nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(1, 0))
    nisa.dma_copy(dst=output, src=dst_sb)
    return output


@nki.jit
def gather_transpose_2d_kernel(src_hbm, idx_hbm):
    """The 2-D indices example ([128, N], read column by column)."""
    N_COLS = 2
    P = 128
    F = 128 * N_COLS
    output = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
    idx_sb = nl.load(idx_hbm)
    dst_sb = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst_sb, value=0)
    src_ap = src_hbm.ap(pattern=[[P, F], [1, P]], vector_offset=idx_sb, indirect_dim=0)
    nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(1, 0))
    nisa.dma_copy(dst=output, src=dst_sb)
    return output


@nki.jit
def gather_transpose_4d_kernel(src_hbm, idx_hbm):
    """The 4-D example with 2-D indices [128, N]."""
    _, d1, d2, d3 = src_hbm.shape
    _, N = idx_hbm.shape
    F = 128 * N
    idx_sb = nl.load(idx_hbm)
    dst_sb = nl.ndarray((d3, d1, d2, F), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst_sb, value=0)
    src_ap = src_hbm.ap(pattern=[[d1 * d2 * d3, F], [d2 * d3, d1], [d3, d2], [1, d3]],
                        vector_offset=idx_sb, indirect_dim=0)
    nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(3, 1, 2, 0))
    output = nl.ndarray((d3, d1, d2, F), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=output, src=dst_sb)
    return output


def test_0x_dma_transpose_indirect_examples():
    src = rand(300, 128, dtype=np.float16)
    idx = RNG.integers(0, 300, size=(128, 1)).astype(np.uint32)
    # flat_indices = indices.T.flatten()[:src.shape[0]]; dst = src[flat_indices, :].T
    np.testing.assert_array_equal(gather_transpose_kernel(src, idx), src[idx[:, 0]].T)
    idx2 = RNG.integers(0, 300, size=(128, 2)).astype(np.uint32)
    flat = idx2.T.flatten()[:256]
    np.testing.assert_array_equal(gather_transpose_2d_kernel(src, idx2), src[flat].T)
    src_bf = torch.randn(300, 128, dtype=torch.bfloat16, device="neuron")
    got = gather_transpose_kernel(src_bf, torch.from_numpy(idx.astype(np.int64))
                                  .to(torch.uint32).to("neuron"))
    torch.testing.assert_close(got.cpu(), src_bf.cpu()[torch.from_numpy(idx[:, 0].astype(
        np.int64))].T, rtol=0, atol=0)
    bad = idx.copy()
    bad[7, 0] = 300
    with pytest.raises(RuntimeError, match=r"row index 300 \(partition 7"):
        gather_transpose_kernel(src, bad)
    for shape in ((300, 3, 1, 32), (300, 1, 2, 16)):  # shape[1] or shape[2] is 1
        src4 = rand(*shape, dtype=np.float16)
        got = gather_transpose_4d_kernel(src4, idx2)
        np.testing.assert_array_equal(got, src4[flat].transpose(3, 1, 2, 0))
    with pytest.raises(nki.NkiError, match=r"needs shape\[1\] or shape\[2\] to be 1"):
        gather_transpose_4d_kernel(rand(300, 2, 2, 8, dtype=np.float16), idx2)


# --- errors when traced ------------------------------------------------------------------------

def test_tracer_refusals():
    data, zeros = rand(64, 16), np.zeros((8, 1), np.int32)

    def trace(body, idx=zeros, src=data):
        @nki.jit
        def k(src, idx):
            out = nl.ndarray([8, 16], dtype=nl.float32, buffer=nl.shared_hbm)
            r = body(src, idx, nl.load(idx))
            if r is not None:
                nl.store(out, r)
            return out
        return k(src, idx)

    jf = nl.arange(16)[None, :]
    with pytest.raises(nki.NkiError, match="integer tile in SBUF") as e:
        trace(lambda s, i, t: nl.load(s[nl.load(s[0:8, 0:1]), jf]))
    assert "test_nki_indirect.py" in str(e.value)
    with pytest.raises(nki.NkiError, match="integer tile in SBUF"):
        trace(lambda s, i, t: nl.load(s[i, jf]))  # indices still in HBM
    with pytest.raises(nki.NkiError, match=r"one row index per partition"):
        trace(lambda s, i, t: nl.load(s[nisa.iota(nl.arange(8)[:, None] + nl.arange(2)[None, :],
                                                  dtype=np.int32), jf]))
    with pytest.raises(nki.NkiError, match="one index tile per access"):
        trace(lambda s, i, t: nl.load(s.reshape((64, 16, 1))[t, t, 0]))
    with pytest.raises(nki.NkiError, match="only nl.load, nl.store"):
        trace(lambda s, i, t: nl.store(s[t, jf], value=3.0))
    with pytest.raises(nki.NkiError, match=r"has 8 rows and the access \[12, 16\]"):
        trace(lambda s, i, t: nl.load(s.ap([[16, 12], [1, 16]], vector_offset=t)))
    with pytest.raises(nki.NkiError, match="hwdge"):
        trace(lambda s, i, t: nisa.dma_copy(dst=nl.ndarray((8, 16), dtype=nl.float32),
                                            src=s[t, jf], dge_mode=nisa.dge_mode.hwdge))
    with pytest.raises(nki.NkiError, match="only oob_mode=nisa.oob_mode.error"):
        trace(lambda s, i, t: nisa.dma_copy(dst=s[t, jf], src=nl.zeros((8, 16), nl.float32),
                                            dst_rmw_op=np.add, oob_mode=nisa.oob_mode.skip))
    with pytest.raises(nki.NkiError, match="same shape on both sides"):
        trace(lambda s, i, t: nisa.dma_copy(dst=nl.ndarray((16, 8), dtype=nl.float32),
                                            src=s[t, jf]))
    with pytest.raises(nki.NkiError, match="load_transpose2d"):
        trace(lambda s, i, t: nl.load_transpose2d(s[t, jf]))
    with pytest.raises(nki.NkiError, match="cannot be indexed again"):
        trace(lambda s, i, t: nl.load(s[t, jf][0:4]))
    with pytest.raises(nki.NkiError, match="scalar_offset"):
        trace(lambda s, i, t: nl.load(s.ap([[16, 8], [1, 16]], scalar_offset=t)))
    with pytest.raises(nki.NkiError, match="indirect_dim=1"):
        trace(lambda s, i, t: nl.load(s.ap([[16, 8], [1, 16]], vector_offset=t, indirect_dim=1)))
    with pytest.raises(nki.NkiError, match="only np.add"):
        trace(lambda s, i, t: nl.atomic_rmw(s[t, jf], value=nl.zeros((8, 16), nl.float32),
                                            op=np.multiply))


def test_dma_transpose_indirect_limits():
    src = rand(64, 16, dtype=np.float16)

    def trace(idx, rows=16, src=src, **kw):
        @nki.jit
        def k(src, idx):
            out = nl.ndarray([16, rows], dtype=src.dtype, buffer=nl.shared_hbm)
            t = nisa.dma_transpose(src.ap([[16, rows], [1, 16]], vector_offset=nl.load(idx)),
                                   **kw)
            nl.store(out, t)
            return out
        return k(src, idx)

    ok = RNG.integers(0, 64, size=(16, 1)).astype(np.uint32)
    np.testing.assert_array_equal(trace(ok), src[ok[:, 0]].T)
    with pytest.raises(nki.NkiError, match="indices dtype int32 must be uint32"):
        trace(ok.astype(np.int32))
    with pytest.raises(nki.NkiError, match=r"indices.shape\[0\] 8 must be in \[16, 128\]"):
        trace(np.zeros((8, 2), np.uint32), rows=16)
    with pytest.raises(nki.NkiError, match="fewer than src.shape"):
        trace(ok, rows=32)
    with pytest.raises(nki.NkiError, match="divisible by 16"):
        trace(ok, rows=8)
    with pytest.raises(nki.NkiError, match="with several columns"):
        trace(np.zeros((16, 2), np.uint32), rows=32)
    with pytest.raises(nki.NkiError, match="software DGE"):
        trace(ok, dge_mode=nisa.dge_mode.hwdge)
    with pytest.raises(nki.NkiError, match="src dtype float32 must be 2 bytes"):
        trace(ok, src=src.astype(np.float32))


def test_atomic_rmw_scatter_add_matches_index_add_on_neuron():
    """Rows of a gradient added into an embedding table's gradient by token id (repeated ids
    add up), on neuron tensors, against torch's index_add_ on neuron."""
    grad_table = torch.zeros(50, 16, device="neuron")
    ids = torch.randint(0, 50, (96,), device="neuron")
    grads = torch.randn(96, 16, device="neuron")
    got = scatter(grad_table, ids.to(torch.int32).reshape(96, 1), grads, accumulate=True)
    want = torch.zeros(50, 16, device="neuron").index_add_(0, ids, grads)
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-6, atol=1e-6)
