# Memory tools: memory_summary as a table of the allocator's statistics, allocation-stack history
# (torch.neuron.memory._record_memory_history / _snapshot / _dump_snapshot in torch.cuda's
# format, readable by torch.cuda._memory_viz) and the automatic OPENNEURON_OOM_SNAPSHOT file.
# Statistics themselves are test_memory.py; the stack table is csrc/aten/origin_capture.cpp.
import pickle

import pytest
import torch
from torch.cuda import _memory_viz

from openneuron import _C

MiB = 1024 * 1024


@pytest.fixture
def history():
    """Allocation stacks recorded for the test, then off and forgotten."""
    torch.neuron.memory._record_memory_history("all")
    yield
    torch.neuron.memory._record_memory_history(None, clear_history=True)


def _block(snapshot: dict, t: torch.Tensor) -> tuple[dict, dict]:
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["address"] == t.data_ptr() and b["state"] == "active_allocated":
                return seg, b
    raise AssertionError(f"no allocated block at {t.data_ptr():#x}")


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


def test_memory_summary_matches_stats():
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:1")
    stats = torch.neuron.memory_stats(1)
    text = torch.neuron.memory_summary(1)
    row = next(line for line in text.splitlines() if line.startswith("| Allocations "))
    cells = [c.strip() for c in row.split("|")[2:6]]
    assert cells == [str(stats[f"allocation.all.{m}"]) for m in
                     ("current", "peak", "allocated", "freed")]
    assert "Out-of-memory errors" in text and "Allocation retries" in text
    del t


def test_snapshot_records_the_allocating_line(history):
    t = torch.empty(1000, dtype=torch.float32, device="neuron:2")  # ALLOC-SITE
    snap = torch.neuron.memory._snapshot()
    seg, b = _block(snap, t)
    assert b["size"] >= 4000 and b["requested_size"] == 4000
    assert seg["device"] == 2 and "stream" in seg and seg["segment_type"] in ("small", "large")
    names = [(f["filename"], f["line"], f["name"]) for f in b["frames"]]
    assert (__file__, _line_of("# ALLOC-SITE"), "test_snapshot_records_the_allocating_line") \
        in names
    assert len(snap["device_traces"]) == torch.neuron.device_count()


def test_snapshot_reports_the_stream():
    s = torch.neuron.Stream(device="neuron:1")
    with torch.neuron.stream(s):
        t = torch.empty(1000, device="neuron:1")
    seg, _ = _block(torch.neuron.memory._snapshot(), t)
    assert seg["stream"] == s.stream_id != torch.neuron.default_stream(1).stream_id
    del t


def test_freed_blocks_lose_their_stack(history):
    entries = _C._memory_history_entries()
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    addr = t.data_ptr()
    assert _C._memory_history_entries() == entries + 1
    del t
    torch.neuron.synchronize()
    assert _C._memory_history_entries() == entries
    blocks = [b for s in torch.neuron.memory._snapshot()["segments"] for b in s["blocks"]]
    assert not any(b["address"] == addr and b["state"] == "active_allocated" for b in blocks)
    assert all(b["frames"] == [] for b in blocks if b["state"] == "inactive")


def test_equal_stacks_share_one_entry_and_max_entries_caps(history):
    entries = _C._memory_history_entries()
    same = [torch.empty(256, device="neuron") for _ in range(50)]  # one line, one stack
    assert _C._memory_history_entries() == entries + 1
    torch.neuron.memory._record_memory_history("all", max_entries=entries + 1)
    extra = torch.empty(256, device="neuron")  # a new stack beyond the cap: no frames
    assert _C._memory_history_entries() == entries + 1
    assert _block(torch.neuron.memory._snapshot(), extra)[1]["frames"] == []
    assert _block(torch.neuron.memory._snapshot(), same[0])[1]["frames"]
    del same, extra


