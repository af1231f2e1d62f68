# openneuron.nki.language (Beta 1 `nl`) against numpy references: every call on numpy arrays
# (the simulator's interface), masks, index expressions, grids, broadcasting along the partition
# axis, PSUM accumulation, dtypes, and each hardware limit as an error naming the kernel's line.
# Device launches (neuron tensors), custom ops and torch.compile are test_nki_torch.py.
import math

import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def line_of(func, marker):
    """The source line of `func` holding `marker` (what an error must name)."""
    import inspect

    src, start = inspect.getsourcelines(func)
    for i, text in enumerate(src):
        if marker in text:
            return start + i
    raise AssertionError(marker)


def unary_kernel(name):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, getattr(nl, name)(nl.load(a)))
        return out
    return k


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


UNARY = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu, "silu": lambda x: x / (1 + np.exp(-x)), "square": np.square,
    "abs": np.abs, "negative": np.negative, "sin": np.sin, "cos": np.cos, "sign": np.sign,
    "floor": np.floor, "ceil": np.ceil,
    "gelu_apprx_tanh": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
    "softplus": lambda x: np.log1p(np.exp(x)), "erf": np.vectorize(math.erf),
    "tan": np.tan, "arctan": np.arctan,
    "gelu_apprx_sigmoid": lambda x: x / (1 + np.exp(-1.702 * x)),
    # derivatives: the closed forms NKI documents, checked against torch autograd below
    "gelu_dx": lambda x: 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
    "gelu_apprx_sigmoid_dx": lambda x: (s := 1 / (1 + np.exp(-1.702 * x)))
    + 1.702 * x * s * (1 - s),
    "silu_dx": lambda x: (s := 1 / (1 + np.exp(-x))) * (1 + x * (1 - s)),
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    positive = name in ("log", "sqrt", "rsqrt", "reciprocal")
    a = rand(128, 96, lo=0.1 if positive else -3.0, hi=3.0)
    np.testing.assert_allclose(unary_kernel(name)(a), UNARY[name](a), rtol=2e-5, atol=2e-6)


def test_derivative_activations_match_autograd():
    """nl.gelu_dx / silu_dx / erf_dx / gelu_apprx_sigmoid_dx are d/dx of gelu, silu, erf and
    x * sigmoid(1.702 x): against torch autograd in float64."""
    x = torch.linspace(-4, 4, 128 * 64, dtype=torch.float64).reshape(128, 64).requires_grad_()
    fns = {"gelu_dx": torch.nn.functional.gelu, "silu_dx": torch.nn.functional.silu,
           "erf_dx": torch.erf, "gelu_apprx_sigmoid_dx": lambda v: v * torch.sigmoid(1.702 * v)}
    for name, f in fns.items():
        (grad,) = torch.autograd.grad(f(x).sum(), x)
        got = unary_kernel(name)(x.detach().float().numpy())
        np.testing.assert_allclose(got, grad.numpy(), rtol=2e-5, atol=2e-6, err_msg=name)


def test_integer_bitwise_shifts_and_invert():
    """left_shift / right_shift (arithmetic on negatives) / invert on int32 tiles, as numpy."""
    @nki.jit
    def k(a, b):
        outs = [nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm) for _ in range(3)]
        x, y = nl.load(a), nl.load(b)
        nl.store(outs[0], nl.left_shift(x, y))
        nl.store(outs[1], nl.right_shift(x, y))
        nl.store(outs[2], nl.invert(x))
        return tuple(outs)

    a = RNG.integers(-(1 << 20), 1 << 20, size=(64, 32)).astype(np.int32)
    b = RNG.integers(0, 4, size=(64, 32)).astype(np.int32)
    left, right, inv = k(a, b)
    np.testing.assert_array_equal(left, np.left_shift(a, b))
    np.testing.assert_array_equal(right, np.right_shift(a, b))
    np.testing.assert_array_equal(inv, np.invert(a))


