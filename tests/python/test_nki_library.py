# The 0.x forms AWS's NKI kernel library (aws-neuron/nki-library, its `core` kernels) writes,
# each against numpy: iota / affine_select by access pattern, a returned reshape of an output,
# operands paired by elements per partition, the identity matrix in SBUF, indirect DMA through a
# reshaped view, matmul accumulation per PSUM location, core_barrier on one NeuronCore.
import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def test_iota_by_pattern():
    """offset + p * channel_multiplier + sum(i_k * step_k), the pattern's counts nested
    outermost first over each partition's elements (keyword and positional 0.x forms)."""
    @nki.jit
    def k():
        out = nl.ndarray((2, 4, 24), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 24), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[1, 2], [10, 3], [100, 4]], offset=5, channel_multiplier=1000)
        nisa.dma_copy(dst=out[0], src=t)
        u = nl.ndarray((4, 2, 12), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(u, [[-3, 24]])
        nisa.dma_copy(dst=out[1], src=u.reshape((4, 24)))
        return out

    p, a, b, c = np.ogrid[0:4, 0:2, 0:3, 0:4]
    want = (5 + 1000 * p + a + 10 * b + 100 * c).reshape(4, 24)
    got = k()
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], np.broadcast_to(-3 * np.arange(24), (4, 24)))


@pytest.mark.parametrize("cmp", ["equal", "not_equal", "greater_equal", "greater", "less",
                                 "less_equal"])
def test_affine_select_by_pattern(cmp):
    """dst = on_true_tile where cmp_op(offset + p * channel_multiplier + pattern, 0), else the
    false value (the library's identity and causal masks)."""
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.affine_select(dst=t, pattern=[[1, 16]], channel_multiplier=-1, offset=2,
                           cmp_op=getattr(nl, cmp), on_true_tile=t, on_false_value=-9.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(8, 16)
    p, j = np.ogrid[0:8, 0:16]
    np.testing.assert_array_equal(k(a), np.where(getattr(np, cmp)(2 + j - p, 0), a, -9.0))


def test_returned_reshape_of_an_output():
    """`return out.reshape(shape)` returns the output in that shape; a part of it is an
    error."""
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 12), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.reshape((1, 12)))
        return out.reshape((3, 4, 1))

    a = rand(3, 4)
    got = k(a)
    assert got.shape == (3, 4, 1)
    np.testing.assert_array_equal(got[..., 0], a)

    @nki.jit
    def part(a):
        out = nl.ndarray((3, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out[0:2]

    with pytest.raises(nki.NkiError, match="a part of the tensor"):
        part(a)


def test_operands_paired_by_elements_per_partition():
    """0.x instructions pair dst and sources by partition and elements per partition:
    [8, 1, 16] with [8, 16], [8, 2, 8] with [8, 16] (row-major within the partition), a
    strided view included."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray((8, 3, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray((8, 16), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((8, 2, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        r = nl.ndarray((8, 3, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r[:, 0:1, :], data1=x, data2=y, op=nl.add)
        nisa.tensor_copy(dst=r[:, 1, :], src=r.ap([[48, 8], [1, 1], [1, 16]]))
        nisa.tensor_scalar(dst=r.ap([[48, 8], [1, 1], [1, 16]], offset=32), data=y,
                           op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=r)
        return out

    a, b = rand(8, 16), rand(8, 2, 8)
    got = k(a, b)
    s = a + b.reshape(8, 16)
    np.testing.assert_array_equal(got[:, 0], s)
    np.testing.assert_array_equal(got[:, 1], s)
    np.testing.assert_array_equal(got[:, 2], 2.0 * b.reshape(8, 16))


def test_shared_identity_matrix_is_an_sbuf_tile():
    """0.x: the identity is an SBUF tile, the moving operand of a transpose as it is (or written
    into dst=)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        eye = nl.shared_identity_matrix(64, dtype=nl.float32)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        ps = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t, moving=eye, is_transpose=True)
        eye2 = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nl.shared_identity_matrix(64, dtype=nl.float32, dst=eye2)
        ps2 = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps2, stationary=t, moving=eye2)
        r = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=ps, data2=ps2, op=nl.add)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = rand(64, 32)
    np.testing.assert_allclose(k(a), 2 * a.T, rtol=1e-6)


