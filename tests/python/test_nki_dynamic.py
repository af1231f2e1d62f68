# Copies at offsets read when a kernel runs: nisa.tensor_copy_dynamic_src / _dst in both
# generations (Beta 1: a tile element in the subscript, `src[ix, offsets[0, i] + iy]`, the
# published examples; 0.x: destination first, registers and nl.ds(register, n)), against numpy
# references: dtypes, masks, the offset out of range as an error naming the kernel line when it
# runs, and the tracer's refusals.
import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.uniform(-2.0, 2.0, size=shape).astype(np.float32)


@nki.jit
def gather_columns(src_tensor, offsets):
    """The published TensorCopyDynamicSrc example 0: one column of src per offset."""
    out_tensor = nl.ndarray([128, offsets.shape[1]], dtype=src_tensor.dtype,
                            buffer=nl.shared_hbm)
    src_tensor_sbuf = nl.load(src_tensor)
    offsets_sbuf = nl.load(offsets)
    out_sbuf = nl.ndarray([128, offsets.shape[1]], dtype=src_tensor.dtype, buffer=nl.sbuf)
    ix, iy = nl.mgrid[0:128, 0:1]
    for idx in nl.affine_range(offsets_sbuf.shape[1]):
        out_sbuf[ix, idx] = nisa.tensor_copy_dynamic_src(
            src_tensor_sbuf[ix, offsets_sbuf[0, idx] + iy])
    nl.store(out_tensor, value=out_sbuf)
    return out_tensor


@nki.jit
def gather_rows_of_4(src_tensor, offsets):
    """The published example 1: [128, 4] tiles along the second axis of [128, 512, 4]."""
    out_tensor = nl.ndarray([128, offsets.shape[1], 4], dtype=src_tensor.dtype,
                            buffer=nl.shared_hbm)
    src_tensor_sbuf = nl.load(src_tensor)
    offsets_sbuf = nl.load(offsets)
    out_sbuf = nl.ndarray([128, offsets.shape[1], 4], dtype=src_tensor.dtype, buffer=nl.sbuf)
    ix, _, iz = nl.mgrid[0:128, 0:1, 0:4]
    for idx in nl.affine_range(offsets.shape[1]):
        out_sbuf[ix, idx, iz] = nisa.tensor_copy_dynamic_src(
            src_tensor_sbuf[ix, offsets_sbuf[0, idx], iz])
    nl.store(out_tensor, value=out_sbuf)
    return out_tensor


def test_the_published_examples():
    src = rand(128, 512)
    offsets = (np.arange(64, dtype=np.int32) + 4).reshape(1, 64)  # [4, 5, 6, 7, ...]
    np.testing.assert_array_equal(gather_columns(src, offsets), src[:, 4:68])
    shuffled = RNG.integers(0, 512, size=(1, 64)).astype(np.int32)  # same trace, new values
    np.testing.assert_array_equal(gather_columns(src, shuffled), src[:, shuffled[0]])
    src3 = rand(128, 512, 4)
    offsets8 = RNG.integers(0, 512, size=(1, 8)).astype(np.int32)
    np.testing.assert_array_equal(gather_rows_of_4(src3, offsets8),
                                  src3[:, offsets8[0], :])


def test_on_neuron_tensors():
    src = rand(128, 512)
    offsets = RNG.integers(0, 512, size=(1, 16)).astype(np.int32)
    got = gather_columns(torch.from_numpy(src).to("neuron"),
                         torch.from_numpy(offsets).to("neuron"))
    np.testing.assert_array_equal(got.cpu().numpy(), src[:, offsets[0]])


def test_grid_instances_read_their_own_offsets():
    src, offsets = rand(4, 64, 100), RNG.integers(0, 92, size=(4, 1)).astype(np.int32)

    @nki.jit
    def k(src, offsets):
        out = nl.ndarray([4, 64, 8], dtype=nl.float32, buffer=nl.shared_hbm)
        g = nl.program_id(0)
        off = nl.load(offsets[g:g + 1, 0:1])
        ip, jf = nl.mgrid[0:64, 0:8]
        nl.store(out[g], nisa.tensor_copy_dynamic_src(nl.load(src[g])[ip, off[0, 0] + jf]))
        return out

    got = k[4](src, offsets)
    for g in range(4):
        np.testing.assert_array_equal(got[g], src[g][:, offsets[g, 0]:offsets[g, 0] + 8])


