# Streams: current/default stream, the stream() context, priorities, cross-stream ordering with
# wait_stream and record_stream, synchronize, real asynchrony (and NEURON_LAUNCH_BLOCKING=1),
# non_blocking copies from pinned memory. Events are test_events.py. Reference: torch.cuda.
import pytest
import torch

# Enqueues many small-but-not-trivial ops; the device work (64x64 matmuls) clearly outlasts
# the Python enqueue cost. Prints the query() result right after the loop, then the result.
_ASYNC_LOOP = """
    import torch
    a = torch.randn(64, 64, device="neuron") / 64
    b = torch.zeros(64, 64, device="neuron")
    torch.neuron.synchronize()
    s = torch.neuron.current_stream()
    for _ in range(10_000):
        b = b @ a
    print("query_after_loop", s.query())
    torch.neuron.synchronize()
    print("query_after_sync", s.query())
    print("finite", bool(torch.isfinite(b).all()))
"""


def test_current_and_default_stream():
    s = torch.neuron.current_stream()
    d = torch.neuron.default_stream()
    assert isinstance(s, torch.neuron.Stream) and isinstance(s, torch.Stream)
    assert s == d
    assert s.device == torch.device("neuron:0")
    assert torch.neuron.default_stream(1).device == torch.device("neuron:1")
    assert torch.neuron.current_stream("neuron:2").device_index == 2
    assert torch.accelerator.current_stream() == s


def test_stream_context_and_set_stream():
    default = torch.neuron.current_stream()
    s = torch.neuron.Stream()
    assert s != default and s.device == default.device
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        x = torch.ones(100, device="neuron") * 3
    assert torch.neuron.current_stream() == default
    s.synchronize()
    torch.testing.assert_close(x.cpu(), torch.full((100,), 3.0))
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == default
    torch.neuron.set_stream(s)
    try:
        assert torch.neuron.current_stream() == s
    finally:
        torch.neuron.set_stream(default)
    with s:  # the generic torch.Stream context manager
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == default


def test_stream_on_other_device_restores_both():
    s1 = torch.neuron.Stream(device=1)
    assert s1.device == torch.device("neuron:1")
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream() == s1
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)


def test_stream_priority_and_generic_stream():
    hi = torch.neuron.Stream(priority=-1)
    lo = torch.neuron.Stream(priority=0)
    assert hi.device == lo.device == torch.device("neuron:0")
    generic = torch.Stream(device="neuron:1")
    assert generic.device_type == torch.neuron.default_stream().device_type
    assert generic.device == torch.device("neuron:1")
    with torch.neuron.stream(hi):
        y = torch.arange(10.0, device="neuron") + 1
    hi.synchronize()
    assert hi.query()
    torch.testing.assert_close(y.cpu(), torch.arange(10.0) + 1)


def test_wait_stream_orders_work():
    producer = torch.neuron.Stream()
    consumer = torch.neuron.Stream()
    base = torch.randn(512, 512)
    with torch.neuron.stream(producer):
        x = base.to("neuron")
        for _ in range(20):
            x = x @ torch.eye(512, device="neuron") + 1
    consumer.wait_stream(producer)
    with torch.neuron.stream(consumer):
        y = x * 2
    consumer.synchronize()
    expected = base
    for _ in range(20):
        expected = expected @ torch.eye(512) + 1
    torch.testing.assert_close(y.cpu(), expected * 2)


