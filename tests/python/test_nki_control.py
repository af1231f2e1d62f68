# Run-time loops (nl.dynamic_range, nl.fori_loop, nl.while_loop: NKI's hardware loops), each
# against numpy: trip counts read from an input when the kernel runs, the loop register as an
# access pattern's scalar_offset, nesting, grid instances with their own counts, neuron
# tensors, state carried in tiles written in place, and every misuse as a clear error.
import numpy as np
import pytest
import torch

import openneuron.nki.isa as nisa
import openneuron.nki.language as nl
from openneuron import nki
from openneuron.nki import NkiError

RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def count(n):
    return np.array([[n]], np.int32)


def load_register(n):
    """A register holding the int32 value of HBM tensor n ([1, 1])."""
    sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=n)
    reg = nisa.register_alloc()
    nisa.register_load(reg, sb)
    return reg


@nki.jit
def repeat_add(x, n):
    """out = x * n: acc += x, n times (n read when the kernel runs)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    t = nl.load(x)
    for _ in nl.dynamic_range(load_register(n)):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nl.store(out, acc)
    return out


@pytest.mark.parametrize("n", [0, 1, 5, -3])
def test_dynamic_range_runs_the_body_the_count_read_at_run_time(n):
    x = rand(128, 64)
    np.testing.assert_allclose(repeat_add(x, count(n)), x * max(n, 0), rtol=1e-6)


@pytest.mark.parametrize("start,stop,step", [(0, 4, 1), (1, 4, 1), (0, 4, 2), (3, 4, 5),
                                              (2, 2, 1)])
def test_loop_register_steps_through_row_tiles(start, stop, step):
    """for i in dynamic_range(start, stop, step): tile i of x, times (i + 1), into tile i of out;
    i read as the access pattern's scalar_offset (rows = i * 128)."""
    @nki.jit
    def k(x, lo, hi):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        zero = nl.zeros((128, 32), dtype=x.dtype, buffer=nl.sbuf)
        for r in range(x.shape[0] // 128):
            nl.store(out[r * 128:(r + 1) * 128, :], zero)
        rows = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        for i in nl.dynamic_range(load_register(lo), load_register(hi), step):
            nisa.tensor_scalar(dst=rows, data=i, op0=nl.multiply, operand0=128)
            pat = [[32, 128], [1, 32]]
            tile = nl.ndarray((128, 32), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x.ap(pat, 0, scalar_offset=rows, indirect_dim=0))
            scale = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=scale, data=i, op0=nl.add, operand0=1)
            col = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=col, src=nl.broadcast_to(scale, (128, 1)))
            nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=col)
            nisa.dma_copy(dst=out.ap(pat, 0, scalar_offset=rows, indirect_dim=0), src=tile)
        return out

    x = rand(512, 32)
    want = np.zeros_like(x)
    for i in range(start, stop, step):
        want[i * 128:(i + 1) * 128] = x[i * 128:(i + 1) * 128] * (i + 1)
    np.testing.assert_allclose(k(x, count(start), count(stop)), want, rtol=1e-6)