@nki.jit
def window(src, offset, width, dtype, shift):
    """Beta 1: `width` columns from offset[0, 0] + shift, converted to dtype."""
    out = nl.ndarray([src.shape[0], width], dtype=dtype, buffer=nl.shared_hbm)
    off = nl.load(offset)
    ip, jf = nl.mgrid[0:src.shape[0], 0:width]
    got = nisa.tensor_copy_dynamic_src(nl.load(src)[ip, off[0, 0] + (jf + shift)], dtype=dtype)
    nl.store(out, got)
    return out


@pytest.mark.parametrize("src_dtype, out_dtype", [(np.float32, np.float32),
                                                  (np.float16, np.float32),
                                                  (np.float32, np.float16),
                                                  (np.int32, np.int32), (np.uint8, np.float32)])
@pytest.mark.parametrize("offset_dtype", [np.int32, np.uint32, np.int16, np.uint16, np.int8,
                                          np.uint8])
def test_dtypes(src_dtype, out_dtype, offset_dtype):
    src = (RNG.uniform(0, 200, size=(32, 96))).astype(src_dtype)
    for v in (0, 7, 90):
        got = window(src, np.array([[v + 2]], offset_dtype), 6, out_dtype, -2)
        assert got.dtype == np.dtype(out_dtype)
        np.testing.assert_array_equal(got, src[:, v:v + 6].astype(out_dtype))


