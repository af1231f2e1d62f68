# The PyTorch profiler on neuron: torch.profiler.profile(activities=[CPU, PrivateUse1]) records
# device ops (name, device, stream, duration) through the kineto plugin of
# csrc/aten/profiler.cpp; key_averages() shows device time per op; export_chrome_trace writes
# valid JSON with one row per device stream ("neuron:0 stream 0"); the legacy
# torch.autograd.profiler.profile(use_device="neuron") path times ops with device events.
# Reference: the same program on CPU, and the same program on neuron without the profiler.
import itertools
import json
import math
import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _stats():
    return torch.neuron.profiler.trace_stats()


def _base(name):
    """Op name without its overload: device events carry the kernel the device ran
    ("aten::tanh.out" for torch.tanh on the asynchronous ATen path)."""
    return name.split(".")[0]


def _dev_names(prof):
    return [_base(e.name) for e in torch.neuron.profiler.device_events(prof)]


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    ).to(device)


def _step(model, x):
    out = model(x)
    loss = out.square().mean()
    loss.backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters()]


def _export(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        return json.load(f)  # valid JSON or this raises


def _device_events(trace):
    return [
        e for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")
    ]


def _row_names(trace, name):
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == name
    }


def test_registered_and_off_by_default():
    assert torch.neuron.profiler.is_available()
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()
    x = torch.randn(100, device="neuron")
    for _ in range(50):
        x = x + 1
    torch.neuron.synchronize()
    assert _stats()["records"] == 0 and _stats()["sessions"] == 0


def test_profiled_results_match_unprofiled_and_cpu():
    x_cpu = torch.randn(16, 32)
    out_ref, grads_ref = _step(_model("cpu"), x_cpu)
    out_plain, grads_plain = _step(_model("neuron"), x_cpu.to("neuron"))
    with profile(activities=ACTIVITIES) as prof:
        out_prof, grads_prof = _step(_model("neuron"), x_cpu.to("neuron"))
    # Backward ops (run by autograd's device thread) are attributed too.
    avg = {e.key: e for e in prof.key_averages()}
    for op in ("aten::addmm", "aten::threshold_backward", "ReluBackward0"):
        assert avg[op].device_time_total > 0, op
    assert torch.equal(out_prof.cpu(), out_plain.cpu())
    for gp, gq in zip(grads_prof, grads_plain):
        assert torch.equal(gp.cpu(), gq.cpu())
    torch.testing.assert_close(out_prof.cpu(), out_ref)
    for gp, gr in zip(grads_prof, grads_ref):
        torch.testing.assert_close(gp.cpu(), gr)


