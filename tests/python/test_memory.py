# Device memory: exact allocator statistics (allocated/reserved/peaks), empty_cache,
# memory_stats keys as torch.cuda's, memory_summary, mem_get_info, snapshots, out-of-memory
# errors and pinned host memory. The allocator itself is csrc/runtime/caching_allocator.*.
import pytest
import torch

MiB = 1024 * 1024


def _settled(dev: int = 0) -> int:
    torch.neuron.synchronize(dev)
    return torch.neuron.memory_allocated(dev)


def test_allocated_exact_growth_and_return_to_baseline():
    base = _settled()
    a = torch.empty(MiB // 4, dtype=torch.float32, device="neuron")  # 1 MiB
    assert torch.neuron.memory_allocated() == base + MiB
    b = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")  # 4 MiB
    assert torch.neuron.memory_allocated() == base + 5 * MiB
    c = torch.empty(1024, dtype=torch.float32, device="neuron")  # 4 KiB
    assert torch.neuron.memory_allocated() == base + 5 * MiB + 4096
    del a, b, c
    assert _settled() == base


def test_requested_bytes_exact_for_odd_sizes():
    torch.neuron.synchronize()
    key = "requested_bytes.all.current"
    before = torch.neuron.memory_stats()[key]
    t = torch.empty(1001, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_stats()[key] == before + 1001
    assert torch.neuron.memory_allocated() >= 1001
    del t
    torch.neuron.synchronize()
    assert torch.neuron.memory_stats()[key] == before


def test_allocated_after_compute_returns_to_baseline():
    base = _settled()
    x = torch.randn(256, 256, device="neuron")
    for _ in range(5):
        x = torch.tanh(x @ x.T / 256)
    x.sum().item()
    del x
    assert _settled() == base


def test_memory_does_not_grow_with_queued_work():
    # As on CUDA, a tensor freed while queued work still reads it goes back to its stream's
    # pool at once (stream order makes the reuse safe): peak memory must not depend on how far
    # Python runs ahead of the device.
    a = torch.rand(MiB, device="neuron")  # 4 MiB
    base = _settled()
    torch.neuron.reset_peak_memory_stats()
    for _ in range(200):
        a = a * 1.0001
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() <= base + 4 * MiB


def test_freed_block_reused_while_queued_work_reads_it():
    # Stream-ordered reuse gives the right values even when the block is recycled immediately.
    x = torch.arange(MiB, dtype=torch.float32, device="neuron")
    y = x * 2
    del x
    z = torch.full((MiB,), 7.0, device="neuron")  # may reuse x's block at once
    torch.testing.assert_close(y.cpu(), torch.arange(MiB, dtype=torch.float32) * 2)
    assert z.sum().item() == 7.0 * MiB


def test_allocated_per_device():
    base0, base1 = _settled(0), _settled(1)
    t = torch.empty(MiB, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(1) == base1 + MiB
    assert torch.neuron.memory_allocated("neuron:1") == base1 + MiB
    assert torch.neuron.memory_allocated(0) == base0
    del t
    assert _settled(1) == base1


def test_peaks_and_reset():
    base = _settled()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="neuron")
    del t
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() == base + 8 * MiB
    assert torch.neuron.max_memory_reserved() >= base + 8 * MiB
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base


def test_accumulated_reset():
    t = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    del t
    torch.neuron.synchronize()
    assert torch.neuron.memory_stats()["allocated_bytes.all.allocated"] > 0
    torch.neuron.reset_accumulated_memory_stats()
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["allocated_bytes.all.freed"] == 0


def test_reserved_at_least_allocated_and_empty_cache():
    torch.neuron.synchronize()
    torch.neuron.empty_cache()
    t = torch.empty(16 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated() >= 16 * MiB
    del t
    torch.neuron.synchronize()
    cached = torch.neuron.memory_reserved()
    assert cached >= 16 * MiB  # the block stays cached after del
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() <= cached - 16 * MiB
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()


def test_memory_stats_keys_match_cuda():
    t = torch.empty(10, device="neuron")
    stats = torch.neuron.memory_stats()
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "allocation", "segment",
                 "active", "inactive_split", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{kind}.{pool}.{metric}" in stats, f"{kind}.{pool}.{metric}"
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"):
        assert key in stats
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    nested = torch.neuron.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    del t


def test_memory_summary():
    t = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    text = torch.neuron.memory_summary()
    assert "neuron:0" in text
    for label in ("Allocated memory", "Reserved memory", "Allocations", "from large pool",
                  "Device capacity"):
        assert label in text
    widths = {len(line) for line in text.splitlines()}
    assert len(widths) == 1, "table rows have different widths"
    short = torch.neuron.memory_summary(device=1, abbreviated=True)
    assert "neuron:1" in short and "from large pool" not in short
    del t


def test_mem_get_info():
    free, total = torch.neuron.mem_get_info()
    assert 0 < free <= total == torch.neuron.get_device_properties(0).total_memory
    assert torch.accelerator.get_memory_info(0) == (free, total)


def test_memory_snapshot():
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:2")
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == 2]
    assert segments
    blocks = [b for s in segments for b in s["blocks"] if b["allocated"]]
    assert any(b["size"] >= 3 * MiB and b["address"] == t.data_ptr() for b in blocks)
    for seg in segments:
        assert {"address", "total_size", "allocated_size", "stream", "is_large"} <= seg.keys()
    del t


def test_out_of_memory_is_reported_and_recoverable(run_py):
    r = run_py("""
        import torch
        big = 100 * 1024 * 1024
        try:
            torch.empty(big, dtype=torch.uint8, device="neuron:1")
        except torch.OutOfMemoryError as e:
            print("OOM:", str(e).splitlines()[0])
        else:
            print("no error")
        t = torch.ones(1024, device="neuron:1")
        print("after:", (t + 1).sum().item())
        print("ooms:", torch.neuron.memory_stats(1)["num_ooms"])
    """, env={"OPENNEURON_DEVICE_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stderr
    oom = next(line for line in r.stdout.splitlines() if line.startswith("OOM:"))
    assert "neuron:1" in oom
    assert "100.0 MiB" in oom  # the request
    assert "in use" in oom and "64.0 MiB" in oom  # what is in use, of which capacity
    assert "after: 2048.0" in r.stdout
    assert "ooms: 1" in r.stdout


def test_out_of_memory_in_process():
    total = torch.neuron.get_device_properties(3).total_memory
    base = _settled(3)
    with pytest.raises(torch.OutOfMemoryError, match="neuron:3"):
        torch.empty(total + MiB, dtype=torch.uint8, device="neuron:3")
    assert _settled(3) == base
    assert torch.ones(4, device="neuron:3").sum().item() == 4


def test_pinned_memory():
    t = torch.arange(1000.0)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned()
    assert p.device.type == "cpu"
    torch.testing.assert_close(p, t)
    e = torch.empty(10, pin_memory=True)
    assert e.is_pinned()
    stats = torch.neuron.host_memory_stats()
    assert stats["allocated_bytes"] >= 4000
    n = p.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(n.cpu(), t)