def test_abs_max_abs_min_var_rms_norm_expand_dims():
    @nki.jit
    def k(a, b, w):
        x, y = nl.load(a), nl.load(b)
        outs = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(3)]
        var = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(outs[0], nl.abs_max(x, y))
        nl.store(outs[1], nl.abs_min(x, y))
        nl.store(var, nl.var(x, axis=1, keepdims=True))
        nl.store(outs[2], nl.rms_norm(x, nl.load(w), axis=1, n=a.shape[1]))
        e = nl.expand_dims(y, 1)
        assert e.shape == (a.shape[0], 1, a.shape[1])
        return (*outs, var)

    a, b, w = rand(64, 48), rand(64, 48), rand(1, 48)
    amax, amin, rms, var = k(a, b, w)
    np.testing.assert_array_equal(amax, np.where(np.abs(a) >= np.abs(b), a, b))
    np.testing.assert_array_equal(amin, np.where(np.abs(a) <= np.abs(b), a, b))
    np.testing.assert_allclose(var, a.var(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    want = a / np.sqrt(np.mean(a * a, axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(rms, want, rtol=1e-5, atol=1e-6)


BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power,
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shape_b", [(64, 48), (64, 1), (1, 48), (64,)],
                         ids=["same", "free-bcast", "partition-bcast", "1d"])
def test_binary_broadcasting(name, shape_b):
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, getattr(nl, name)(nl.load(a), nl.load(b), dtype=nl.float32))
        return out

    a = np.round(rand(64, 48, lo=0.5, hi=3.0), 1)
    b = np.round(rand(*shape_b, lo=0.5, hi=3.0), 1)
    ref_b = b.reshape(64, 1) if shape_b == (64,) else b  # tiles align on the partition axis
    ref = BINARY[name](a, ref_b).astype(np.float32)
    np.testing.assert_allclose(k(a, b), ref, rtol=1e-5)


def test_operators_and_scalars():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(out, (2.0 - x) * y / 4 + 1 - (-x) ** 2)
        return out

    a, b = rand(32, 16), rand(32, 16)
    np.testing.assert_allclose(k(a, b), (2.0 - a) * b / 4 + 1 - a**2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn,ref", [("sum", np.sum), ("max", np.max), ("min", np.min),
                                    ("mean", np.mean), ("prod", np.prod)])
@pytest.mark.parametrize("axis", [1, 2, (1, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(fn, ref, axis, keepdims):
    @nki.jit
    def k(a):
        r = getattr(nl, fn)(nl.load(a), axis=axis, keepdims=keepdims)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    a = rand(16, 6, 5, lo=0.5, hi=1.5)
    np.testing.assert_allclose(k(a), ref(a, axis=axis, keepdims=keepdims), rtol=1e-5)


def test_rmsnorm_tutorial_masks_and_mgrid():
    """NKI's RMSNorm tutorial as published (mgrid with a unit axis, masked tail tile)."""
    @nki.jit
    def rmsnorm(a_tensor, g_tensor):
        out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        ix, iw, iy = nl.mgrid[0:128, 0:1, 0:a_tensor.shape[1]]
        num_rows = a_tensor.shape[0]
        g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])
        for i in nl.affine_range(math.ceil(a_tensor.shape[0] / 128)):
            a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))
            square_sum = nl.sum(nl.square(a_tile), axis=[1])
            rms_reciprocal = nl.rsqrt(square_sum / a_tensor.shape[1])
            out_tile = nl.multiply(a_tile, rms_reciprocal)
            g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))
            out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))
            nl.store(out_tensor[i * 128 + ix, iy], value=out_tile,
                     mask=(i * 128 + ix < num_rows))
        return out_tensor

    a, g = rand(300, 256), rand(256)
    ref = a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) * g
    np.testing.assert_allclose(rmsnorm(a, g), ref, rtol=1e-5, atol=1e-5)


