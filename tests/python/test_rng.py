# Random numbers on neuron: seeding reproduces every random op bitwise, get/set_rng_state round
# trips (16-byte Philox-style state: seed, offset), generator offsets, torch.manual_seed and
# fork_rng for device_type="neuron". The generator is csrc/aten/generator.*.
import pytest
import torch
import torch.nn.functional as F

RANDOM_OPS = {
    "rand": lambda: torch.rand(1000, device="neuron"),
    "randn": lambda: torch.randn(33, 7, device="neuron"),
    "randint": lambda: torch.randint(0, 100, (500,), device="neuron"),
    "dropout": lambda: F.dropout(torch.ones(1000, device="neuron"), p=0.3, training=True),
    "bernoulli": lambda: torch.bernoulli(torch.full((1000,), 0.5, device="neuron")),
    "normal_": lambda: torch.empty(1000, device="neuron").normal_(2.0, 3.0),
    "uniform_": lambda: torch.empty(1000, device="neuron").uniform_(-1, 1),
    "randperm": lambda: torch.randperm(100, device="neuron"),
}


@pytest.mark.parametrize("name", sorted(RANDOM_OPS))
def test_manual_seed_reproduces(name):
    op = RANDOM_OPS[name]
    torch.neuron.manual_seed(1234)
    a, a2 = op().cpu(), op().cpu()
    torch.neuron.manual_seed(1234)
    b, b2 = op().cpu(), op().cpu()
    assert torch.equal(a, b) and torch.equal(a2, b2)
    assert not torch.equal(a, a2), "consecutive draws must differ"
    torch.neuron.manual_seed(4321)
    assert not torch.equal(op().cpu(), a)


def test_distribution_sanity():
    torch.neuron.manual_seed(0)
    x = torch.rand(100_000, device="neuron").cpu()
    assert 0.0 <= x.min() and x.max() < 1.0
    assert abs(x.mean().item() - 0.5) < 0.01
    y = torch.randn(100_000, device="neuron").cpu()
    assert abs(y.mean().item()) < 0.02 and abs(y.std().item() - 1.0) < 0.02
    d = F.dropout(torch.ones(100_000, device="neuron"), p=0.25).cpu()
    assert abs((d == 0).float().mean().item() - 0.25) < 0.01
    assert set(d.unique().tolist()) <= {0.0, torch.tensor(1.0 / 0.75).item()}


def test_rng_state_round_trip():
    torch.neuron.manual_seed(7)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    assert state.numel() == 16
    a = torch.randn(100, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    b = torch.randn(100, device="neuron").cpu()
    assert torch.equal(a, b)
    assert torch.equal(torch.neuron.get_rng_state("neuron:0"), torch.neuron.get_rng_state(0))


def test_rng_state_all_round_trip():
    torch.neuron.manual_seed_all(11)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    a = [torch.rand(10, device=f"neuron:{i}").cpu() for i in range(len(states))]
    torch.neuron.set_rng_state_all(states)
    b = [torch.rand(10, device=f"neuron:{i}").cpu() for i in range(len(states))]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert torch.equal(a[0], a[1]), "manual_seed_all seeds every device alike"


def test_seed_per_device_is_independent():
    torch.neuron.manual_seed_all(5)
    with torch.neuron.device(1):
        torch.neuron.manual_seed(6)
        assert torch.neuron.initial_seed() == 6
    assert torch.neuron.initial_seed() == 5
    assert torch.neuron.default_generators[1].initial_seed() == 6


def test_generator_offset():
    gen = torch.neuron.default_generators[0]
    gen.manual_seed(3)
    assert gen.get_offset() == 0
    a = torch.rand(1000, device="neuron").cpu()
    offset = gen.get_offset()
    assert offset > 0
    b = torch.rand(1000, device="neuron").cpu()
    assert gen.get_offset() > offset
    gen.set_offset(offset)
    assert torch.equal(torch.rand(1000, device="neuron").cpu(), b)
    gen.set_offset(0)
    assert torch.equal(torch.rand(1000, device="neuron").cpu(), a)


def test_explicit_generator():
    g = torch.Generator(device="neuron")
    assert g.device.type == "neuron"
    g.manual_seed(99)
    a = torch.rand(100, device="neuron", generator=g).cpu()
    g.manual_seed(99)
    b = torch.rand(100, device="neuron", generator=g).cpu()
    assert torch.equal(a, b)
    with pytest.raises(RuntimeError):
        torch.rand(10, device="neuron", generator=torch.Generator())


def test_torch_manual_seed_seeds_neuron():
    torch.manual_seed(2024)
    assert torch.neuron.initial_seed() == 2024
    assert torch.neuron.default_generators[3].initial_seed() == 2024
    a = torch.randn(50, device="neuron").cpu()
    torch.manual_seed(2024)
    assert torch.equal(torch.randn(50, device="neuron").cpu(), a)


def test_seed_and_seed_all():
    torch.neuron.seed()
    s = torch.neuron.initial_seed()
    torch.neuron.seed_all()
    seeds = {torch.neuron.default_generators[i].initial_seed()
             for i in range(torch.neuron.device_count())}
    assert len(seeds) == 1
    assert s >= 0


def test_fork_rng_restores_state():
    torch.neuron.manual_seed(42)
    expected = torch.rand(20, device="neuron").cpu()
    torch.neuron.manual_seed(42)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.rand(100, device="neuron")
    assert torch.equal(torch.rand(20, device="neuron").cpu(), expected)


def test_seed_before_init_is_applied(run_py):
    r = run_py("""
        import torch
        torch.manual_seed(77)
        assert not torch.neuron.is_initialized()
        a = torch.rand(5, device="neuron").cpu()
        torch.neuron.manual_seed(77)
        b = torch.rand(5, device="neuron").cpu()
        print(torch.equal(a, b), torch.neuron.initial_seed())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "77"]


def test_torch_manual_seed_reproduces_dropout():
    x = torch.ones(1000, device="neuron")
    torch.manual_seed(8)
    a = F.dropout(x, p=0.5).cpu()
    torch.manual_seed(8)
    assert torch.equal(F.dropout(x, p=0.5).cpu(), a)


def test_identical_across_processes(run_py):
    code = """
        import hashlib, torch
        import torch.nn.functional as F
        torch.manual_seed(31)
        outs = [torch.rand(100, device="neuron"), torch.randn(100, device="neuron"),
                torch.randint(0, 9, (100,), device="neuron"),
                F.dropout(torch.ones(100, device="neuron"), 0.5),
                torch.bernoulli(torch.full((100,), 0.3, device="neuron")),
                torch.empty(100, device="neuron").normal_()]
        h = hashlib.sha256()
        for t in outs:
            h.update(t.cpu().numpy().tobytes())
        print(h.hexdigest())
    """
    first, second = run_py(code), run_py(code)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() and first.stdout == second.stdout
