# Serialization of neuron tensors: torch.save tags storages neuron:N, torch.load restores them on
# that device, map_location moves them (to cpu, to another neuron device, from a CPU checkpoint
# to neuron), module state_dict round trips. Values compared against the CPU originals.
import io

import torch


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True, **load_kwargs)


def test_save_load_keeps_device():
    cpu = torch.randn(4, 5)
    for dev in ("neuron:0", "neuron:2"):
        loaded = _roundtrip(cpu.to(dev))
        assert loaded.device == torch.device(dev)
        torch.testing.assert_close(loaded.cpu(), cpu, rtol=0, atol=0)


def test_map_location_cpu():
    cpu = torch.arange(12.0).reshape(3, 4)
    loaded = _roundtrip(cpu.to("neuron:1"), map_location="cpu")
    assert loaded.device.type == "cpu"
    assert torch.equal(loaded, cpu)


def test_map_location_other_neuron_device():
    cpu = torch.randn(8)
    loaded = _roundtrip(cpu.to("neuron:0"), map_location="neuron:1")
    assert loaded.device == torch.device("neuron:1")
    assert torch.equal(loaded.cpu(), cpu)
    moved = _roundtrip(cpu.to("neuron:0"), map_location={"neuron:0": "neuron:3"})
    assert moved.device == torch.device("neuron:3")


def test_cpu_checkpoint_to_neuron():
    cpu = {"w": torch.randn(3, 3), "step": 7, "ints": torch.arange(5)}
    loaded = _roundtrip(cpu, map_location="neuron")
    assert loaded["w"].device.type == "neuron"
    assert loaded["ints"].dtype == torch.int64
    assert torch.equal(loaded["w"].cpu(), cpu["w"])
    assert torch.equal(loaded["ints"].cpu(), cpu["ints"])
    assert loaded["step"] == 7


def test_views_share_storage_after_load():
    base = torch.arange(10.0, device="neuron")
    a, b = _roundtrip([base, base[2:5]])
    b.fill_(-1)
    assert torch.equal(a.cpu()[2:5], torch.full((3,), -1.0))
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_module_state_dict_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2))
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    model = model.to("neuron")
    sd = _roundtrip(model.state_dict())
    assert all(v.device.type == "neuron" for v in sd.values())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2)).to("neuron")
    fresh.load_state_dict(sd)
    for k, v in fresh.state_dict().items():
        assert v.device.type == "neuron"
        assert torch.equal(v.cpu(), ref[k]), k
    x = torch.randn(3, 4)
    fresh.eval()
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                    torch.nn.Linear(8, 2))
    cpu_model.load_state_dict(ref)
    cpu_model.eval()
    torch.testing.assert_close(fresh(x.to("neuron")).cpu(), cpu_model(x))


def test_save_whole_module_and_load_to_cpu():
    model = torch.nn.Linear(3, 3).to("neuron:1")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded.weight.device == torch.device("neuron:1")
    buf.seek(0)
    on_cpu = torch.load(buf, weights_only=False, map_location="cpu")
    assert torch.equal(on_cpu.weight, model.weight.cpu())


def test_storage_neuron_method():
    s = torch.UntypedStorage(16)
    s.fill_(3)
    n = s.neuron(2)
    assert n.device == torch.device("neuron:2")
    assert n.is_neuron
    assert n.cpu().tolist() == [3] * 16
