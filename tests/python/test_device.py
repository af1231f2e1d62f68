# Device registration and selection: autoload, generated methods, torch.accelerator, device
# count from NEURON_RT_VISIBLE_CORES, config errors, device context manager, properties and the
# `openneuron ls` CLI. Reference behaviour: torch.cuda. Memory, streams, RNG have their own files.
import subprocess
import sys

import pytest
import torch
from conftest import REPO


def test_autoload_registers_on_plain_import_torch(run_py):
    r = run_py("""
        import sys, torch
        assert "openneuron" in sys.modules
        assert torch._C._get_privateuse1_backend_name() == "neuron"
        t = torch.ones(2)
        print(hasattr(torch, "neuron"), hasattr(t, "is_neuron"), t.is_neuron)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "False"]


def test_autoload_disabled_then_import_openneuron_registers(run_py):
    r = run_py("""
        import torch
        print(hasattr(torch, "neuron"))
        import openneuron
        print(hasattr(torch, "neuron"), torch.ones(1).neuron().device)
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "neuron:0"]


def test_import_torch_survives_a_broken_extension(run_py):
    r = run_py("""
        import sys, warnings
        import importlib.abc

        class Broken(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "openneuron._C":
                    raise ImportError("simulated: undefined symbol in _C")

        sys.meta_path.insert(0, Broken())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
            import openneuron
        print(hasattr(torch, "neuron"), openneuron.is_registered(), torch.ones(2).sum().item())
        print("WARN:", " ".join(str(w.message) for w in caught))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "False False 2.0"
    assert "simulated: undefined symbol" in r.stdout
    assert "make build" in r.stdout


def test_import_openneuron_before_torch(run_py):
    r = run_py("""
        import openneuron
        import torch
        print(openneuron.is_registered(), torch.neuron.device_count())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "4"]