def test_indirect_scatter_into_a_reshaped_view():
    """router_topk's scatter: a 1-D reshape of the output, absolute element indices from a
    [P, 1, 1] column view, the index in place of the first pair's step."""
    T, E, K = 8, 16, 2

    @nki.jit
    def k(vals, idx, out):
        v = nl.ndarray((T, K), dtype=vals.dtype, buffer=nl.sbuf)
        i = nl.ndarray((T, K), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=vals)
        nisa.dma_copy(dst=i, src=idx)
        flat = out.reshape((T * E,))
        for j in range(K):
            col = i.ap(pattern=[[K, T], [1, 1], [1, 1]], offset=j)
            nisa.dma_copy(dst=flat.ap([[K * 3, T], [1, 1]], vector_offset=col, indirect_dim=0),
                          src=v.ap([[K, T], [1, 1]], offset=j))
        return out

    experts = np.stack([RNG.choice(E, K, replace=False) for _ in range(T)])
    idx = (np.arange(T)[:, None] * E + experts).astype(np.uint32)
    vals = rand(T, K)
    got = k(vals, idx, np.zeros((T, E), np.float32))
    want = np.zeros((T, E), np.float32)
    np.put_along_axis(want, experts, vals, axis=1)
    np.testing.assert_array_equal(got, want)


