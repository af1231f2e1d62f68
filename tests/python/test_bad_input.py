# Bad input around training: each mistake gives a clear error (CUDA's where torch.cuda has one)
# and loses nothing: the process, the device, the tensors and the checkpoint file stay usable.
# Autocast with an unsupported dtype, GradScaler misuse, checkpoints mapped onto a device that
# does not exist (also in a process that sees fewer devices), device indices out of range,
# tensors on two devices in one op, and dtypes the device's kernels do not support.
import gc
import hashlib
import io
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

N_DEV = 4  # the default NEURON_RT_VISIBLE_CORES
BAD_INDEX = re.compile(r"(?i)invalid device index (neuron:)?9\b.*\b4\b")


def _model(device, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(device, dtype)


# ---------------------------------------------------------------------------------------------
# Autocast with a dtype the device does not support.
# NOTE: what happens is decided by torch.autocast's Python code. For CUDA, only bfloat16 on a
# device without it is an error; any other dtype is accepted as given. For CPU, XPU and
# PrivateUse1 backends (neuron), a dtype outside the backend's get_amp_supported_dtype() warns
# and disables autocast. Neuron gets the behaviour torch gives every non-CUDA device; the warning
# names the device and the supported dtypes.


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int8, torch.complex64])
def test_autocast_unsupported_dtype_warns_disables_and_trains_in_fp32(dtype):
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    grads = []
    for use_autocast in (True, False):
        model = _model("neuron")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast("neuron", dtype=dtype, enabled=use_autocast):
                assert not torch.is_autocast_enabled("neuron")
                out = model(x.to("neuron"))
                assert out.dtype == torch.float32
                loss = F.mse_loss(out, y.to("neuron"))
        loss.backward()
        grads.append([p.grad.cpu() for p in model.parameters()])
        msgs = [str(w.message) for w in caught]
        if use_autocast:
            assert any("In neuron autocast, but the target dtype is not supported. Disabling "
                       "autocast." in m and "torch.float16, torch.bfloat16" in m for m in msgs), msgs
        else:
            assert not msgs
    for a, b in zip(*grads, strict=True):  # the disabled region is exactly plain fp32
        assert torch.equal(a, b)
    assert torch.get_autocast_dtype("neuron") == torch.float16, "the default is restored"


def test_autocast_device_type_must_be_a_known_device():
    with pytest.raises(RuntimeError, match="device string: nueron"):
        torch.autocast("nueron")


# ---------------------------------------------------------------------------------------------
# GradScaler misuse: torch.amp.GradScaler's own errors, identical to the CPU (and CUDA) scaler.


def _scaled_backward(device, scaler, dtype=torch.float32):
    model = _model(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast(device, dtype=torch.float16, enabled=dtype == torch.float32):
        loss = model(torch.randn(2, 8, device=device, dtype=dtype)).float().sum()
    scaler.scale(loss).backward()
    return model, opt


def _misuse(device: str, case: str):
    """Runs one misuse on `device`; returns the exception (type and message) it raises."""
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8)
    try:
        if case == "unscale_twice":
            _, opt = _scaled_backward(device, scaler)
            scaler.unscale_(opt)
            scaler.unscale_(opt)
        elif case == "unscale_after_step":
            _, opt = _scaled_backward(device, scaler)
            scaler.step(opt)
            scaler.unscale_(opt)
        elif case == "step_twice":
            _, opt = _scaled_backward(device, scaler)
            scaler.step(opt)
            scaler.step(opt)
        elif case == "step_without_scale":
            model = _model(device)
            scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
        elif case == "update_without_scale":
            scaler.update()
        elif case == "step_without_grads":  # scale() ran, but no parameter has a gradient
            scaler.scale(torch.ones((), device=device))
            model = _model(device)
            scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
        elif case == "fp16_gradients":
            _, opt = _scaled_backward(device, scaler, dtype=torch.float16)
            scaler.step(opt)
        elif case == "new_scale_wrong_device":
            _scaled_backward(device, scaler)
            other = "cpu" if device != "cpu" else "neuron"
            scaler.update(new_scale=torch.full((1,), 2.0, device=other))
        elif case == "scale_non_tensor":
            scaler.scale(3.0)
    except Exception as e:  # noqa: BLE001 - returned for comparison
        return e
    return None