def test_history_off_records_nothing():
    torch.neuron.memory._record_memory_history(None, clear_history=True)
    assert not _C._memory_history_enabled()
    ts = [torch.empty(100 + i, device="neuron") for i in range(100)]
    assert _C._memory_history_entries() == 0  # no stack walked or kept per allocation
    snap = torch.neuron.memory._snapshot()
    assert all(_block(snap, t)[1]["frames"] == [] for t in ts)


def test_record_memory_history_rejects_bad_arguments():
    with pytest.raises(ValueError, match="enabled"):
        torch.neuron.memory._record_memory_history("sometimes")
    with pytest.raises(ValueError, match="max_entries"):
        torch.neuron.memory._record_memory_history("all", max_entries=0)
    assert not _C._memory_history_enabled()


def test_memory_snapshot_keeps_its_shape(history):
    t = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    segs = torch.neuron.memory_snapshot()
    assert segs == torch.neuron.memory._snapshot()["segments"]
    seg = next(s for s in segs if any(b["address"] == t.data_ptr() for b in s["blocks"]))
    assert {"device", "address", "total_size", "allocated_size", "stream", "is_large",
            "blocks"} <= seg.keys()
    assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
    del t


def test_dump_snapshot_is_a_loadable_pickle(history, tmp_path):
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:3")
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    _, b = _block(snap, t)
    assert b["size"] == 4 * MiB and b["requested_size"] == 3 * MiB
    assert any(f["filename"] == __file__ for f in b["frames"])
    # PyTorch's own viewers read it.
    assert "total_allocated" in _memory_viz.segsum(snap)
    assert "test_dump_snapshot_is_a_loadable_pickle" in _memory_viz.memory(
        snap, format_flamegraph=lambda lines: lines)
    del t


def test_out_of_memory_writes_a_snapshot(run_py, tmp_path):
    path = tmp_path / "oom.pickle"
    r = run_py("""
        import torch
        keep = torch.empty(40 * 1024 * 1024, dtype=torch.uint8, device="neuron:1")  # HOLDER
        try:
            torch.empty(100 * 1024 * 1024, dtype=torch.uint8, device="neuron:1")
        except torch.OutOfMemoryError as e:
            print("OOM:", str(e))
        print("after:", torch.ones(4, device="neuron:1").sum().item())
    """, env={"OPENNEURON_DEVICE_MEMORY": "64MiB", "OPENNEURON_OOM_SNAPSHOT": str(path)})
    assert r.returncode == 0, r.stderr
    oom = next(line for line in r.stdout.splitlines() if line.startswith("OOM:"))
    assert "neuron:1 out of memory" in oom and str(path) in oom
    assert "after: 4.0" in r.stdout
    with open(path, "rb") as f:
        snap = pickle.load(f)
    held = [b for s in snap["segments"] if s["device"] == 1 for b in s["blocks"]
            if b["state"] == "active_allocated"]
    assert any(b["requested_size"] == 40 * MiB and
               any(f["filename"] == "<string>" and f["line"] == 3 for f in b["frames"])
               for b in held), held
    oom_entry = snap["device_traces"][1][-1]
    assert oom_entry["action"] == "oom" and oom_entry["size"] == 100 * MiB


def test_out_of_memory_without_the_variable_writes_nothing(run_py, tmp_path):
    r = run_py("""
        import torch
        from openneuron import _C
        print("history:", _C._memory_history_enabled())
        try:
            torch.empty(100 * 1024 * 1024, dtype=torch.uint8, device="neuron:1")
        except torch.OutOfMemoryError as e:
            print("OOM:", str(e))
    """, env={"OPENNEURON_DEVICE_MEMORY": "64MiB", "OPENNEURON_OOM_SNAPSHOT": ""})
    assert r.returncode == 0, r.stderr
    assert "history: False" in r.stdout
    assert "snapshot" not in next(line for line in r.stdout.splitlines()
                                  if line.startswith("OOM:"))