def test_index_expression_shapes_keep_the_tile_form():
    """Shapes of advanced-indexed views as NKI's published examples use them: a 1-D tensor
    indexed by arange(64)[:, None] loads as [64, 1]; an arange(1) free index keeps its unit
    axis; an integer index with a [1, n] row expression stores a [1, n] tile."""
    @nki.jit
    def k(idx, col, row):
        i_p, i_one = nl.arange(64)[:, None], nl.arange(1)[None, :]
        i_f = nl.arange(row.shape[1])[None, :]
        a = nl.load(idx[i_p])
        b = nl.load(col[i_p, i_one])
        assert a.shape == (64, 1) and b.shape == (64, 1)
        out = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[i_p, i_one], a[i_p, i_one] + b[i_p, i_one])
        r = nl.load(row[0, i_f])
        assert r.shape == (1, row.shape[1])
        out_row = nl.ndarray(row.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out_row[0, i_f], r * 2.0)
        return out, out_row

    idx, col, row = rand(64), rand(64, 1), rand(1, 40)
    out, out_row = k(idx, col, row)
    np.testing.assert_allclose(out, idx[:, None] + col, rtol=1e-6)
    np.testing.assert_allclose(out_row, 2 * row, rtol=1e-6)


def test_free_axis_mask_and_arange_ds_slices():
    @nki.jit
    def k(a):
        out = nl.full(a.shape, -1.0, dtype=a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(40)[None, :]
        t = nl.load(a[i_p, i_f], mask=(i_f < 30) & (i_p >= 8))
        nl.store(out[i_p, i_f], t, mask=(i_f < 30) & (i_p >= 8))
        u = nl.load(a[nl.ds(0, 8), 30:40])
        nl.store(out[0:8, nl.ds(30, 10)], nl.multiply(u, 2.0))
        return out

    a = rand(64, 40)
    ref = np.full_like(a, -1.0)
    ref[8:, :30] = a[8:, :30]
    ref[:8, 30:] = 2 * a[:8, 30:]
    np.testing.assert_array_equal(k(a), ref)


def test_multi_axis_mask_is_per_lane():
    @nki.jit
    def k(a):
        out = nl.zeros(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:32, 0:32]
        t = nl.load(a)
        nl.store(out[i_p, i_f], t[i_p, i_f], mask=(i_p >= i_f))  # lower triangle
        return out

    a = rand(32, 32)
    np.testing.assert_array_equal(k(a), np.tril(a))


def test_grid_program_id_num_programs():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        assert nl.num_programs(0) == 3 and nl.num_programs(1) == 2 and nl.program_ndim() == 2
        t = nl.load(a[i * 32:(i + 1) * 32, j * 16:(j + 1) * 16])
        nl.store(out[i * 32:(i + 1) * 32, j * 16:(j + 1) * 16], t + (10 * i + j))
        return out

    a = rand(96, 32)
    ref = a.copy()
    for i in range(3):
        for j in range(2):
            ref[i * 32:(i + 1) * 32, j * 16:(j + 1) * 16] += 10 * i + j
    np.testing.assert_allclose(k[3, 2](a), ref)
    with pytest.raises(nki.NkiError, match=r"launch grid \[3, 0\] has no instances"):
        k[3, 0]


@pytest.mark.parametrize("rng", [nl.affine_range, nl.sequential_range, nl.static_range])
def test_loops(rng):
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1), dtype=nl.float32)
        for i in rng(a.shape[1] // 32):
            acc += nl.sum(nl.load(a[:, i * 32:(i + 1) * 32]), axis=1, keepdims=True)
        nl.store(out, acc)
        return out

    a = rand(128, 128)
    np.testing.assert_allclose(k(a), a.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose_x", [False, True])
def test_matmul_psum_accumulation(transpose_x):
    @nki.jit
    def k(x, y):
        M, N = (x.shape[1] if transpose_x else x.shape[0]), y.shape[1]
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((M, N), dtype=nl.float32, buffer=nl.psum)
        for kk in nl.affine_range(y.shape[0] // 128):
            ks = slice(kk * 128, (kk + 1) * 128)
            xt = nl.load(x[ks, :]) if transpose_x else nl.load(x[:, ks])
            acc += nl.matmul(xt, nl.load(y[ks, :]), transpose_x=transpose_x)
        nl.store(out, acc)
        return out

    x = rand(384, 96) if transpose_x else rand(96, 384)
    y = rand(384, 200)
    ref = (x.T if transpose_x else x).astype(np.float64) @ y
    np.testing.assert_allclose(k(x, y), ref, rtol=1e-4, atol=1e-3)


def test_transpose_copy_broadcast_where_softmax():
    @nki.jit
    def k(a, b):
        outs = []
        x = nl.load(a)
        for v in (nl.transpose(x), nl.copy(x, dtype=nl.float16),
                  nl.broadcast_to(nl.load(b), (64, 32)), nl.where(x > 0, x, 0.5 * x),
                  nl.softmax(x, axis=1)):
            o = nl.ndarray(v.shape, dtype=v.dtype, buffer=nl.shared_hbm)
            nl.store(o, v)
            outs.append(o)
        return tuple(outs)

    a, b = rand(64, 32), rand(1, 32)
    t, c, bc, w, sm = k(a, b)
    np.testing.assert_array_equal(t, a.T)
    assert c.dtype == np.float16
    np.testing.assert_array_equal(c, a.astype(np.float16))
    np.testing.assert_array_equal(bc, np.broadcast_to(b, (64, 32)))
    np.testing.assert_allclose(w, np.where(a > 0, a, 0.5 * a))
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_uninitialized_tile_reads_nan_and_masked_lanes_stay_unwritten():
    @nki.jit
    def k(a):
        out = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((8, 4), dtype=nl.float32)
        i_p = nl.arange(8)[:, None]
        i_f = nl.arange(4)[None, :]
        t[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_p < 4))
        nl.store(out, t)
        return out

    a = rand(8, 4)
    r = k(a)
    np.testing.assert_array_equal(r[:4], a[:4])
    assert np.isnan(r[4:]).all()


def test_fresh_tile_in_freed_bytes_reads_nan():
    @nki.jit
    def k(a):
        out = nl.ndarray((2, 8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(8)[:, None]
        i_f = nl.arange(4)[None, :]
        for it in nl.affine_range(2):
            full = nl.load(a)  # its bytes are free again after this iteration's store
            nl.store(out[it], full)
            t = nl.ndarray((8, 4), dtype=nl.float32)
            t[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_p < 4))
            nl.store(out[it], t)
        return out

    a = rand(8, 4)
    r = k(a)
    for it in range(2):
        np.testing.assert_array_equal(r[it, :4], a[:4])
        assert np.isnan(r[it, 4:]).all()


def test_tiles_of_different_shapes_share_on_chip_bytes():
    # Each tile holds one byte range in every partition; tiles of other shapes and dtypes (and
    # fewer partitions) take turns in the same bytes from one iteration to the next.
    @nki.jit
    def k(a):
        n, d = a.shape
        out = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.shared_hbm)
        half = nl.ndarray((n // 2, d // 2), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        for t in nl.affine_range(n // 128):
            x = nl.load(a[t * 128:(t + 1) * 128, :])
            s = nl.sum(x, axis=1, keepdims=True)
            nl.store(out[t * 128:(t + 1) * 128, :], nl.add(nl.multiply(x, 2.0), s))
            h = nl.load(a[t * 128:t * 128 + 64, 0:d // 2], dtype=nl.bfloat16)
            nl.store(half[t * 64:(t + 1) * 64, :], nl.multiply(h, 3.0, dtype=nl.bfloat16))
        return out, half

    a = torch.from_numpy(rand(512, 96))
    out, half = k(a)
    torch.testing.assert_close(out, 2 * a + a.sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    ref = (a.bfloat16().float() * 3).bfloat16()
    torch.testing.assert_close(half, ref.reshape(4, 128, 96)[:, :64, :48].reshape(256, 48),
                               rtol=0, atol=0)


def test_access_pattern_across_partitions():
    # An `ap` pattern that walks a tile flattened (across partitions within one axis) reads
    # the tile's elements in row-major order.
    @nki.jit
    def k(a):
        out = nl.ndarray((32,), dtype=nl.float32, buffer=nl.shared_hbm)
        u = nl.multiply(nl.load(a), 2.0)
        nl.store(out, u.ap([[1, 32]]))
        return out

    a = rand(4, 8)
    np.testing.assert_array_equal(k(a), 2 * a.reshape(-1))


def test_dropout_rate():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.dropout(nl.load(a), 0.25))
        return out

    a = np.ones((128, 512), np.float32)
    r1, r2 = k(a), k(a)
    assert abs((r1 == 0).mean() - 0.25) < 0.01
    assert set(np.unique(r1)) <= {0.0, 1.0}
    assert (r1 != r2).any()  # a new mask on every launch


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.uint8])
def test_numpy_dtypes(dtype):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(a)))
        return out

    a = (RNG.integers(0, 60, size=(64, 32))).astype(dtype)
    r = k(a)
    assert r.dtype == dtype
    np.testing.assert_array_equal(r, (a + a).astype(dtype))


def test_bfloat16_through_cpu_tensors():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(nl.load(a)))
        return out

    a = torch.randn(128, 64, dtype=torch.bfloat16)
    r = k(a)
    assert r.dtype == torch.bfloat16 and r.device.type == "cpu"
    torch.testing.assert_close(r, torch.exp(a.float()).bfloat16())
    # numpy bfloat16 (ml_dtypes), as NKI's simulator takes it: the same bits as torch's
    r_np = k(a.float().numpy().astype(nl.bfloat16))
    assert r_np.dtype == np.dtype(nl.bfloat16)
    np.testing.assert_array_equal(r_np.view(np.uint16), r.view(torch.uint16).numpy())


def test_trace_cache_and_trace_mode():
    calls = []

    def body(a, scale=1.0):
        calls.append(1)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(a), scale))
        return out

    k = nki.jit(body)
    a = rand(16, 8)
    for _ in range(3):
        k(a, 2.0)
    assert len(calls) == 1
    k(a, 3.0)
    k(rand(32, 8), 2.0)
    assert len(calls) == 3
    traced = nki.jit(body, mode="trace")(a)
    assert isinstance(traced, nki.Traced) and traced.n_instructions >= 2
    assert traced.out_specs == [((16, 8), "float32")]


