# Ops on a neuron device other than the current one: the native fast path (add/sub/mul/div and
# their in-place forms, fill_/zero_) and the asynchronous ATen path (relu, addcmul) make the
# tensor's device current only for the call (pointwise_fast.cpp, fallback.cpp skip the device
# guard when it already is), allocate there, and leave the caller's current device as it was.
import pytest
import torch

CASES = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul_scalar": lambda a, b: a * 0.5,
    "div": lambda a, b: a / (b + 1),
    "add_": lambda a, b: a.clone().add_(b),
    "mul_": lambda a, b: a.clone().mul_(b),
    "fill_": lambda a, b: a.clone().fill_(3.0),
    "zero_": lambda a, b: a.clone().zero_(),
    "relu": lambda a, b: torch.relu(a - 0.5),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.25),
}


@pytest.mark.parametrize("current,target", [(0, 1), (1, 0), (2, 2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_on_a_device_that_is_not_current(case, current, target):
    if torch.neuron.device_count() <= max(current, target):
        pytest.skip("needs 3 neuron devices (NEURON_RT_VISIBLE_CORES)")
    fn = CASES[case]
    a, b = torch.rand(100), torch.rand(100)
    ref = fn(a, b)
    before = torch.neuron.current_device()
    try:
        torch.neuron.set_device(current)
        got = fn(a.to(f"neuron:{target}"), b.to(f"neuron:{target}"))
        assert torch.neuron.current_device() == current, "the caller's device is restored"
        assert got.device == torch.device("neuron", target)
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
        # The result's memory is on the target device: further ops there see the values.
        torch.testing.assert_close((got * 2).cpu(), ref * 2, rtol=0, atol=0)
    finally:
        torch.neuron.set_device(before)
