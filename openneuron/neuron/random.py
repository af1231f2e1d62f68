# torch.neuron random-number state, mirroring torch.cuda.random: seeding (lazy until the runtime
# is initialized) and the 16-byte Philox-style state (seed, offset) of each device's default
# generator. The generator itself is C++ (csrc/aten/generator.cpp); this is only the Python face.
from collections.abc import Iterable, Sequence

import torch

from openneuron import _C

from .device import _get_device_index, _lazy_call, _lazy_init, current_device, device_count

__all__ = [
    "default_generators",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


class _DefaultGenerators(Sequence):
    """The default torch.Generator of each neuron device, indexed like torch.cuda's tuple.

    Indexing initializes the runtime (the generators are created by it).
    """

    def __init__(self) -> None:
        self._cache: dict[int, torch.Generator] = {}

    def __len__(self) -> int:
        return device_count()

    def __getitem__(self, idx):  # type: ignore[override]
        if isinstance(idx, slice):
            return tuple(self[i] for i in range(*idx.indices(len(self))))
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(f"neuron:{idx} has no default generator: {n} device(s) visible")
        _lazy_init()
        if idx not in self._cache:
            self._cache[idx] = _C._get_default_generator(idx)
        return self._cache[idx]

    def __repr__(self) -> str:
        return f"torch.neuron.default_generators(<{len(self)} generators>)"


default_generators = _DefaultGenerators()


def _generator(device) -> torch.Generator:
    if isinstance(device, str) and device == "neuron":
        device = None
    return default_generators[_get_device_index(device, optional=True)]


def get_rng_state(device: int | str | torch.device = "neuron") -> torch.Tensor:
    """The RNG state of a neuron device as a 16-byte uint8 CPU tensor (seed, offset)."""
    _lazy_init()
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """The RNG state of every neuron device."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "neuron") -> None:
    """Set the RNG state of a neuron device (from get_rng_state)."""
    with torch._C._DisableFuncTorch():
        new_state_copy = new_state.clone(memory_format=torch.contiguous_format)
    if isinstance(device, str) and device == "neuron":
        device = None

    def cb() -> None:
        _generator(device).set_state(new_state_copy)

    _lazy_call(cb)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Set the RNG state of every neuron device, in index order."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current neuron device's generator (deferred until initialization)."""
    seed = int(seed)

    def cb() -> None:
        default_generators[current_device()].manual_seed(seed)

    _lazy_call(cb, seed=True)


def manual_seed_all(seed: int) -> None:
    """Seed every neuron device's generator (deferred until initialization).

    torch.manual_seed calls this for the neuron device.
    """
    seed = int(seed)

    def cb() -> None:
        for i in range(device_count()):
            default_generators[i].manual_seed(seed)

    _lazy_call(cb, seed_all=True)


def seed() -> None:
    """Seed the current neuron device's generator with a non-deterministic number."""

    def cb() -> None:
        default_generators[current_device()].seed()

    _lazy_call(cb)


def seed_all() -> None:
    """Seed every neuron device's generator with the same non-deterministic number."""

    def cb() -> None:
        random_seed = None
        for i in range(device_count()):
            gen = default_generators[i]
            if random_seed is None:
                gen.seed()
                random_seed = gen.initial_seed()
            else:
                gen.manual_seed(random_seed)

    _lazy_call(cb)


def initial_seed() -> int:
    """The seed the current neuron device's generator was last seeded with."""
    _lazy_init()
    return default_generators[current_device()].initial_seed()