def test_fori_loop_with_python_and_register_bounds():
    """The documentation's shape: body_fun(i) per iteration, the upper bound a register; bounds
    read when the loop starts (the body changing the bound's register does not change the
    count), and the body's i a copy (writing it does not either)."""
    @nki.jit
    def k(x, n):
        out = nl.ndarray((1, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((1, 64), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(x)
        ub = load_register(n)

        def body(i):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
            nisa.register_move(ub, 1000)
            nisa.register_move(i, 1000)

        nl.fori_loop(1, ub, body)
        nl.fori_loop(0, 2, body)  # python bounds: two more
        nl.store(out, acc)
        return out

    x = rand(1, 64)
    np.testing.assert_allclose(k(x, count(4)), x * 5, rtol=1e-6)


def test_while_loop_counts_down_a_register():
    """nl.while_loop: acc += x while the count is nonzero; the body returns the register with
    the next condition (count - 1), loaded from a tile it updates in place."""
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(x)
        left = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=left, src=n)
        start = nisa.register_alloc()
        nisa.register_load(start, left)

        def body(r):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
            nisa.tensor_scalar(dst=left, data=left, op0=nl.subtract, operand0=1)
            nxt = nisa.register_alloc()
            nisa.register_load(nxt, left)
            return nxt

        nl.while_loop(start, body)
        nl.store(out, acc)
        return out

    x = rand(128, 16)
    for n in (0, 1, 6):
        np.testing.assert_allclose(k(x, count(n)), x * n, rtol=1e-6)


def test_nested_loops_and_grid_instances_with_their_own_counts():
    """out[g] = x * (rows[g] * cols[g]): a loop in a loop, each instance of a grid reading its
    own trip counts."""
    @nki.jit
    def k(x, counts):
        g = nl.program_id(0)
        out = nl.ndarray((2, 128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(x)
        outer = load_register(counts[g:g + 1, 0:1])
        inner = load_register(counts[g:g + 1, 1:2])
        for _ in nl.dynamic_range(outer):
            for _ in nl.dynamic_range(inner):
                nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nl.store(out[g], acc)
        return out

    x = rand(128, 8)
    got = k[2](x, np.array([[2, 3], [4, 0]], np.int32))
    np.testing.assert_allclose(got[0], x * 6, rtol=1e-6)
    np.testing.assert_array_equal(got[1], np.zeros_like(x))


def test_tiles_from_before_the_loop_keep_their_memory_through_it():
    """The body drops t after reading it: the trace's tile is what every iteration reads, so a
    tile made after must not take its memory (100s there would be added from iteration 2)."""
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(x)
        for _ in nl.dynamic_range(load_register(n)):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
            t = None
            u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=u, value=100.0)
            nisa.tensor_tensor(dst=u, data1=u, data2=u, op=nl.add)
        nl.store(out, acc)
        return out

    x = rand(128, 32)
    np.testing.assert_allclose(k(x, count(3)), x * 3, rtol=1e-6)


def test_capacity_counts_a_tile_from_before_the_loop_through_all_of_it():
    """a (96 KiB a partition) is last read at the top of the body, b (112 KiB) made after: one
    pass would fit them in turn, but the next iteration reads a again."""
    @nki.jit
    def k(x, n):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.zeros((128, 24576), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.dynamic_range(load_register(n)):
            nisa.tensor_copy(dst=r, src=a[:, 0:4])
            b = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=b, value=1.0)
            nisa.tensor_scalar(dst=b, data=b, op0=nl.add, operand0=1.0)
            nisa.tensor_copy(dst=r, src=b[:, 0:4])
        nl.store(out, r)
        return out

    with pytest.raises(NkiError, match="SBUF is full"):
        k(rand(128, 4), count(1))


def test_neuron_tensors_run_on_the_stream():
    x = torch.randn(128, 64)
    dev = torch.device("neuron")
    got = repeat_add(x.to(dev), torch.tensor([[3]], dtype=torch.int32).to(dev))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x * 3, rtol=1e-6, atol=1e-6)


# --- misuse ----------------------------------------------------------------------------------

def _error(kernel, *args):
    with pytest.raises(NkiError) as ex:
        kernel(*args)
    return str(ex.value)


def test_break_out_of_a_run_time_loop_is_an_error_naming_the_loop():
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for _ in nl.dynamic_range(load_register(n)):
            nl.store(out, nl.load(x))
            break
        return out

    msg = _error(k, rand(4, 4), count(2))
    assert "test_nki_control.py" in msg and "nl.dynamic_range was left by break, return" in msg


def test_bad_bounds_and_steps_are_errors():
    @nki.jit
    def k(x, n, step, stop):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        reg = load_register(n)
        for _ in nl.dynamic_range(0, reg if stop is None else stop, reg if step is None else step):
            nl.store(out, nl.load(x))
        return out

    x, n = rand(4, 4), count(2)
    assert "step must be a positive int known when the kernel is traced" in _error(k, x, n, None,
                                                                                    None)
    assert "step must be a positive int" in _error(k, x, n, 0, None)
    assert "stop 2147483648 is out of range: loop bounds are int32" in _error(k, x, n, 1, 1 << 31)
    assert "stop must be an int, an NkiScalar or a register" in _error(k, x, n, 1, 2.5)


def test_a_register_is_not_a_python_bool():
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        reg = load_register(n)
        while reg:
            nl.store(out, nl.load(x))
        return out

    assert "cannot be a Python bool (if / while): for a loop on a run-time value use " \
           "nl.while_loop" in _error(k, rand(4, 4), count(1))


def test_while_body_must_return_a_register():
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.while_loop(load_register(n), lambda r: None)
        return out

    assert "body_fun must return the register holding the next condition" in \
        _error(k, rand(4, 4), count(1))


def test_sync_points_inside_run_time_loops_meet_as_the_cores_run():
    """Two cores pass a running total around a ring once per iteration of a dynamic_range loop
    (sendrecv, then a barrier before the next round's HBM write); the count read by each core.
    Different counts on the two cores are an error (the hardware would wait forever)."""
    @nki.jit
    def k(x, n):
        g = nl.program_id(0)
        out = nl.ndarray((2, 1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=acc, src=x[g])
        got = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.dynamic_range(load_register(n[g])):
            nisa.sendrecv(src=acc, dst=got, send_to_rank=1 - g, recv_from_rank=1 - g,
                          pipe_id=0)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=got, op=nl.add)
            nisa.core_barrier(out, (0, 1))
        nisa.dma_copy(dst=out[g], src=acc)
        return out

    x = rand(2, 1, 8)
    got = k[2](x, np.array([[[3]], [[3]]], np.int32))
    a, b = x[0], x[1]
    for _ in range(3):
        a, b = a + b, b + a
    np.testing.assert_allclose(got[0], a, rtol=1e-5)
    np.testing.assert_allclose(got[1], b, rtol=1e-5)
    with pytest.raises(RuntimeError, match="test_nki_control.py.*instance 0 reaches a sendrecv "
                                           "that instance 1 never reaches"):
        k[2](x, np.array([[[3]], [[2]]], np.int32))


def test_a_loop_that_never_ends_is_stopped_with_an_error():
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.while_loop(load_register(n), lambda r: r)
        nl.store(out, nl.load(x))
        return out

    np.testing.assert_array_equal(k(np.ones((4, 4), np.float32), count(0)), np.ones((4, 4)))
    with pytest.raises(RuntimeError, match="test_nki_control.py.*a run-time loop has gone round "
                                           "16777216 times"):
        k(np.ones((4, 4), np.float32), count(1))


# --- NkiScalar and nl.if_else ----------------------------------------------------------------

def _wrap32(v):
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


SCALAR_EXPRS = {  # name: (traced on a scalar i, Python on an int)
    "i*4+1": (lambda i: i * 4 + 1, lambda v: _wrap32(v * 4 + 1)),
    "i//4": (lambda i: i // 4, lambda v: _trunc_div(v, 4)),
    "i%4": (lambda i: i % 4, lambda v: v - _trunc_div(v, 4) * 4),
    "-i": (lambda i: -i, lambda v: _wrap32(-v)),
    "100000*i": (lambda i: 100000 * i, lambda v: _wrap32(100000 * v)),
    "i<3": (lambda i: i < 3, lambda v: int(v < 3)),
    "i==-17": (lambda i: i == -17, lambda v: int(v == -17)),
    "i!=2": (lambda i: i != 2, lambda v: int(v != 2)),
    "max(i,7)": (lambda i: nisa.scalar_alu(i, 7, op=nl.maximum), lambda v: max(v, 7)),
    "min(i,7)": (lambda i: nisa.scalar_alu(i, 7, op=nl.minimum), lambda v: min(v, 7)),
    "7-i": (lambda i: 7 - i, lambda v: 7 - v),
    "fmod": (lambda i: nisa.scalar_alu(i, -3, op=nl.fmod), lambda v: v - _trunc_div(v, -3) * -3),
    "-17/i": (lambda i: -17 / i, lambda v: _trunc_div(-17, v)),
}


@nki.jit
def scalar_values(index, exprs):
    tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=index)
    i = nisa.scalar_load(tile)
    out = nl.ndarray((1, len(exprs)), dtype=nl.int32, buffer=nl.shared_hbm)
    for k, name in enumerate(exprs):
        nisa.scalar_store(out[0:1, k:k + 1], SCALAR_EXPRS[name][0](i))
    return out


@pytest.mark.parametrize("v", [5, -17, 2, 100000, 2**31 - 1])
def test_scalar_arithmetic_is_int32_that_wraps(v):
    names = tuple(SCALAR_EXPRS)
    got = scalar_values(count(v), names)
    want = [SCALAR_EXPRS[n][1](v) for n in names]
    assert got[0].tolist() == want, dict(zip(names, zip(got[0].tolist(), want)))


def test_scalar_alu_on_two_ints_is_evaluated_when_traced():
    assert nisa.scalar_alu(-17, 4, op=nl.divide) == -4
    assert nisa.scalar_alu(-17, 4, op=nl.fmod) == -1
    assert nisa.scalar_alu(3, 4, op=nl.less) is True


@pytest.mark.parametrize("flag", [1, 0, -5])
def test_if_else_chooses_when_the_kernel_runs(flag):
    """The documentation's example (then: + 10, else: * 2), a one-branch form and a static
    condition; the tile the taken branch does not write reads as NaN (uninitialized)."""
    @nki.jit
    def k(f, data):
        f_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f_sb, src=f)
        cond = nisa.scalar_load(f_sb) > 0
        result = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=result, src=data)
        only_then = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)

        def then_branch():
            nisa.tensor_scalar(result, result, op0=nl.add, operand0=10.0)
            nisa.memset(dst=only_then, value=1.0)

        def else_branch():
            nisa.tensor_scalar(result, result, op0=nl.multiply, operand0=2.0)

        nl.if_else(cond, then_branch, else_branch)
        nl.if_else(f_sb, lambda: nisa.tensor_scalar(result, result, op0=nl.add, operand0=0.5))
        nl.if_else(False, lambda: nisa.memset(dst=result, value=-1.0))
        out = nl.ndarray((2,) + data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0], src=result)
        nisa.dma_copy(dst=out[1], src=only_then)
        return out

    d = rand(4, 8)
    got = k(count(flag), d)
    want = (d + 10.0 if flag > 0 else d * 2.0) + (0.5 if flag != 0 else 0.0)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    if flag > 0:
        np.testing.assert_array_equal(got[1], np.ones_like(d))
    else:
        assert np.isnan(got[1]).all()


