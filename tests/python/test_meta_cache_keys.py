# The asynchronous ATen path sizes outputs from a cache keyed by the call's signature
# (meta_cache.cpp builds the key in a reused per-thread buffer): calls that alternate between
# signatures, and keys of very different lengths, must each get their own output geometry.
import pytest
import torch

CALLS = [
    lambda t: torch.relu(t),
    lambda t: torch.clamp(t, min=0.25),
    lambda t: torch.clamp(t, min=-0.25),  # differs only in a scalar
    lambda t: t.sum(0),
    lambda t: t.sum(-1, keepdim=True),
    lambda t: torch.cat([t] * 7, 0),  # a long key (a list of tensors)
    lambda t: torch.cat([t, t], -1),
    lambda t: t.t().contiguous(),  # strides in the key
    lambda t: torch.nn.functional.softmax(t, -1),
]


@pytest.mark.parametrize("rounds", [3])
def test_alternating_signatures_get_their_own_sizes(rounds):
    shapes = [(4, 5), (5, 4), (1, 9), (8, 1)]
    for _ in range(rounds):
        for shape in shapes:
            x = torch.randn(shape)
            xn = x.to("neuron")
            for call in CALLS:
                ref, got = call(x), call(xn)
                assert got.shape == ref.shape and got.stride() == ref.stride()
                torch.testing.assert_close(got.cpu(), ref)


def test_from_another_thread():
    import threading

    errors = []

    def worker():
        try:
            test_alternating_signatures_get_their_own_sizes(2)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    test_alternating_signatures_get_their_own_sizes(2)
    for t in threads:
        t.join()
    assert not errors, errors