MISUSES = {
    "unscale_twice": (RuntimeError, r"unscale_\(\) has already been called on this optimizer"),
    "unscale_after_step": (RuntimeError, r"unscale_\(\) is being called after step\(\)"),
    "step_twice": (RuntimeError, r"step\(\) has already been called since the last update"),
    "step_without_scale": (AssertionError, r"Attempted step but _scale is None"),
    "update_without_scale": (AssertionError, r"Attempted update but _scale is None"),
    "step_without_grads": (AssertionError, r"No inf checks were recorded for this optimizer"),
    "fp16_gradients": (ValueError, r"Attempting to unscale FP16 gradients"),
    "new_scale_wrong_device": (AssertionError, r"new_scale should be a float or a 1-element"),
    "scale_non_tensor": (ValueError, r"outputs must be a Tensor or an iterable of Tensors"),
}


@pytest.mark.parametrize("case", sorted(MISUSES))
def test_grad_scaler_misuse_errors_like_cpu(case):
    kind, pattern = MISUSES[case]
    got = _misuse("neuron", case)
    ref = _misuse("cpu", case)
    assert isinstance(got, kind) and re.search(pattern, str(got)), repr(got)
    assert type(got) is type(ref) and str(got) == str(ref).replace("cpu", "neuron"), (got, ref)
    # nothing lost: the device still trains
    scaler = torch.amp.GradScaler("neuron", init_scale=2.0**8)
    model, opt = _scaled_backward("neuron", scaler)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert any(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before))


# ---------------------------------------------------------------------------------------------
# Checkpoints mapped onto devices that do not exist.

LOAD_ERROR = (r"Attempting to deserialize object on NEURON device {idx} but "
              r"torch\.neuron\.device_count\(\) is {count}\. Please use torch\.load with "
              r"map_location to map your storages to an existing device\.")


def _checkpoint(path, device="neuron:3"):
    model = _model(device)
    torch.save({"model": model.state_dict(), "step": 7}, path)
    return {k: v.cpu() for k, v in model.state_dict().items()}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_load_onto_missing_device_index(tmp_path):
    path = tmp_path / "ckpt.pt"
    ref = _checkpoint(path, "neuron:0")
    digest = _digest(path)
    for loc in ("neuron:7", torch.device("neuron", 7), {"neuron:0": "neuron:7"}):
        with pytest.raises(RuntimeError, match=LOAD_ERROR.format(idx=7, count=N_DEV)):
            torch.load(path, map_location=loc)
    assert _digest(path) == digest, "a failed load must not touch the file"
    for loc, dev in (("cpu", "cpu"), ("neuron:2", "neuron:2"), ("neuron", "neuron:0")):
        state = torch.load(path, map_location=loc)
        assert state["step"] == 7
        for k, v in state["model"].items():
            assert str(v.device) == dev and torch.equal(v.cpu(), ref[k])


def test_checkpoint_from_neuron3_in_a_process_with_one_device(tmp_path, run_py):
    path = tmp_path / "ckpt3.pt"
    ref = _checkpoint(path, "neuron:3")
    torch.save(ref, tmp_path / "ref.pt")
    digest = _digest(path)
    r = run_py(f"""
        import re, torch
        assert torch.neuron.device_count() == 1
        try:
            torch.load({str(path)!r})
        except RuntimeError as e:
            assert re.search({LOAD_ERROR.format(idx=3, count=1)!r}, str(e)), str(e)
            print("ERROR-OK")
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        for loc, dev in (("cpu", "cpu"), ("neuron", "neuron:0"), ({{"neuron:3": "neuron:0"}},
                                                                   "neuron:0")):
            state = torch.load({str(path)!r}, map_location=loc)
            assert state["step"] == 7
            for k, v in state["model"].items():
                assert str(v.device) == dev and torch.equal(v.cpu(), ref[k]), (k, loc)
        print("LOADS-OK")
        """, env={"NEURON_RT_VISIBLE_CORES": "0"})
    assert r.returncode == 0, r.stderr
    assert "ERROR-OK" in r.stdout and "LOADS-OK" in r.stdout
    assert _digest(path) == digest