def test_beta1_mask():
    src, offset = rand(64, 40), np.array([[9]], np.int32)

    @nki.jit
    def k(src, offset):
        out = nl.ndarray([64, 8], dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.zeros((64, 8), dtype=nl.float32)
        ip, jf = nl.mgrid[0:64, 0:8]
        # rows below 40, columns from 2: the masked lanes neither read nor written
        res[ip, jf] = nisa.tensor_copy_dynamic_src(nl.load(src)[ip, nl.load(offset)[0, 0] + jf],
                                                   mask=(ip < 40) & (jf >= 2))
        nl.store(out, res)
        return out

    # the Beta 1 call returns a fresh tile: its masked lanes are uninitialized (NaN here)
    got = k(src, offset)
    np.testing.assert_array_equal(got[:40, 2:], src[:40, 11:17])

    @nki.jit
    def scatter(src, offset):
        out = nl.ndarray([64, 40], dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.zeros((64, 40), dtype=nl.float32)
        ip, jf = nl.mgrid[0:64, 0:8]
        nisa.tensor_copy_dynamic_dst(dst=res[ip, nl.load(offset)[0, 0] + jf],
                                     src=nl.load(src)[ip, jf], mask=(ip < 40) & (jf >= 2))
        nl.store(out, res)
        return out

    # masked lanes untouched; the admissible offsets are those of the unmasked lanes: columns
    # offset + 2 .. offset + 7 in [0, 40), so -2 .. 32
    for v in (9, -2, 32):
        want = np.zeros((64, 40), np.float32)
        want[:40, v + 2:v + 8] = src[:40, 2:8]
        np.testing.assert_array_equal(scatter(src, np.array([[v]], np.int32)), want)
    with pytest.raises(RuntimeError, match=r"offset -3 .*\[-2, 32\]"):
        scatter(src, np.array([[-3]], np.int32))


def test_beta1_dynamic_dst_scatter():
    src, offsets = rand(128, 16), RNG.permutation(40)[:16].reshape(1, 16).astype(np.int32)

    @nki.jit
    def k(src, offsets):
        out = nl.ndarray([128, 40], dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.zeros((128, 40), dtype=nl.float32)
        tile, offs = nl.load(src), nl.load(offsets)
        ix, iy = nl.mgrid[0:128, 0:1]
        for i in nl.affine_range(16):
            nisa.tensor_copy_dynamic_dst(dst=res[ix, offs[0, i] + iy], src=tile[ix, i + iy])
        nl.store(out, res)
        return out

    want = np.zeros((128, 40), np.float32)
    want[:, offsets[0]] = src
    np.testing.assert_array_equal(k(src, offsets), want)


def test_0x_registers_and_ds():
    """0.x: a register loaded from a tile, moved, stored; nl.ds(register, n) as the offset."""
    src, at = rand(128, 64), np.array([[5]], np.int32)

    @nki.jit
    def k(src, at):
        out = nl.ndarray([128, 24], dtype=nl.float32, buffer=nl.shared_hbm)
        kept = nl.ndarray([1, 1], dtype=nl.int32, buffer=nl.shared_hbm)
        tile = nl.ndarray([128, 64], dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src)
        at_sb = nl.ndarray([1, 1], dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=at_sb, src=at)
        res = nl.ndarray([128, 24], dtype=nl.float32, buffer=nl.sbuf)
        reg = nisa.register_alloc(0)
        nisa.register_load(reg, at_sb)  # 5
        nisa.tensor_copy_dynamic_src(res[:, 0:8], tile[:, nl.ds(reg, 8)])
        nisa.register_move(reg, 40)
        nisa.tensor_copy_dynamic_src(dst=res[:, 8:16], src=tile[:, nl.ds(reg + 3, 8)])
        one = nisa.register_alloc(60)
        for j in range(8):  # one column at a time, the register plus a static shift
            nisa.tensor_copy_dynamic_src(res[:, 16 + j:17 + j], tile[:, nl.ds(one - 8 + j, 1)])
        scratch = nl.ndarray([1, 1], dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(scratch, reg)
        nisa.dma_copy(dst=kept, src=scratch)
        nisa.dma_copy(dst=out, src=res)
        return out, kept

    got, kept = k(src, at)
    np.testing.assert_array_equal(got, np.concatenate([src[:, 5:13], src[:, 43:51],
                                                       src[:, 52:60]], axis=1))
    assert kept[0, 0] == 40


def test_0x_dynamic_dst():
    src, at = rand(32, 4), np.array([[11]], np.uint16)

    @nki.jit
    def k(src, at):
        out = nl.ndarray([32, 20], dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.ndarray([32, 20], dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(res, 0.0)
        a = nl.ndarray([1, 1], dtype=nl.uint16, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=at)
        t = nl.ndarray([32, 4], dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        nisa.tensor_copy_dynamic_dst(res[:, nl.ds(a[0, 0], 4)], t)
        nisa.dma_copy(dst=out, src=res)
        return out

    want = np.zeros((32, 20), np.float32)
    want[:, 11:15] = src
    np.testing.assert_array_equal(k(src, at), want)
    with pytest.raises(RuntimeError, match=r"test_nki_dynamic.py:\d+: .*tensor_copy_dynamic_dst "
                                           r"offset 17 .*offsets must be in \[0, 16\]"):
        k(src, np.array([[17]], np.uint16))


def test_offset_out_of_range_is_a_run_time_error_naming_the_line():
    src = rand(128, 512)
    for bad in (512, -1, 2**31 - 1):
        offsets = np.arange(64, dtype=np.int32).reshape(1, 64)
        offsets[0, 3] = bad
        with pytest.raises(RuntimeError, match=rf"test_nki_dynamic.py:\d+: in kernel "
                                               rf"'gather_columns': nisa.tensor_copy_dynamic_src "
                                               rf"offset {bad} .*\[0, 511\]"):
            gather_columns(src, offsets)
    # a static shift moves the admissible range: columns offset - 2 ... offset + 1 in [0, 96)
    for bad in (95, 1):
        with pytest.raises(RuntimeError, match=rf"offset {bad} .*offsets must be in \[2, 94\]"):
            window(rand(32, 96), np.array([[bad]], np.int32), 4, np.float32, -2)
    np.testing.assert_array_equal(window(s := rand(32, 96), np.array([[94]], np.int32), 4,
                                         np.float32, -2), s[:, 92:96])

    @nki.jit
    def computed(src, offset):  # the offset tile computed on the device: its value is checked
        out = nl.ndarray([32, 4], dtype=nl.float32, buffer=nl.shared_hbm)
        off = nl.add(nl.load(offset), 3)
        ip, jf = nl.mgrid[0:32, 0:4]
        nl.store(out, nisa.tensor_copy_dynamic_src(nl.load(src)[ip, off[0, 0] + jf]))
        return out

    np.testing.assert_array_equal(computed(s, np.array([[89]], np.int32)), s[:, 92:96])
    with pytest.raises(RuntimeError, match=r"offset 93 \(read from the int32 offset tile"):
        computed(s, np.array([[90]], np.int32))


def test_tracer_refusals():
    src, off = rand(128, 64), np.array([[3]], np.int32)

    def trace(body, offset=off):
        @nki.jit
        def k(src, offset):
            out = nl.ndarray([128, 4], dtype=nl.float32, buffer=nl.shared_hbm)
            r = body(nl.load(src), nl.load(offset), src)
            nl.store(out, r)
            return out
        return k(src, offset)

    ip, jf = nl.mgrid[0:128, 0:4]
    with pytest.raises(nki.NkiError, match="one element of an integer SBUF tile") as e:
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(t[ip, o[0, 0] + jf]),
              off.astype(np.float32))
    assert "test_nki_dynamic.py:" in str(e.value)
    with pytest.raises(nki.NkiError, match="partition axis"):
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(t[o[0, 0], 0:4]))
    with pytest.raises(nki.NkiError, match="SBUF or PSUM tile"):
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(h[ip, o[0, 0] + jf]))
    with pytest.raises(nki.NkiError, match="only nisa.tensor_copy_dynamic_src"):
        trace(lambda t, o, h: nl.add(t[ip, o[0, 0] + jf], 1.0))
    with pytest.raises(nki.NkiError, match="only nisa.tensor_copy_dynamic_src"):
        trace(lambda t, o, h: nisa.tensor_copy(t[ip, o[0, 0] + jf]))
    with pytest.raises(nki.NkiError, match="no run-time offset keeps axis 1"):
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(t[:, nl.ds(o[0, 0], 65)])[:, 0:4])

    def wrong_side(t, o, h):
        r = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy_dynamic_dst(dst=r, src=t[ip, o[0, 0] + jf])
        return r

    with pytest.raises(nki.NkiError, match="use nisa.tensor_copy_dynamic_src"):
        trace(wrong_side)

    def shapes(t, o, h):
        r = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy_dynamic_src(r, t[ip, o[0, 0] + jf])
        return r[:, 0:4]

    with pytest.raises(nki.NkiError, match="same number of partitions and of elements"):
        trace(shapes)
    with pytest.raises(nki.NkiError, match="one run-time index per access"):
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(
            t.reshape((128, 8, 8))[ip, o[0, 0], o[0, 0]]))
    with pytest.raises(nki.NkiError, match="cannot be indexed again"):
        trace(lambda t, o, h: nisa.tensor_copy_dynamic_src(t[:, nl.ds(o[0, 0], 8)][:, 0:4]))
    with pytest.raises(nki.NkiError, match="expected a register"):
        trace(lambda t, o, h: nisa.register_move(t[0:1, 0:1], 3) or t[:, 0:4])


def test_the_published_example_verbatim(run_py):
    """Example 0 as NKI's documentation writes it (neuronxcc imports, nt.tensor annotations)."""
    r = run_py("""
        import numpy as np
        import openneuron.nki
        openneuron.nki.alias()
        from neuronxcc import nki
        import neuronxcc.nki.typing as nt
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl

        @nki.jit(mode="simulation")
        def example_kernel(src_tensor, offsets):
          out_tensor = nl.ndarray([128, 64], dtype=src_tensor.dtype, buffer=nl.shared_hbm)
          # Load src_tensor and offsets into SBUF
          src_tensor_sbuf: nt.tensor[128, 512] = nl.load(src_tensor)
          offsets_sbuf: nt.tensor[1, 64] = nl.load(offsets)

          # Copy into output tensor in SBUF
          out_sbuf: nt.tensor[128, 64] = nl.ndarray([128, 64], dtype=src_tensor.dtype,
                                                    buffer=nl.sbuf)

          # Static indices to access a tile of shape [128, 1];
          # Add dynamic offsets to iy for tensor_copy_dynamic_src
          ix, iy = nl.mgrid[0:128, 0:1]

          for idx in nl.affine_range(offsets_sbuf.shape[1]):
            out_sbuf[ix, idx] = nisa.tensor_copy_dynamic_src(
                src_tensor_sbuf[ix, offsets_sbuf[0, idx] + iy])

          nl.store(out_tensor, value=out_sbuf)
          return out_tensor

        src = np.random.rand(128, 512).astype(np.float32)
        offsets = (np.arange(64, dtype=np.int32) + 4).reshape(1, 64)  # [4, 5, 6, 7, ...]
        np.testing.assert_array_equal(example_kernel(src, offsets), src[:, 4:68])
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout
