# Ops ATen leaves to accelerators, or whose CPU kernel lacks a dtype CUDA has: neuron follows
# CUDA's documented semantics (README "Accelerator-only ATen paths"). The fused RNN cells are
# test_recurrent_modules.py's.
import pytest
import torch

import openneuron


def _paths(op: str) -> set[str]:
    return {r.path for r in openneuron.ops_report(print_table=False) if r.op == op}


def _histc_int_reference(x: torch.Tensor, bins: int, lo: int, hi: int) -> torch.Tensor:
    """CUDA's histc for integer input: int64 bin arithmetic, data range when min == max."""
    v = x.reshape(-1).long()
    if lo == hi:
        if v.numel():
            lo, hi = v.min().item(), v.max().item()
        if lo == hi:
            lo, hi = lo - 1, hi + 1
    keep = (v >= lo) & (v <= hi)
    b = ((v - lo) * bins // (hi - lo)).clamp(0, bins - 1)[keep]
    return torch.bincount(b, minlength=bins).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (49, 0, 49), (7, -2, 50), (5, 0, 0)])
def test_histc_integer_input_counts_like_cuda(device, dtype, bins, lo, hi):
    # Fix: histc on integer tensors (CPU's histogram kernel raises "not implemented for 'Int'";
    # CUDA counts them). Mixtral/Qwen-MoE's grouped_mm experts call histc on int32 expert ids.
    lo = max(lo, 0) if dtype == torch.uint8 else lo  # uint8 holds no negative bound
    g = torch.Generator().manual_seed(bins)
    x = torch.randint(0 if dtype == torch.uint8 else -5, 60, (257,), generator=g, dtype=dtype)
    openneuron.ops_report(print_table=False, reset=True)
    got = torch.histc(x.to(device), bins=bins, min=lo, max=hi)
    assert got.device == device and got.dtype == dtype
    assert torch.equal(got.cpu(), _histc_int_reference(x, bins, lo, hi))
    assert "sync" not in _paths("aten::histc") and "fallback" not in _paths("aten::histc")


def test_histc_integer_constant_and_empty_input(device):
    x = torch.full((6,), 3, dtype=torch.int32)
    assert torch.equal(torch.histc(x.to(device), bins=3).cpu(), _histc_int_reference(x, 3, 0, 0))
    e = torch.empty(0, dtype=torch.int64)
    assert torch.equal(torch.histc(e.to(device), bins=4).cpu(), torch.zeros(4, dtype=torch.int64))


def test_histc_integer_bad_range_raises_clear_error(device):
    x = torch.arange(5, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"histc: max must be larger than min.*neuron"):
        torch.histc(x, bins=4, min=3, max=1)


def test_histc_out_integer_input(device):
    x = torch.randint(0, 10, (50,), dtype=torch.int32, generator=torch.Generator().manual_seed(4))
    out = torch.empty(0, dtype=torch.int32, device=device)
    res = torch.histc(x.to(device), bins=5, min=0, max=9, out=out)
    assert res is out and out.shape == (5,)
    assert torch.equal(out.cpu(), _histc_int_reference(x, 5, 0, 9))
    with pytest.raises(RuntimeError, match=r"histc: out has dtype Float.*Int"):
        torch.histc(x.to(device), bins=5, out=torch.empty(5, device=device))
    f = torch.randn(50)
    fo = torch.empty(0, device=device)
    torch.histc(f.to(device), bins=5, min=-1, max=1, out=fo)
    assert torch.equal(fo.cpu(), torch.histc(f, bins=5, min=-1, max=1))