def test_record_stream_keeps_block_alive():
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    n = 1 << 20
    x = torch.full((n,), 7.0, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        for _ in range(200):
            x.add_(0.0)
        y = x.sum()
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    # Without record_stream, this allocation on the default stream could reuse x's block and
    # overwrite it while `side` still reads it.
    z = torch.ones(n, device="neuron")
    if not side.query():  # side was still running when z was allocated: no reuse allowed
        assert z.data_ptr() != ptr
    side.synchronize()
    assert y.item() == 7.0 * n
    assert z.sum().item() == n


def test_synchronize_functions():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        t = torch.ones(1000, device="neuron").cumsum(0)
    s.synchronize()
    assert s.query()
    torch.neuron.synchronize()
    assert t[-1].item() == 1000


def test_asynchrony_is_real(run_py):
    r = run_py(_ASYNC_LOOP)
    assert r.returncode == 0, r.stderr
    assert "query_after_loop False" in r.stdout, r.stdout
    assert "query_after_sync True" in r.stdout
    assert "finite True" in r.stdout


def test_launch_blocking_is_synchronous(run_py):
    r = run_py(_ASYNC_LOOP, env={"NEURON_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert "query_after_loop True" in r.stdout, r.stdout


def test_non_blocking_copy_from_pinned():
    src = torch.randn(1 << 18).pin_memory()
    expected = src.clone()
    dst = src.to("neuron", non_blocking=True)
    back = torch.empty_like(src).pin_memory()
    back.copy_((dst * 2), non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(back, expected * 2)
    src2 = torch.arange(1000.0).pin_memory()
    out = torch.empty(1000, device="neuron")
    out.copy_(src2, non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(out.cpu(), torch.arange(1000.0))


@pytest.mark.parametrize("spin", ["10000", None])
def test_waiting_for_the_device_gives_back_the_threads_cpu_work_left(run_py, spin):
    """Parallel CPU work leaves an OpenMP pool on the Python thread; while it lives, libgomp
    counts more threads than cores and every team's barriers (the executors' too) sleep in the
    kernel after ~100 spins. With a bounded spin (GOMP_SPINCOUNT) a wait for the device that
    sleeps frees the pool; with libgomp's default spin a wait after a long one does (these
    waits: tens of ms of matrix products; a decode token's ~1 ms waits keep it: parallel.h, and
    the WorkQueue gtest for the short / long rule)."""
    r = run_py("""
        import os, time, torch, openneuron
        def named(name):  # threads with this name: the pool's inherit the Python thread's
            n = 0
            for t in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{t}/comm") as f:
                        n += f.read().strip() == name
                except OSError:
                    pass
            return n
        me = open("/proc/self/comm").read().strip()
        a = torch.randn(1024, 1024, device="neuron") / 32; torch.neuron.synchronize()
        before = named(me)
        x = torch.randn(2048, 2048); (x * 2).sum()
        with_pool = named(me)
        # Only a wait that sleeps releases: on a loaded host the device may finish before
        # the wait starts, so wait on fresh device work until the pool goes or 20 tries.
        for _ in range(20):
            for _ in range(4):
                a = torch.tanh(a @ a)
            torch.neuron.synchronize()
            deadline = time.monotonic() + 0.5
            while named(me) > before and time.monotonic() < deadline:
                time.sleep(0.01)
            if named(me) == before:
                break
        print(before, with_pool, named(me), torch.get_num_threads())
    """, env={"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": spin, "OMP_WAIT_POLICY": None})
    assert r.returncode == 0, r.stderr
    before, with_pool, after, threads = map(int, r.stdout.split())
    assert threads == 2 and with_pool == before + 1, r.stdout  # the CPU work made a pool
    assert after == before, r.stdout


def test_an_idle_executor_gives_back_its_threads(run_py):
    """A stream's executor that ran parallel work keeps an OpenMP pool (threads named as the
    executor); idle for 50 ms it frees it, so the host's own CPU work is not throttled by a
    quiet device (parallel.h); the next parallel work makes it again. Small pointwise ops never
    make one (they run on the executor alone: runtime::kMinParallelWork), though ATen's CPU
    kernel splits 48K elements over 2 threads."""
    r = run_py("""
        import os, time, torch, openneuron
        def named(prefix):
            n = 0
            for t in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{t}/comm") as f:
                        n += f.read().strip().startswith(prefix)
                except OSError:
                    pass
            return n
        small = torch.ones(48 * 1024, device="neuron")
        for _ in range(20):
            small = torch.tanh(small)
        torch.neuron.synchronize()
        after_small = named("neuron0")
        a = torch.randn(1024, 1024, device="neuron") / 32
        def busy():
            global a
            for _ in range(4):
                a = torch.tanh(a @ a)
            torch.neuron.synchronize()
            return named("neuron0")
        with_pool = busy()
        time.sleep(0.3)
        idle = named("neuron0")
        again = busy()
        time.sleep(0.3)
        print(after_small, with_pool, idle, again, named("neuron0"))
    """, env={"OMP_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stderr
    after_small, with_pool, idle, again, idle_again = map(int, r.stdout.split())
    assert after_small == 1, r.stdout  # the executor alone: the small ops made no pool
    assert with_pool == 2 and again == 2, r.stdout
    assert idle == 1 and idle_again == 1, r.stdout