def test_forked_child_after_init_is_bad_fork(run_py):
    r = run_py("""
        import os, torch
        torch.ones(1, device="neuron")
        pid = os.fork()
        if pid == 0:
            try:
                bad = torch.neuron._is_in_bad_fork()
                torch.neuron.init()
                os._exit(3)
            except RuntimeError as e:
                os._exit(0 if bad and "forked subprocess" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), torch.neuron._is_in_bad_fork())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["child", "0", "False"]


def test_import_openneuron_after_autoload_is_noop():
    import importlib

    import openneuron

    neuron_module = torch.neuron
    importlib.import_module("openneuron")
    openneuron._autoload()
    assert openneuron.is_registered()
    assert torch.neuron is neuron_module
    assert openneuron.__version__


def test_generated_methods(device):
    t = torch.arange(6.0)
    n = t.neuron()
    assert n.is_neuron and not t.is_neuron
    assert n.device == device
    torch.testing.assert_close(n.cpu(), t)
    assert t.neuron(1).device == torch.device("neuron:1")

    m = torch.nn.Linear(3, 2)
    assert m.neuron() is m
    assert all(p.device == device for p in m.parameters())

    s = torch.UntypedStorage(8).neuron()
    assert s.is_neuron and s.device == device


def test_accelerator_is_neuron():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.get_device_module("neuron") is torch.neuron


def test_default_device_count_is_four():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 4


def test_visible_cores_sets_device_count(run_py):
    r = run_py("""
        import torch
        print(torch.neuron.device_count(), torch.accelerator.device_count())
    """, env={"NEURON_RT_VISIBLE_CORES": "0-1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "2"]


@pytest.mark.parametrize("var,value", [
    ("NEURON_RT_VISIBLE_CORES", "zero-to-three"),
    ("OPENNEURON_DEVICE_MEMORY", "lots"),
    # Every other variable is read by the same settings module (runtime/config.cpp).
    ("OPENNEURON_FALLBACK", "loud"),
    ("OPENNEURON_ISA", "avx1024"),
    ("TORCH_NEURONX_ENABLE_CONCATENATION", "maybe"),
    ("OPENNEURON_PROFILER_MAX_EVENTS", "many"),
])
def test_invalid_config_import_works_use_raises(run_py, var, value):
    r = run_py("""
        import torch
        print("imported", torch.neuron.is_available(), torch.neuron.device_count())
        try:
            torch.ones(1, device="neuron")
        except RuntimeError as e:
            print("ERROR:", e)
        try:
            torch.neuron.init()
        except RuntimeError as e:
            print("INIT ERROR:", e)
    """, env={var: value})
    assert r.returncode == 0, r.stderr
    assert "imported False 0" in r.stdout
    for prefix in ("ERROR:", "INIT ERROR:"):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(prefix))
        assert var in line and value in line, line


def test_invalid_device_index():
    with pytest.raises(RuntimeError, match=r"neuron:7.*4 neuron device"):
        torch.neuron.set_device(7)
    with pytest.raises(RuntimeError, match="neuron:7"):
        torch.neuron.get_device_properties(7)
    with pytest.raises(RuntimeError, match="neuron"):
        torch.ones(1, device="neuron:7")
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")


def test_set_device_and_context_manager():
    assert torch.neuron.current_device() == 0
    try:
        torch.neuron.set_device(1)
        assert torch.neuron.current_device() == 1
        assert torch.ones(1, device="neuron").device == torch.device("neuron:1")
        with torch.neuron.device(2):
            assert torch.neuron.current_device() == 2
            assert torch.ones(1, device="neuron").device.index == 2
            with torch.neuron.device("neuron:3"):
                assert torch.neuron.current_device() == 3
            with torch.neuron.device(torch.device("neuron", 0)):
                assert torch.neuron.current_device() == 0
            assert torch.neuron.current_device() == 2
        assert torch.neuron.current_device() == 1
        with torch.neuron.device(None), torch.neuron.device(-1):
            assert torch.neuron.current_device() == 1
        t = torch.ones(1, device="neuron:3")
        with torch.neuron.device_of(t):
            assert torch.neuron.current_device() == 3
        with torch.neuron.device_of(torch.ones(1)):
            assert torch.neuron.current_device() == 1
    finally:
        torch.neuron.set_device(0)
    assert torch.neuron.current_device() == 0


def test_accelerator_device_index_follows_set_device():
    try:
        torch.accelerator.set_device_index(2)
        assert torch.neuron.current_device() == 2
        assert torch.accelerator.current_device_index() == 2
    finally:
        torch.neuron.set_device(0)


def test_properties():
    assert torch.neuron.is_initialized()
    props = torch.neuron.get_device_properties(0)
    assert isinstance(props.name, str) and props.name
    assert props.total_memory > 0
    assert props.cores >= 1
    assert repr(props)
    assert torch.neuron.get_device_name() == props.name
    assert torch.neuron.get_device_name("neuron:1") == torch.neuron.get_device_properties(1).name
    assert torch.neuron.mem_get_info(0)[1] == props.total_memory


def test_synchronize_accepts_device_forms():
    torch.ones(4, device="neuron:1").add_(1)
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.neuron.synchronize("neuron:1")
    torch.neuron.synchronize(torch.device("neuron:1"))
    torch.accelerator.synchronize()


def test_amp_dtypes():
    assert torch.neuron.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()


def test_module_surface_for_distributed():
    # What FSDP2 / DeviceMesh / DDP / checkpointing look up via getattr(torch, "neuron").
    for name in ("Stream", "Event", "current_stream", "stream", "set_stream", "synchronize",
                 "current_device", "device_count", "is_available", "device", "get_rng_state",
                 "set_rng_state", "manual_seed_all", "_is_in_bad_fork", "_lazy_init",
                 "default_generators", "set_device"):
        assert hasattr(torch.neuron, name), name


def _openneuron_cli() -> list[str]:
    exe = REPO / ".venv" / "bin" / "openneuron"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "openneuron.cli"]


def test_cli_ls():
    r = subprocess.run(_openneuron_cli() + ["ls"], check=False, capture_output=True, text=True,
                       cwd=REPO, env={"PATH": "/usr/bin:/bin", "NEURON_RT_VISIBLE_CORES": "0-2",
                                      "OPENNEURON_FALLBACK": "silent"},
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "OPENNEURON_FALLBACK=silent" in r.stdout  # every variable that is set is listed
    for i in range(3):
        assert f"neuron:{i}" in r.stdout
    assert "neuron:3" not in r.stdout
    assert "CAPACITY" in r.stdout and "CORES" in r.stdout
    assert "NEURON_RT_VISIBLE_CORES=0-2" in r.stdout
    assert "this process" in r.stdout


def test_cli_ls_invalid_config():
    r = subprocess.run(_openneuron_cli() + ["ls"], check=False, capture_output=True, text=True,
                       cwd=REPO, env={"PATH": "/usr/bin:/bin", "NEURON_RT_VISIBLE_CORES": "abc"},
                       timeout=300)
    assert r.returncode != 0
    assert "NEURON_RT_VISIBLE_CORES" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_help():
    r = subprocess.run(_openneuron_cli() + ["--help"], check=False, capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0
    assert "ls" in r.stdout