def test_key_averages_have_device_time_for_neuron_ops():
    a = torch.randn(128, 128, device="neuron")
    b = torch.randn(128, 128, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            c = torch.relu(a @ b + 1)
    assert torch.equal(c.cpu(), torch.relu(a.cpu() @ b.cpu() + 1))
    avg = {e.key: e for e in prof.key_averages()}
    for op in ("aten::mm", "aten::add", "aten::relu"):
        assert op in avg, sorted(avg)
        assert avg[op].device_time_total > 0, op
        assert avg[op].count >= 3
    # Host-only ops have no device time.
    assert avg["aten::empty"].device_time_total == 0
    # The device events themselves: one per work item, on neuron:0, positive durations.
    dev = torch.neuron.profiler.device_events(prof)
    names = [_base(e.name) for e in dev]
    assert names.count("aten::mm") >= 3, names
    assert all(e.device_index == 0 for e in dev)
    assert all(e.time_range.end >= e.time_range.start for e in dev)
    assert sum(e.time_range.end - e.time_range.start for e in dev) > 0
    assert "neuron" in prof.key_averages().table(sort_by="device_time_total").lower()


def test_chrome_trace_has_device_rows_ordered_within_the_window(tmp_path):
    a = torch.randn(96, 96, device="neuron")
    torch.neuron.synchronize()
    t0 = time.time_ns()
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(4):
            a = torch.tanh(a @ a)
        h = a.sum().item()  # a sync point inside the window
    t1 = time.time_ns()
    assert math.isfinite(h)
    trace = _export(prof, tmp_path)
    base = trace.get("baseTimeNanoseconds", 0)
    dev = _device_events(trace)
    names = {_base(e["name"]) for e in dev}
    assert {"aten::tanh", "aten::mm"} <= names, names
    assert any(e["cat"] == "gpu_memcpy" for e in dev), names  # the .item() copy
    threads = _row_names(trace, "thread_name")
    procs = _row_names(trace, "process_name")
    rows = {(e["pid"], e["tid"]) for e in dev}
    assert len(rows) == 1  # all on neuron:0's current stream
    (pid, tid), = rows
    assert pid == 0 and threads[(pid, tid)] == f"neuron:0 stream {tid}"
    assert procs[(0, 0)] == "neuron:0"
    by_row = {}
    for e in dev:
        assert (e["pid"], e["tid"]) in threads
        assert e["dur"] >= 0
        start_ns = base + e["ts"] * 1000
        assert t0 - 1000 <= start_ns and start_ns + e["dur"] * 1000 <= t1 + 1000
        by_row.setdefault((e["pid"], e["tid"]), []).append(e)
    for row in by_row.values():
        row.sort(key=lambda e: e["ts"])
        for prev, cur in itertools.pairwise(row):  # one stream: one item at a time, in order
            assert prev["ts"] + prev["dur"] <= cur["ts"] + 0.01
    # Each device op is linked to the host op that enqueued it.
    cpu_ids = {
        e["args"].get("External id")
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    }
    linked = [e for e in dev if _base(e["name"]) == "aten::tanh"]
    assert linked and all(e["args"]["External id"] in cpu_ids for e in linked)
    # ... through a launch event inside that host op, where the flow arrow starts.
    host_ops = {
        e["args"]["External id"]: e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    }
    launches = {
        e["args"]["External id"]: e
        for e in trace["traceEvents"]
        if e.get("name") == "neuron enqueue"
    }
    flow_starts = {
        (e["pid"], e["tid"], e["ts"]): e["id"] for e in trace["traceEvents"] if e.get("ph") == "s"
    }
    flow_ends = {
        (e["pid"], e["tid"], e["ts"]): e["id"] for e in trace["traceEvents"] if e.get("ph") == "f"
    }
    assert len(set(flow_starts.values())) == len(flow_starts)  # one arrow per launch
    for e in linked:
        corr = e["args"]["External id"]
        launch, op = launches[corr], host_ops[corr]
        assert (launch["pid"], launch["tid"]) == (op["pid"], op["tid"])
        # 1 us slack: PyTorch stamps host ops with its approximate (TSC-based) clock
        assert op["ts"] - 1 <= launch["ts"] <= op["ts"] + op["dur"] + 1
        assert launch["ts"] <= e["ts"]  # enqueued before it ran
        # The arrow: from the launch event to the kernel.
        start = flow_starts[(launch["pid"], launch["tid"], launch["ts"])]
        assert flow_ends[(e["pid"], e["tid"], e["ts"])] == start


def test_rows_per_device_and_stream(tmp_path):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices (NEURON_RT_VISIBLE_CORES)")
    side = torch.neuron.Stream(device="neuron:0")
    x0 = torch.randn(64, device="neuron:0")
    x1 = torch.randn(64, device="neuron:1")
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        y0 = x0 * 2
        with torch.neuron.stream(side):
            z0 = torch.sigmoid(x0)
        y1 = x1 - 3
        torch.neuron.synchronize(0)
        torch.neuron.synchronize(1)
    torch.testing.assert_close(y1.cpu(), x1.cpu() - 3)
    torch.testing.assert_close(z0.cpu(), torch.sigmoid(x0.cpu()))
    assert torch.equal(y0.cpu(), x0.cpu() * 2)
    trace = _export(prof, tmp_path)
    dev = _device_events(trace)
    where = {_base(e["name"]): (e["pid"], e["tid"]) for e in dev}
    assert where["aten::mul"][0] == 0 and where["aten::sub"][0] == 1, where
    assert where["aten::sigmoid"][0] == 0
    assert where["aten::sigmoid"][1] != where["aten::mul"][1]  # its own stream row
    threads = _row_names(trace, "thread_name")
    procs = _row_names(trace, "process_name")
    for pid, tid in set(where.values()):
        assert threads[(pid, tid)] == f"neuron:{pid} stream {tid}"
        assert procs[(pid, 0)] == f"neuron:{pid}"


def test_cpu_only_profiling_records_no_device_events():
    x = torch.randn(64, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = x + 1
        assert _stats()["sessions"] == 0  # the device trace stays off
    assert torch.equal(y.cpu(), x.cpu() + 1)
    assert torch.neuron.profiler.device_events(prof) == []
    assert any(e.key == "aten::add" for e in prof.key_averages())


def test_device_activity_alone():
    x = torch.randn(64, device="neuron")
    with profile(activities=[ProfilerActivity.PrivateUse1]) as prof:
        y = torch.exp(x)
    torch.testing.assert_close(y.cpu(), torch.exp(x.cpu()))
    assert "aten::exp" in _dev_names(prof)


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_repeated_sessions_each_see_their_own_ops():
    x = torch.randn(64, device="neuron")
    torch.neuron.synchronize()  # else randn's kernel may run inside the first window
    traces = []

    def ready(p):
        traces.append(_dev_names(p))

    # Steps alternate warm-up (not recorded) and active (recorded): exp, sin | ceil, cos | ...
    sched = schedule(wait=0, warmup=1, active=1, repeat=3)
    with profile(activities=ACTIVITIES, schedule=sched, on_trace_ready=ready) as prof:
        for warm, op in ((torch.exp, torch.sin), (torch.ceil, torch.cos), (torch.neg, torch.abs)):
            warm(x)
            torch.neuron.synchronize()
            prof.step()
            y = op(x)
            prof.step()
    torch.testing.assert_close(y.cpu(), torch.abs(x.cpu()))
    assert traces == [["aten::sin"], ["aten::cos"], ["aten::abs"]]
    # And plain back-to-back sessions.
    for op, name in ((torch.neg, "aten::neg"), (torch.floor, "aten::floor")):
        with profile(activities=ACTIVITIES) as p:
            op(x)
        assert _dev_names(p) == [name]
    assert _stats()["records"] == 0 and _stats()["sessions"] == 0


def test_nested_profile_leaves_nothing_behind():
    # PyTorch runs one kineto session per process: a nested torch.profiler.profile takes over
    # the outer one (as on CUDA). Whatever it records, the device trace must end off and empty,
    # and the next session must work.
    x = torch.randn(64, device="neuron")
    with profile(activities=ACTIVITIES):
        x + 1
        with profile(activities=ACTIVITIES):
            x * 2
        x - 1
    assert _stats()["records"] == 0 and _stats()["sessions"] == 0
    with profile(activities=ACTIVITIES) as prof:
        torch.sqrt(x.abs())
    names = _dev_names(prof)
    assert "aten::sqrt" in names and "aten::abs" in names


def test_no_leak_over_many_sessions():
    x = torch.randn(32, device="neuron")
    torch.neuron.synchronize()
    for _ in range(20):
        with profile(activities=ACTIVITIES) as prof:
            for _ in range(20):
                x = x * 1.0001
        assert len(torch.neuron.profiler.device_events(prof)) == 20
        assert _stats()["records"] == 0
    assert _stats()["sessions"] == 0


def test_legacy_profiler_use_device_neuron():
    a = torch.randn(128, 128, device="neuron")
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        c = torch.relu(a @ a)
    torch.testing.assert_close(c.cpu(), torch.relu(a.cpu() @ a.cpu()))
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::mm"].device_time_total > 0
    assert _stats()["sessions"] == 0


def test_buffer_bound_and_drop_count(run_py):
    r = run_py(
        """
        import torch
        from torch.profiler import ProfilerActivity, profile
        x = torch.randn(16, device="neuron")
        torch.neuron.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
            for _ in range(40):
                x = x + 1
        dev = torch.neuron.profiler.device_events(p)
        s = torch.neuron.profiler.trace_stats()
        print(len(dev), s["dropped"], s["records"], s["sessions"])
        assert torch.equal(x.cpu(), x.cpu())
        """,
        # one work item per add: adaptive eager (make test-fusion) would fuse the 40 adds
        env={"OPENNEURON_PROFILER_MAX_EVENTS": "5", "TORCH_NEURONX_ENABLE_CONCATENATION": None},
    )
    assert r.returncode == 0, r.stderr
    n, dropped, records, sessions = map(int, r.stdout.split()[-4:])
    # 40 adds (+ bookkeeping items such as the profiler's closing synchronize)
    assert n == 5 and dropped >= 35 and records == 0 and sessions == 0


def test_profiler_does_not_change_device_type_of_host_events():
    x = torch.randn(64, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        x + 1
    host = [e for e in prof.events() if e.name == "aten::add"]
    assert host and all(e.device_type == DeviceType.CPU for e in host)


def test_fused_kernels_of_adaptive_eager_are_profiled(run_py):
    r = run_py(
        """
        import torch
        from torch.profiler import ProfilerActivity, profile
        x = torch.randn(1000, device="neuron")
        torch.neuron.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
            v = ((x * 2 + 1).relu() - 3).sum().item()
        ref = ((x.cpu() * 2 + 1).relu() - 3).sum().item()
        assert v == ref, (v, ref)
        names = [e.name for e in torch.neuron.profiler.device_events(p)]
        assert "adaptive_eager::fused" in names, names
        avg = {e.key: e for e in p.key_averages()}
        assert avg["aten::sum"].device_time_total > 0
        print("ok")
        """,
        env={"TORCH_NEURONX_ENABLE_CONCATENATION": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout
    # Several device ops launched under one host op: no flow-id collisions.
    assert "duplicate flow" not in r.stderr


def test_async_error_in_profiled_region_is_raised_and_next_session_works():
    x = torch.randn(4, device="neuron")
    idx = torch.tensor([10], device="neuron")
    torch.neuron.synchronize()
    # The device error is the user's: raised at PyTorch's closing synchronize, not swallowed.
    with pytest.raises(RuntimeError, match="index_select"), profile(activities=ACTIVITIES):
        torch.index_select(x, 0, idx)  # fails on the device, asynchronously
    # PyTorch leaves its profiler enabled after raising in __exit__ (as on CUDA); the next
    # session takes over and ends clean.
    with profile(activities=ACTIVITIES) as prof:
        y = x * 3
    assert torch.equal(y.cpu(), x.cpu() * 3)
    assert "aten::mul" in _dev_names(prof)
    assert _stats()["records"] == 0 and _stats()["sessions"] == 0
    assert not torch._C._autograd._profiler_enabled()
