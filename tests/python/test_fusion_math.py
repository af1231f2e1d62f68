# The fused kernels' math hooks (csrc/aten/fusion/math_hooks.cpp: MKL VML called directly
# for tanh/exp/log/cos/erf/sqrt, ATen's stub for rsqrt/reciprocal) must give torch's CPU bits:
# every exponent and sign with a spread of mantissas (4M float32 bit patterns), specials
# (+-0, +-inf, NaNs, subnormals, extremes) and random values, alone, inside a chain, and with
# sizes that leave a partial last chunk. NaN payloads are compared too (bit patterns, not ==).
# bf16/fp16: every one of the 65536 values, for ops fused in those dtypes.
import pytest
import torch

NEURON = "neuron"
OPS = ["tanh", "exp", "log", "cos", "erf", "sqrt", "rsqrt", "reciprocal"]


@pytest.fixture
def fusion():
    torch.neuron.set_fusion_enabled(False)
    torch.neuron.reset_fusion_stats()
    yield
    torch.neuron.set_fusion_enabled(False)


def _patterns() -> torch.Tensor:
    # 4M bit patterns spread over the whole 32-bit space (odd stride: every exponent, both
    # signs, varied mantissas), plus specials and random normals.
    bits = torch.arange(0, 1 << 32, 1021, dtype=torch.int64)
    bits = torch.where(bits >= (1 << 31), bits - (1 << 32), bits).to(torch.int32)
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 0.5, 88.72, -87.33,
         9.0, -9.0, 3.4028235e38, -3.4028235e38, 1.1754944e-38, 1e-45, -1e-45, 1e-40,
         1e-30, 15.0, -15.0, 0.00048828125],
        dtype=torch.float32)
    nan_payloads = torch.tensor([0x7FC00001, -0x00400001, 0x7F800001, -0x007FFFFF],
                                dtype=torch.int32).view(torch.float32)
    g = torch.Generator().manual_seed(0)
    rnd = torch.randn(1 << 20, generator=g) * torch.logspace(-8, 3, 1 << 20)
    return torch.cat([bits.view(torch.float32), specials, nan_payloads, rnd])


_X = None


def patterns() -> torch.Tensor:
    global _X
    if _X is None:
        _X = _patterns()
    return _X


def _bits_equal(x: torch.Tensor, ref: torch.Tensor, got: torch.Tensor, what: str) -> None:
    r, o = ref.view(torch.int32), got.cpu().view(torch.int32)
    bad = (r != o).nonzero()
    if bad.numel():
        i = int(bad[0])
        pytest.fail(f"{what}: {bad.numel()} of {r.numel()} differ; first at {i}: "
                    f"x={x[i].item()!r} cpu={ref[i].item()!r} fused={got.cpu()[i].item()!r}")


@pytest.mark.parametrize("op", OPS)
def test_hook_bitwise_equals_cpu(fusion, op):
    x = patterns()
    f = getattr(torch, op)
    ref = f(x)
    xd = x.to(NEURON)
    torch.neuron.set_fusion_enabled(True)
    got = f(xd)
    torch.neuron.fusion_flush()
    got = got.cpu()
    stats = torch.neuron.fusion_stats()
    assert stats["kernels"] >= 1 and stats["ops_fused"] >= 1, stats
    _bits_equal(x, ref, got, op)


@pytest.mark.parametrize("op", ["tanh", "exp", "erf"])
@pytest.mark.parametrize("n", [1, 1023, 1025, 4097, 100003])
def test_hook_in_chain_partial_chunks(fusion, op, n):
    # (x * 0.75 + 0.25) -> op -> * 2: the hook runs on interpreter chunks, last one partial.
    x = patterns()[-n:].clone()
    f = getattr(torch, op)
    ref = f(x * 0.75 + 0.25) * 2
    xd = x.to(NEURON)
    torch.neuron.set_fusion_enabled(True)
    got = f(xd * 0.75 + 0.25) * 2
    torch.neuron.fusion_flush()
    assert torch.neuron.fusion_stats()["ops_fused"] >= 4
    _bits_equal(x, ref, got, f"{op} chain n={n}")


HOOKED_LOWP = ["tanh", "exp", "log", "cos", "sqrt", "reciprocal"]  # fused in bf16/fp16 too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_lowp_every_value_bitwise_equals_cpu(fusion, op, dtype):
    # All 65536 bf16/fp16 bit patterns: a fused bf16/fp16 op must give eager's bits on every
    # CPU and MKL code path (float32 VML then rounding did not: sqrt on a CPU without
    # AVX512-FP16, reproduced here with MKL_ENABLE_INSTRUCTIONS=SSE4_2).
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    f = getattr(torch, op)
    ref = f(x * 1)
    xd = x.to(NEURON)
    torch.neuron.set_fusion_enabled(True)
    got = f(xd * 1)
    torch.neuron.fusion_flush()
    if op in HOOKED_LOWP:
        assert torch.neuron.fusion_stats()["ops_fused"] >= 2
    r, o = ref.view(torch.int16), got.cpu().view(torch.int16)
    bad = (r != o).nonzero()
    # NaN payloads may differ only where both are NaN (ATen's own kernels canonicalize some)
    bad = [int(i) for i in bad.flatten() if not (ref[int(i)].isnan() and got.cpu()[int(i)].isnan())]
    assert not bad, (f"{op} {dtype}: {len(bad)} of 65536 differ; first x={x[bad[0]].item()!r} "
                     f"cpu={ref[bad[0]].item()!r} fused={got.cpu()[bad[0]].item()!r}")