def test_matmul_accumulates_per_psum_location():
    """accumulate=None: the first matmul into a PSUM location overwrites, later ones add (router
    _topk's column tiles at partitions 0 and 32 of one PSUM tile); a read ends the group."""
    @nki.jit
    def k(x, w):
        out = nl.ndarray((2, 48, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 4, 16), dtype=x.dtype, buffer=nl.sbuf)
        ws = nl.ndarray((128, 4, 64), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        ps = nl.ndarray((48, 64), dtype=nl.float32, buffer=nl.psum)
        for h in range(4):  # h even -> partitions 0..15, odd -> 32..47
            nisa.nc_matmul(dst=ps[nl.ds(32 * (h % 2), 16), :], stationary=xs[:, h, :],
                           moving=ws[:, h, :])
        r = nl.ndarray((48, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=r, value=0.0)
        nisa.tensor_copy(dst=r[0:16, :], src=ps[0:16, :])
        nisa.tensor_copy(dst=r[32:48, :], src=ps[32:48, :])
        nisa.dma_copy(dst=out[0], src=r)
        nisa.nc_matmul(dst=ps[nl.ds(0, 16), :], stationary=xs[:, 0, :], moving=ws[:, 0, :])
        nisa.tensor_copy(dst=r[0:16, :], src=ps[0:16, :])
        nisa.dma_copy(dst=out[1], src=r)
        return out

    x, w = rand(128, 4, 16), rand(128, 4, 64)
    got = k(x, w)
    prod = np.einsum("khm,khn->hmn", x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(got[0, 0:16], prod[0] + prod[2], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[0, 32:48], prod[1] + prod[3], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[1, 0:16], prod[0], rtol=1e-5, atol=1e-4)


def test_sendrecv_and_core_barrier_between_the_cores_of_a_launch():
    """nisa.sendrecv: each core sends its src to send_to_rank and receives into dst what
    recv_from_rank sent (a ring over 1, 2, 3 and 6 cores, the cores' data after each wrote its
    own); nisa.core_barrier: what one core wrote to HBM before it, the others read after it."""
    @nki.jit
    def ring(a):
        r, n = nl.program_id(0), nl.num_programs(0)
        out = nl.ndarray((n, 2) + a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(r))
        got = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)  # converted from bfloat16
        nisa.sendrecv(t, got, (r + 1) % n, (r - 1) % n, 0)
        nisa.dma_copy(dst=out[r, 0], src=got)
        nisa.core_barrier(out, tuple(range(n)))
        nisa.dma_copy(dst=out[r, 1], src=out[(r + 1) % n, 0])  # written by the next core
        return out

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for n in (1, 2, 3, 6):  # 6: more instance arenas than the executor keeps between runs
        got = ring[n](a)
        for r in range(n):
            np.testing.assert_array_equal(got[r, 0], a + (r - 1) % n)
            np.testing.assert_array_equal(got[r, 1], a + r)
    got = ring[2](torch.from_numpy(a).to("neuron")).cpu().numpy()
    np.testing.assert_array_equal(got[1, 0], a)

    @nki.jit
    def swap_halves(a):
        """rmsnorm_tkg's form: each core sends its half of a shared HBM output to the other."""
        r = nl.program_id(0)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        h = a.shape[1] // 2
        t = nl.ndarray((a.shape[0], h), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[:, r * h:(r + 1) * h])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[:, r * h:(r + 1) * h], src=t)
        mine = nl.ndarray((a.shape[0], h), dtype=a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=out[:, r * h:(r + 1) * h], dst=mine, send_to_rank=1 - r,
                      recv_from_rank=1 - r, pipe_id=0)
        nisa.dma_copy(dst=out[:, (1 - r) * h:(2 - r) * h], src=mine)
        return out

    np.testing.assert_array_equal(swap_halves[2](a[:, :4]), 2 * a[:, :4])


def test_sendrecv_and_core_barrier_errors():
    a = rand(4, 8)

    @nki.jit
    def one_sided(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # ONE
        return x

    with pytest.raises(ValueError, match=r"test_nki_library.py:\d+.*instance 1 reaches 0 core "
                                         r"barriers / sendrecvs and instance 0 1"):
        one_sided[2](a)

    @nki.jit
    def send(x, to=1, frm=1, shape=None, cores=None):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        u = nl.ndarray(shape or x.shape, dtype=x.dtype, buffer=nl.sbuf)
        if cores is not None:
            nisa.core_barrier(x, cores)
        nisa.sendrecv(src=t, dst=u, send_to_rank=to, recv_from_rank=frm, pipe_id=0)

    with pytest.raises(nki.NkiError, match="send_to_rank 2 is not a rank of this launch of 2"):
        send[2](a, to=2)
    with pytest.raises(nki.NkiError, match=r"src \[4, 8\] and dst \[4, 4\] differ"):
        send[2](a, shape=(4, 4))
    with pytest.raises(nki.NkiError, match=r"cores \(0,\) in a launch of 2"):
        send[2](a, cores=(0,))
    with pytest.raises(ValueError, match="receives from rank 0, which sends to rank 0"):
        send[3](a, to=0, frm=0)  # rank 0 sends to itself, not to 1 or 2

    @nki.jit
    def alone(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        nisa.core_barrier(out, (0, 1))  # one NeuronCore: nothing to wait for
        return out

    np.testing.assert_array_equal(alone[1](a), a)


def test_library_annotations():
    """nki.dtype (the dtype names) and nki.typing's mutable_tensor, as the library annotates
    parameters."""
    from openneuron.nki import typing as nt

    @nki.jit
    def k(a: nt.mutable_tensor, dtype: nki.dtype = nl.bfloat16):
        out = nl.ndarray(a.shape, dtype=dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(4, 8)
    assert nki.dtype.float8_e4m3 is nl.float8_e4m3
    np.testing.assert_array_equal(k(a, dtype=nl.float32), a)


def test_destination_first_then_keywords():
    """0.x calls with dst positional and the rest by keyword (attention_tkg's
    nisa.tensor_tensor(dst, a, b, op=...), nisa.tensor_copy(dst, src=...))."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray((3, 8, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(x, src=a)
        nisa.dma_copy(y, src=b)
        r = nl.ndarray((8, 3, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(r[:, 0, :], x, y, op=nl.subtract)
        nisa.tensor_copy(r[:, 1, :], src=x)
        ps = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.psum)
        eye = nl.shared_identity_matrix(8, dtype=nl.float32)
        nisa.nc_matmul(ps, stationary=eye, moving=y)
        nisa.tensor_copy(r[:, 2, :], src=ps)
        for i in range(3):
            nisa.dma_copy(out[i], src=r[:, i, :])
        return out

    a, b = rand(8, 16), rand(8, 16)
    got = k(a, b)
    np.testing.assert_array_equal(got[0], a - b)
    np.testing.assert_array_equal(got[1], a)
    np.testing.assert_allclose(got[2], b, rtol=1e-6)


def test_broadcast_view_paired_with_a_flat_tile():
    """A stride-0 broadcast view [P, 8, 20] against a [P, 160] tile (attention_tkg's
    qk - max): the walk in order picks the shape both can be strided as."""
    @nki.jit
    def k(qk, mx):
        out = nl.ndarray(qk.shape, dtype=qk.dtype, buffer=nl.shared_hbm)
        q = nl.ndarray(qk.shape, dtype=qk.dtype, buffer=nl.sbuf)
        m = nl.ndarray(mx.shape, dtype=mx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=q, src=qk)
        nisa.dma_copy(dst=m, src=mx)
        nisa.tensor_tensor(q, q, m.ap([[20, 16], [0, 8], [1, 20]]), op=nl.subtract)
        nisa.dma_copy(dst=out, src=q)
        return out

    qk, mx = rand(16, 160), rand(16, 20)
    want = (qk.reshape(16, 8, 20) - mx[:, None, :]).reshape(16, 160)
    np.testing.assert_array_equal(k(qk, mx), want)


def test_predicated_copy_of_strided_views():
    """nisa.tensor_copy_predicated on views whose free axes do not merge (a slice of every
    other block): the copy runs over their own axes."""
    @nki.jit
    def k(src, pred, dst):
        s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        p = nl.ndarray(pred.shape, dtype=nl.uint8, buffer=nl.sbuf)
        d = nl.ndarray(dst.shape, dtype=dst.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        nisa.dma_copy(dst=p, src=pred)
        nisa.dma_copy(dst=d, src=dst)
        nisa.tensor_copy_predicated(dst=d[:, 0:4:2, :], src=s[:, 1:4:2, :], predicate=p[:, 0:2, :])
        nisa.dma_copy(dst=dst, src=d)
        return dst

    src, dst = rand(8, 4, 6), rand(8, 4, 6)
    pred = (RNG.uniform(size=(8, 4, 6)) > 0.5).astype(np.uint8)
    want = dst.copy()
    want[:, 0:4:2] = np.where(pred[:, 0:2] != 0, src[:, 1:4:2], dst[:, 0:4:2])
    np.testing.assert_array_equal(k(src, pred, dst.copy()), want)


def test_shared_constant_from_a_npy_file(tmp_path):
    """nl.shared_constant(path): the current API's .npy file (rotational_topk's rotation
    matrices)."""
    c = rand(4, 8)
    path = tmp_path / "c.npy"
    np.save(path, c)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=nl.shared_constant(str(path)))
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(k(c * 0), c)


def test_config_object_arguments_keyed_by_value():
    """An unhashable constant argument (the library's config dataclasses) keys the trace by
    its value: the same values reuse the program, a changed field traces again."""
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        scale: float
        rows: list

    @nki.jit
    def k(a, cfg):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=cfg.scale * len(cfg.rows))
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(4, 8)
    np.testing.assert_array_equal(k(a, Cfg(2.0, [1])), 2 * a)
    np.testing.assert_array_equal(k(a, Cfg(2.0, [1])), 2 * a)
    np.testing.assert_array_equal(k(a, Cfg(2.0, [1, 2])), 4 * a)
    assert len(k._cache) == 2


def test_same_elements_walked_not_broadcast():
    """[P, F] with [P, 1, F] (attention_tkg's qk - max of one tile) pair element by element;
    NKI's trailing-axis broadcasting would have made [P, F, F]. A destination whose axes do not
    merge takes the operands walked as its own shape; iota writes a strided slice."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray((8, 2, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray((8, 16), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((8, 1, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        r = nl.ndarray((8, 4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r[:, 0:4:2, :], data1=x, data2=y, op=nl.subtract)
        nisa.iota(dst=r[:, 1:4:2, :], pattern=[[1, 16]], offset=0, channel_multiplier=100)
        nisa.dma_copy(dst=out, src=r.ap([[32, 8], [8, 4], [1, 8]]))
        return out

    a, b = rand(8, 16), rand(8, 1, 16)
    got = k(a, b).reshape(8, 4, 8)
    np.testing.assert_array_equal(got[:, 0:4:2].reshape(8, 16), a - b[:, 0])
    p, f = np.ogrid[0:8, 0:16]
    np.testing.assert_array_equal(got[:, 1:4:2].reshape(8, 16), 100 * p + f)


def test_dma_copy_walks_a_broadcast_view():
    """nisa.dma_copy between shapes of the same element count moves elements in order, a
    stride-0 (broadcast) source included (attention_tkg's block-table load)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((4, 3, 6), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 18), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[6, 4], [0, 3], [1, 6]]))
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(4, 6)
    np.testing.assert_array_equal(k(a), np.broadcast_to(a[:, None, :], (4, 3, 6)))


def test_matmul_double_row():
    """perf_mode=double_row: [K, 2, M] and [K, 2, N] float8 tiles contract over the partitions
    and the axis of 2 (output_projection_tkg's fp8 path); other dtypes are an error."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=nl.float8_e4m3, buffer=nl.sbuf)
        y = nl.ndarray(b.shape, dtype=nl.float8_e4m3, buffer=nl.sbuf)
        nisa.tensor_copy(dst=x, src=nl.load(a))
        nisa.tensor_copy(dst=y, src=nl.load(b))
        ps = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, x, y, perf_mode=nisa.matmul_perf_mode.double_row)
        r = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.round(rand(64, 2, 16) * 4) / 4  # exact in float8_e4m3
    b = np.round(rand(64, 2, 32) * 4) / 4
    np.testing.assert_allclose(k(a, b), np.einsum("krm,krn->mn", a, b), rtol=1e-6, atol=1e-5)

    @nki.jit
    def bf16(a, b):
        x = nl.load(a, dtype=nl.bfloat16)
        ps = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, x, nl.load(b, dtype=nl.bfloat16),
                       perf_mode=nisa.matmul_perf_mode.double_row)

    with pytest.raises(nki.NkiError, match="double_row.*float8"):
        bf16(a, b)


def test_out_of_range_pattern_is_an_error_where_used():
    """An `ap` view leaving its tile is made without complaint (output_projection_tkg builds
    one for a tile index it skips) and is an error naming the line where an instruction uses
    it."""
    @nki.jit
    def k(a, use):
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        past = t.ap([[8, 4], [2, 8]], offset=2)
        if use:
            nisa.tensor_copy(dst=t, src=past)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(4, 8)
    np.testing.assert_array_equal(k(a, False), a)
    with pytest.raises(nki.NkiError, match=r"test_nki_library.py:\d+.*outside the tensor"):
        k(a, True)


def test_dma_compute_adds_tensors():
    """nisa.dma_compute: dst = the sum of srcs in float32 (qkv_tkg's fused residual add of three
    HBM tensors), shapes walked in order; a scale other than 1.0 is an error."""
    @nki.jit
    def k(a, b, c):
        out = nl.ndarray((1, 48), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, (a.reshape((1, 48)), b, c), scales=(1.0, 1.0, 1.0),
                         reduce_op=nl.add)
        return out.reshape((3, 16))

    a, b, c = rand(3, 16), rand(1, 48), rand(1, 48)
    np.testing.assert_allclose(k(a, b, c), a + b.reshape(3, 16) + c.reshape(3, 16), rtol=1e-6)

    @nki.jit
    def scaled(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a, b], scales=[1.0, 2.0], reduce_op=nl.add)
        return out

    with pytest.raises(nki.NkiError, match="scale must be 1.0"):
        scaled(a, a)


def test_mx_dtype_names_are_an_error_when_used():
    """The current API's MX formats exist as names (kernels that mention them import), and a
    tile of one is an error naming the line."""
    assert nki.dtype.float4_e2m1fn_x4 is nl.float4_e2m1fn_x4

    @nki.jit
    def k(a):
        nl.ndarray((4, 8), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)

    with pytest.raises(nki.NkiError, match=r"test_nki_library.py:\d+.*float8_e4m3fn_x4"):
        k(rand(4, 8))


def test_nc_n_gather():
    """nisa.nc_n_gather: each partition gathers from its own flattened free elements by uint32
    indices (rotational_topk's global indices); other index dtypes are an error."""
    @nki.jit
    def k(data, idx):
        out = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        d = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
        i = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=data)
        nisa.dma_copy(dst=i, src=idx)
        r = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=r, data=d, indices=i)
        nisa.dma_copy(dst=out, src=r)
        return out

    data = rand(8, 3, 10)
    idx = RNG.integers(0, 30, size=(8, 5)).astype(np.uint32)
    np.testing.assert_array_equal(k(data, idx), np.take_along_axis(data.reshape(8, 30), idx, 1))
    with pytest.raises(nki.NkiError, match="must be uint32"):
        k(data, idx.astype(np.int32))


def test_access_pattern_at_a_run_time_scalar_offset():
    """tensor.ap(pattern, offset, scalar_offset=v, indirect_dim=d) in nisa.dma_copy: the pattern
    v steps of axis d further, v read when the kernel runs from a register or a [1, 1] integer
    tile (MoE's expert weights, attention's KV blocks, find_nonzero_indices' write position),
    on either side; an integer is added as it is."""
    @nki.jit
    def k(x, idx):
        _, S, D = x.shape
        i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        r = nisa.register_alloc(1)
        rows = nl.ndarray((4, D), dtype=x.dtype, buffer=nl.sbuf)  # x[i, 1:5, :]
        nisa.dma_copy(dst=rows, src=x.ap(pattern=[[D, 4], [1, D]], offset=D, scalar_offset=i))
        cols = nl.ndarray((S, 2), dtype=x.dtype, buffer=nl.sbuf)  # x[1, :, r:r + 2]
        nisa.dma_copy(dst=cols, src=x[1].ap(pattern=[[D, S], [1, 2]], scalar_offset=r,
                                            indirect_dim=1))
        out = nl.ndarray((3, S, D), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0, 0:4, :], src=rows)
        nisa.dma_copy(dst=out[1, :, 0:2], src=cols)
        flat = out.reshape((3 * S * D,))
        # out[2] flattened, elements i .. i + 7 = rows[0] (a write at a run-time position, as
        # find_nonzero_indices stores: steps of a 1-D tensor's axis are elements); then a
        # static scalar_offset
        nisa.dma_copy(dst=flat.ap(pattern=[[3, 1], [1, D]], offset=2 * S * D, scalar_offset=i,
                                  indirect_dim=0), src=rows[0:1, :])
        nisa.dma_copy(dst=out[2, 4:5, :], src=x.ap(pattern=[[D, 1], [1, D]], scalar_offset=2))
        return out

    x = RNG.standard_normal((4, 6, 8)).astype(np.float32)
    for v in range(4):
        got = k(x, np.array([[v]], np.int32))
        np.testing.assert_array_equal(got[0, 0:4], x[v, 1:5])
        np.testing.assert_array_equal(got[1, :, 0:2], x[1, :, 1:3])
        np.testing.assert_array_equal(got[2].reshape(-1)[v:v + 8], x[v, 1])
        np.testing.assert_array_equal(got[2, 4], x[2, 0])  # 2 steps of axis 0
    got = k(torch.from_numpy(x).to("neuron"), torch.tensor([[3]], dtype=torch.int32,
                                                           device="neuron"))
    np.testing.assert_array_equal(got[0, 0:4].cpu().numpy(), x[3, 1:5])


def test_scalar_offset_out_of_range_fails_or_is_skipped():
    @nki.jit
    def k(x, idx, skip=False):
        i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        t = nl.ndarray((2, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(t, value=-1.0)
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[8, 2], [1, 8]], scalar_offset=i),  # OFFSET
                      oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
        out = nl.ndarray((2, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = rand(5, 8)
    np.testing.assert_array_equal(k(x, np.array([[3]], np.int32)), x[3:5])
    with pytest.raises(RuntimeError, match=r"scalar_offset 4 .* offsets must be in \[0, 3\]") as e:
        k(x, np.array([[4]], np.int32))
    assert "test_nki_library.py:" in str(e.value)
    np.testing.assert_array_equal(k(x, np.array([[4]], np.int32), skip=True),
                                  np.full((2, 8), -1.0, np.float32))
    np.testing.assert_array_equal(k(x, np.array([[-1]], np.int32), skip=True),
                                  np.full((2, 8), -1.0, np.float32))
    with pytest.raises(nki.NkiError, match=r"scalar_offset=...\) takes a register"):
        nki.jit(lambda a: nisa.dma_copy(dst=a, src=a.ap([[1, 1]], scalar_offset=1.5)))(x)