def test_neuron_checkpoint_loads_on_cpu_without_the_backend(tmp_path, run_py):
    path = tmp_path / "ckpt.pt"
    ref = _checkpoint(path, "neuron:1")
    torch.save(ref, tmp_path / "ref.pt")
    r = run_py(f"""
        import torch
        state = torch.load({str(path)!r}, map_location="cpu")
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        assert all(torch.equal(state["model"][k], ref[k]) for k in ref)
        print("OK", state["step"])
        """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert "OK 7" in r.stdout


# ---------------------------------------------------------------------------------------------
# Device indices that do not exist.


def _allocated():
    gc.collect()
    for i in range(N_DEV):
        torch.neuron.synchronize(i)
    return [torch.neuron.memory_allocated(i) for i in range(N_DEV)]


def _raised(fn) -> Exception | None:
    """The exception fn raises (None if none), with its traceback dropped: the frames of the
    failed call must not keep its temporaries alive for the memory checks."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the caller
        return e.with_traceback(None)
    return None

BAD_DEVICE_CALLS = {
    "tensor.to": lambda: torch.ones(2).to("neuron:9"),
    "factory": lambda: torch.zeros(2, device="neuron:9"),
    "module.to": lambda: torch.nn.Linear(2, 2).to("neuron:9"),
    "set_device": lambda: torch.neuron.set_device(9),
    "device_context": lambda: torch.neuron.device(9).__enter__(),
    "synchronize": lambda: torch.neuron.synchronize(9),
    "get_device_properties": lambda: torch.neuron.get_device_properties(9),
    "memory_allocated": lambda: torch.neuron.memory_allocated(9),
    "Stream": lambda: torch.neuron.Stream(device=9),
    "Generator": lambda: torch.Generator(device="neuron:9"),
    "manual_seed_generator": lambda: torch.neuron.default_generators[9],
}


@pytest.mark.parametrize("case", sorted(BAD_DEVICE_CALLS))
def test_device_index_out_of_range(case):
    torch.neuron.set_device(1)
    try:
        allocated = _allocated()
        error = _raised(BAD_DEVICE_CALLS[case])
        assert isinstance(error, (RuntimeError, IndexError)), repr(error)
        if isinstance(error, RuntimeError):
            assert BAD_INDEX.search(error.args[0]), error
            assert "NEURON_RT_VISIBLE_CORES" in error.args[0]
        assert torch.neuron.current_device() == 1, "a failed call must not change the device"
        assert _allocated() == allocated
        assert torch.ones(2, device="neuron").add(1).cpu().tolist() == [2.0, 2.0]
    finally:
        torch.neuron.set_device(0)


def test_negative_device_index_is_refused_by_torch():
    with pytest.raises(RuntimeError, match="neuron:-1"):
        torch.ones(1, device="neuron:-1")
    torch.neuron.set_device(-1)  # a no-op, as torch.cuda.set_device(-1)
    assert torch.neuron.current_device() == 0


# ---------------------------------------------------------------------------------------------
# Tensors on two devices in one op: CUDA's "Expected all tensors to be on the same device".

SAME_DEVICE = r"Expected all tensors to be on the same device, but "


def _two_device_ops():
    a = torch.ones(2, 2, device="neuron:0")
    b = torch.ones(2, 2, device="neuron:1")
    w = torch.ones(3, 2, device="neuron:1", requires_grad=True)
    return {
        "add": lambda: a + b,
        "add_": lambda: a.clone().add_(b),
        "out=": lambda: torch.add(a, a, out=torch.empty(2, 2, device="neuron:1")),
        "mm": lambda: a @ b,
        "linear": lambda: F.linear(a, w),
        "cat": lambda: torch.cat([a, b]),
        "where": lambda: torch.where(a > 0, a, b),
        "index_put_": lambda: a.clone().index_put_((torch.tensor([0], device="neuron:1"),),
                                                   torch.tensor(5.0, device="neuron:0")),
        "cpu_operand": lambda: a + torch.ones(2, 2),
        "cross_entropy": lambda: F.cross_entropy(a, torch.zeros(2, dtype=torch.long,
                                                                 device="neuron:1")),
    }


TWO_DEVICE_CASES = ["add", "add_", "out=", "mm", "linear", "cat", "where", "index_put_",
                    "cpu_operand", "cross_entropy"]


def test_two_device_cases_listed():
    assert sorted(TWO_DEVICE_CASES) == sorted(_two_device_ops())


@pytest.mark.parametrize("case", TWO_DEVICE_CASES)
def test_two_devices_in_one_op(case):
    op = _two_device_ops()[case]
    before = _allocated()
    error = _raised(op)
    assert isinstance(error, RuntimeError) and re.match(SAME_DEVICE, str(error)), repr(error)
    msg = str(error)
    assert "neuron:0" in msg and ("neuron:1" in msg or "cpu" in msg), msg
    assert _allocated() == before, "the failed op leaves no allocation behind"


def test_two_devices_allowed_where_cuda_allows_them():
    a = torch.arange(4.0, device="neuron:0")
    b = torch.zeros(4, device="neuron:1")
    b.copy_(a)  # cross-device copies are allowed, as between CUDA devices
    assert b.device == torch.device("neuron:1") and b.cpu().tolist() == [0, 1, 2, 3]
    assert (a + torch.tensor(1.0)).cpu().tolist() == [1, 2, 3, 4]  # 0-dim CPU operand
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # 0-dim on another device: no (CUDA)
        a + torch.tensor(1.0, device="neuron:1")


# ---------------------------------------------------------------------------------------------
# Dtypes: every dtype CPU computes with works on neuron; what CPU's kernels do not implement
# raises the kernel's error naming the op, the dtype and the line that enqueued it (at the next
# sync point, as a CUDA kernel error does; at the call with NEURON_LAUNCH_BLOCKING=1), and the
# device keeps working.


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.float64,
                                   torch.int8, torch.uint8, torch.int16, torch.int32])
def test_other_dtypes_compute_like_cpu(dtype):
    a = (torch.arange(12).view(3, 4) % 5).to(dtype)
    b = (torch.arange(12).view(4, 3) % 3).to(dtype)
    for fn in (lambda x, y: x @ y, lambda x, y: (x.t() + y).sum(0), lambda x, y: x.flip(0) * 2):
        ref = fn(a, b)
        got = fn(a.to("neuron"), b.to("neuron"))
        assert got.dtype == ref.dtype and torch.equal(got.cpu(), ref)


UNSUPPORTED = {
    "mm_uint32": (lambda d: torch.ones(2, 2, dtype=torch.uint32, device=d)
                  @ torch.ones(2, 2, dtype=torch.uint32, device=d), "aten::mm", "UInt32"),
    "mm_bool": (lambda d: torch.ones(2, 2, dtype=torch.bool, device=d)
                @ torch.ones(2, 2, dtype=torch.bool, device=d), "aten::mm", "Bool"),
    "add_float8": (lambda d: torch.ones(2, device=d).to(torch.float8_e4m3fn)
                   + torch.ones(2, device=d).to(torch.float8_e4m3fn), "aten::add",
                   "Float8_e4m3fn"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_dtype_without_a_kernel(case):
    fn, op, dtype_name = UNSUPPORTED[case]
    with pytest.raises((NotImplementedError, RuntimeError), match=f"not implemented for "
                       f"'{dtype_name}'"):
        fn("cpu")
    keep = torch.arange(4.0, device="neuron")
    with pytest.raises(RuntimeError) as info:
        fn("neuron").cpu()
    msg = str(info.value)
    assert op in msg and f"not implemented for '{dtype_name}'" in msg, msg
    assert "test_bad_input.py" in msg, "the error names the line that enqueued the op"
    assert (keep * 2).cpu().tolist() == [0, 2, 4, 6], "the device keeps working"


def test_dtype_without_a_kernel_raises_at_the_call_with_launch_blocking(run_py):
    r = run_py("""
        import torch
        a = torch.ones(2, 2, dtype=torch.uint32, device="neuron")
        try:
            a @ a
        except RuntimeError as e:
            print("RAISED AT CALL:", e)
        print(torch.ones(2, device="neuron").add(1).cpu().tolist())
        """, env={"NEURON_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert "RAISED AT CALL:" in r.stdout and "not implemented for 'UInt32'" in r.stdout
    assert "[2.0, 2.0]" in r.stdout


def test_mixed_dtypes_in_a_matmul_are_refused_like_cpu():
    a, w = torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        F.linear(a, w)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        F.linear(a.to("neuron"), w.to("neuron")).cpu()


def test_bad_input_leaves_no_pending_error():
    # After all the failures above in this process, a fresh training step works.
    model = _model("neuron")
    opt = torch.optim.AdamW(model.parameters())
    loss = model(torch.randn(4, 8, device="neuron")).square().mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss).item()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    assert all(v.device.type == "neuron" for v in torch.load(buf).values())