def test_arrays_passed_by_keyword():
    """NKI's public examples pass arrays by keyword (`kernel(src, imm0=vec)`); on numpy arrays
    and on neuron tensors alike (a keyword-only array is an error saying so)."""
    @nki.jit
    def k(a, b=None, scale=1.0):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) * scale + nl.load(b))
        return out

    a, b = rand(16, 8), rand(16, 1)
    np.testing.assert_allclose(k(a, b=b, scale=2.0), 2 * a + b, rtol=1e-6)
    np.testing.assert_allclose(k(scale=3.0, b=b, a=a), 3 * a + b, rtol=1e-6)
    out = k(torch.from_numpy(a).to("neuron"), b=torch.from_numpy(b).to("neuron"))
    np.testing.assert_allclose(out.cpu().numpy(), a + b, rtol=1e-6)

    @nki.jit
    def kw_only(a, *, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) + nl.load(b))
        return out

    with pytest.raises(nki.NkiError, match="keyword-only"):
        kw_only(a, b=b)


def test_simulate_kernel_and_baremetal_output_argument():
    def legacy(a, out):  # Beta 1 style: the output passed in
        nl.store(out, nl.load(a) * 3.0)

    a = rand(8, 8)
    out = np.zeros_like(a)
    nki.baremetal(legacy)(a, out)
    np.testing.assert_allclose(out, 3 * a)
    out2 = np.zeros_like(a)
    nki.simulate_kernel(nki.jit(legacy), a, out2)
    np.testing.assert_allclose(out2, 3 * a)