def test_fori_loop_value_is_a_scalar_for_arithmetic_offsets():
    """With int / NkiScalar bounds the loop value is an NkiScalar: `i * 32` as the row offset
    of an access pattern; the upper bound a scalar expression (n - 1)."""
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for r in range(x.shape[0] // 32):
            nl.store(out[r * 32:(r + 1) * 32, :], nl.zeros((32, 16), dtype=x.dtype, buffer=nl.sbuf))
        n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=n_sb, src=n)
        upper = nisa.scalar_load(n_sb) - 1

        def body(i):
            assert isinstance(i, nisa.NkiScalar)
            pat = [[16, 32], [1, 16]]
            t = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x.ap(pat, 0, scalar_offset=i * 32, indirect_dim=0))
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=-1.0)
            nisa.dma_copy(dst=out.ap(pat, 0, scalar_offset=i * 32, indirect_dim=0), src=t)

        nl.fori_loop(0, upper, body)
        return out

    x = rand(128, 16)
    want = np.zeros_like(x)
    want[:64] = -x[:64]
    np.testing.assert_array_equal(k(x, count(3)), want)


def test_scalar_misuse_is_an_error():
    def kernel(body):
        @nki.jit
        def k(n):
            t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=n)
            body(t)
            out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t)
            return out
        return k

    n = count(3)
    assert "is not known while the kernel is traced" in _error(
        kernel(lambda t: range(int(nisa.scalar_load(t)))), n)
    assert "value must be an NkiScalar" in _error(
        kernel(lambda t: nisa.scalar_store(t, 5)), n)
    assert "not a scalar operation" in _error(
        kernel(lambda t: nisa.scalar_alu(nisa.scalar_load(t), 2, op=nl.exp)), n)
    assert "cannot be a Python bool" in _error(
        kernel(lambda t: bool(nisa.scalar_load(t) > 2)), n)
    with pytest.raises(RuntimeError, match="test_nki_control.py.*integer scalar division by "
                                           "zero \\(7 / 0\\)"):
        kernel(lambda t: nisa.scalar_store(t, 7 // (nisa.scalar_load(t) - 3)))(n)


def test_registers_hold_int32_exactly_and_load_from_hbm():
    """register_load straight from an HBM tensor, register_move / register_alloc / the loop
    bounds past float32's 2^24 (an NkiScalar's arithmetic), register_store back: every int32
    value exactly."""
    @nki.jit
    def k(v):
        out = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.shared_hbm)
        a = nisa.register_alloc((1 << 30) + 1)
        b = nisa.register_alloc()
        nisa.register_load(b, v)  # v in HBM
        c = nisa.register_alloc()
        nisa.register_move(c, -(1 << 31))
        d = nisa.register_alloc()
        s = nisa.scalar_load(v)
        for i in nl.dynamic_range(s, s + 2):  # bounds past 2^24: two iterations
            nisa.register_store(d, i)
        for j, r in enumerate((a, b, c, d)):
            nisa.register_store(out[0:1, j:j + 1], r)
        return out

    v = (1 << 24) + 3
    got = k(np.array([[v]], np.int32))
    assert got.tolist() == [[(1 << 30) + 1, v, -(1 << 31), v + 1]]
    assert nl.bool is np.bool_


def test_run_time_loop_kernel_as_a_custom_op_under_torch_compile():
    """A kernel whose trip count is a tensor's value, registered as a custom op: one node
    under torch.compile (Inductor on neuron), the same values as eager."""
    op = nki.custom_op("nki_control_tests::repeat_add", repeat_add)
    dev = torch.device("neuron")
    x = torch.randn(128, 64, device=dev)
    n = torch.tensor([[4]], dtype=torch.int32, device=dev)

    def f(x, n):
        return torch.relu(op(x, n)) - 1

    eager = f(x, n)
    torch.testing.assert_close(eager.cpu(), torch.relu(4 * x.cpu()) - 1, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.compile(f)(x, n).cpu(), eager.cpu())
