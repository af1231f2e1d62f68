# Results of functional ops on the asynchronous ATen path are copied from the CPU kernel's output
# into the device tensor on the executor (fallback.cpp: one memcpy when small, dense and of the
# same dtype, else ATen's copy_). Checked bit for bit against CPU across that boundary: sizes
# around ATen's grain size, empty outputs, several dtypes, conjugate inputs and multiple returns.
import pytest
import torch

GRAIN = 32768  # at::internal::GRAIN_SIZE


@pytest.mark.parametrize("n", [0, 1, 100, GRAIN - 1, GRAIN, GRAIN + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_unary_results_across_sizes(n, dtype):
    x = (torch.randn(n) * 10).to(dtype)
    for fn in (torch.relu, torch.abs, lambda t: torch.clamp(t, min=-2, max=3)):
        ref = fn(x)
        got = fn(x.to("neuron"))
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(got.cpu(), ref)


def test_complex_and_conjugate_inputs():
    z = torch.randn(50, dtype=torch.complex64)
    for x in (z, z.conj()):
        for fn in (torch.sgn, torch.exp, lambda t: t.abs()):
            ref = fn(x)
            got = fn(x.to("neuron"))
            assert torch.equal(got.cpu(), ref)


def test_multiple_returns_and_bool():
    x = torch.randn(6, 7)
    values, indices = torch.max(x.to("neuron"), dim=1)
    ref_v, ref_i = torch.max(x, dim=1)
    assert torch.equal(values.cpu(), ref_v) and torch.equal(indices.cpu(), ref_i)
    assert torch.equal(torch.logical_not(x.to("neuron") > 0).cpu(), torch.logical_not(x > 0))


def test_non_contiguous_result_layout():
    x = torch.randn(5, 6).t()  # transposed input: the CPU kernel's output keeps its strides
    got = torch.relu(x.to("neuron"))
    ref = torch.relu(x)
    assert got.stride() == ref.stride() and torch.equal(got.cpu(), ref)