def test_benchmark_mode():
    k = nki.benchmark(warmup=1, iters=3)(unary_kernel("exp").func)
    k(rand(128, 64))
    assert k.benchmark_result.nc_latency.get_latency_percentile(50) > 0


# --- limits: clear errors naming the kernel line ------------------------------------------------

def _expect_error(kernel, args, marker, match):
    with pytest.raises(nki.NkiError, match=match) as e:
        kernel(*args)
    line = line_of(kernel.func, marker)
    assert f"{__file__}:{line}" in str(e.value), str(e.value)


def test_partition_dim_limit():
    @nki.jit
    def k(a):
        t = nl.load(a)  # LIMIT
        return t

    _expect_error(k, (rand(256, 4),), "# LIMIT", "partition dimension 256 .* exceeds 128")


def test_sbuf_capacity():
    """Capacity counts tiles in use (first to last use, the compiler's liveness): seven
    32 KiB tiles all read at the end do not fit in 192 KiB; a tile Python still references but
    the kernel no longer uses takes no room."""
    @nki.jit
    def k(a):
        tiles = []
        for i in range(7):
            tiles.append(nl.full((128, 8192), float(i), dtype=nl.float32))  # LIMIT
        out = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, sum(tiles[1:], tiles[0]))
        return out

    _expect_error(k, (rand(2, 2),), "# LIMIT", "SBUF is full")

    @nki.jit
    def done_with(a):
        out = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(7):  # each tile bound to `t` until the next: only one in use at a time
            t = nl.full((128, 8192), float(i), dtype=nl.float32)
            nl.store(out, t)
        return out

    np.testing.assert_array_equal(done_with(rand(2, 2)), np.full((128, 8192), 6.0, np.float32))
    assert done_with.specialize(rand(2, 2)).sbuf_peak == 8192 * 4  # one tile at a time

    @nki.jit
    def allocated_first(a):
        """Seven tiles allocated up front, then used one after another (nki-library's
        find_nonzero_indices allocates a chunk's tiles so): in use from the first write."""
        out = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.shared_hbm)
        tiles = [nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf) for _ in range(7)]
        for i, t in enumerate(tiles):
            nisa.memset(t, value=float(i))
            nl.store(out, t)
        return out

    np.testing.assert_array_equal(allocated_first(rand(2, 2)),
                                  np.full((128, 8192), 6.0, np.float32))
    assert allocated_first.specialize(rand(2, 2)).sbuf_peak == 8192 * 4


def test_psum_bank_and_capacity():
    @nki.jit
    def bank(a):
        nl.zeros((128, 1024), dtype=nl.float32, buffer=nl.psum)  # LIMIT

    _expect_error(bank, (rand(2, 2),), "# LIMIT", "one 2 KiB bank")

    @nki.jit
    def full(a):
        keep = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        extra = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)  # LIMIT
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, sum(keep, extra))
        return out

    _expect_error(full, (rand(2, 2),), "# LIMIT", "PSUM is full")

    @nki.jit
    def blocks(a):  # (8, par_dim(128), 512) float32: a bank per block, all 8 banks
        t = nl.ndarray((8, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        out = nl.ndarray((8, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for b in nl.affine_range(8):
            t[b] = nl.full((128, 512), float(b), dtype=nl.float32)
            nl.store(out[b], t[b])
        return out

    np.testing.assert_array_equal(blocks(rand(2, 2))[:, 0, 0], np.arange(8, dtype=np.float32))


@pytest.mark.parametrize("shapes,match", [
    (((64, 256), (32, 64)), "contraction .* differ"),
    (((64, 129), (64, 64)), "gemm_stationary_fmax"),
    (((64, 64), (64, 513)), "gemm_moving_fmax"),
])
def test_matmul_shape_limits(shapes, match):
    @nki.jit
    def k(x, y):
        xt, yt = nl.ndarray(x.shape, dtype=x.dtype), nl.ndarray(y.shape, dtype=y.dtype)
        nl.matmul(xt, yt, transpose_x=True)  # LIMIT

    _expect_error(k, (rand(*shapes[0]), rand(*shapes[1])), "# LIMIT", match)


def test_matmul_dtype_rule():
    @nki.jit
    def k(x, y):
        nl.matmul(nl.load(x), nl.copy(nl.load(y), dtype=nl.bfloat16), transpose_x=True)  # LIMIT

    _expect_error(k, (rand(64, 64), rand(64, 64)), "# LIMIT", "both operands float32")


def test_partition_reduce_and_hbm_operand_errors():
    @nki.jit
    def k(a):
        nl.sum(nl.load(a), axis=0)  # LIMIT

    _expect_error(k, (rand(8, 8),), "# LIMIT", "free axes only")

    @nki.jit
    def h(a):
        nl.exp(a)  # LIMIT

    _expect_error(h, (rand(8, 8),), "# LIMIT", "is in HBM")


def test_out_of_bounds_without_mask():
    @nki.jit
    def k(a):
        i_p = nl.arange(128)[:, None]
        nl.load(a[64 + i_p, nl.arange(8)[None, :]])  # LIMIT

    _expect_error(k, (rand(128, 8),), "# LIMIT", "index out of bounds")


def test_outside_a_kernel():
    with pytest.raises(nki.NkiError, match="inside a kernel"):
        nl.zeros((4, 4), dtype=nl.float32)


@nki.jit
def cast_copy(x, dtype):
    """x loaded, stored as `dtype` (a traced constant)."""
    out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


@pytest.mark.parametrize("dtype, lo, hi", [(nl.uint16, 0, 65535), (nl.int16, -32768, 32767),
                                           (nl.uint32, 0, 4294967295)])
def test_integer_dtypes_saturate_and_truncate(dtype, lo, hi):
    x = np.array([[-70000.5, -3.7, -0.5, 0.0, 2.9, 65535.0, 70000.0, 5e9, np.nan] * 2] * 2,
                 np.float32)
    got = cast_copy(x, dtype)
    assert got.dtype == np.dtype(dtype)
    want = np.trunc(np.clip(np.nan_to_num(x.astype(np.float64), nan=0.0), lo, hi))
    np.testing.assert_array_equal(got.astype(np.float64), want)
    back = cast_copy(got, nl.float32)  # and read back as float32
    np.testing.assert_array_equal(back.astype(np.float64), want.astype(np.float32))


def float8_samples():
    """Every float32 region float8 rounds differently: subnormals, ties, the largest finite
    values and past them, infinities, NaN; both signs."""
    mags = [0.0, 2.0 ** -10, 2.0 ** -9, 3 * 2.0 ** -10, 2.0 ** -17, 2.0 ** -16, 1.0, 1.0625, 1.1875,
            2.5, 447.0, 448.0, 464.0, 465.0, 479.9, 480.0, 500.0, 57344.0, 61439.0, 61440.0,
            65535.0, 65536.0, 1e9, np.inf, np.nan]
    rand_mags = np.exp(RNG.uniform(-20, 12, size=4000))
    v = np.concatenate([mags, rand_mags]).astype(np.float32)
    v = np.concatenate([v, -v])
    return torch.from_numpy(np.resize(v, (128, (len(v) + 127) // 128)))


@pytest.mark.parametrize("name, tdt", [("float8_e4m3", torch.float8_e4m3fn),
                                       ("float8_e5m2", torch.float8_e5m2)])
def test_float8_storage_converts_as_torch(name, tdt):
    x = float8_samples()
    got = cast_copy(x, getattr(nl, name))  # CPU tensors in, CPU tensors out
    assert got.dtype == tdt
    torch.testing.assert_close(got.view(torch.uint8), x.to(tdt).view(torch.uint8), rtol=0,
                               atol=0)
    up = cast_copy(x.to(tdt), nl.float32)  # float8 kernel inputs: read as their float32 values
    torch.testing.assert_close(up, x.to(tdt).float(), rtol=0, atol=0, equal_nan=True)
    # numpy arrays (ml_dtypes' types of the same bits): NKI's simulator interface
    got_np = cast_copy(x.numpy(), getattr(nl, name))
    assert got_np.dtype == np.dtype(getattr(nl, name))
    np.testing.assert_array_equal(got_np.view(np.uint8), x.to(tdt).view(torch.uint8).numpy())
    up_np = cast_copy(np.ones((2, 3), dtype=getattr(nl, name)) * 3, nl.float32)
    np.testing.assert_array_equal(up_np, np.full((2, 3), 3.0, np.float32))


def test_float8_matmul_upcasts_to_float32_psum():
    torch.manual_seed(0)
    st = (torch.randn(128, 64) * 4).to(torch.float8_e4m3fn)
    mv = (torch.randn(128, 200) * 4).to(torch.float8_e5m2)

    @nki.jit
    def mm(a, b):
        out = nl.ndarray((64, 200), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.matmul(nl.load(a), nl.load(b), transpose_x=True))
        return out

    # float8 products are exact in float32; their float32 sum rounds by at most K ulps of the
    # largest partial sum (bounded by the sum of |products|)
    want = st.double().T @ mv.double()
    bound = 128 * 2.0**-24 * (st.double().abs().T @ mv.double().abs())
    assert ((mm(st, mv).double() - want).abs() <= bound).all()
