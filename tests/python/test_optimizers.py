# PyTorch's OptimizerInfo database (optim_db) run on "neuron" and "cpu" and compared for float32
# and bfloat16 parameters, modeled on test/test_optim.py (TestOptimRenewed.test_foreach_matches_
# forloop, test_fused_cpu_matches_cuda): every config of optim_info.optim_inputs_func, in each
# implementation the optimizer offers on neuron (for-loop, foreach, fused, capturable), runs a few
# steps on identical parameters with identical deterministic gradients, and after every step the
# parameters and every optimizer state tensor are compared with the CPU run of the same
# implementation (for capturable: CPU's for-loop, as CPU is not a capturable device). Every known
# failure is a strict xfail with its reason. The pass count per dtype and implementation is
# printed in the terminal summary.
import copy
import inspect
import itertools
import re
import warnings

import pytest
import torch
from conftest import summarize
from torch.testing._internal.common_optimizers import optim_db
from torch.utils._pytree import tree_map

import openneuron  # noqa: F401  (registers the device)

STEPS = 5
IMPLS = ("forloop", "foreach", "fused", "capturable", "capturable_foreach")
# Parameter dtypes: float32, and bfloat16 (pure low-precision training keeps parameters and
# optimizer state in bfloat16; the README claims fused / multi-tensor / per-parameter AdamW there).
DTYPES = (torch.float32, torch.bfloat16)

# Failures keyed (optimizer, config desc, impl, dtype); desc None for every config, dtype None
# for every dtype.
XFAILS: dict[tuple[str, str | None, str, torch.dtype | None], str] = {
    ("SparseAdam", None, "forloop", None): (
        "SparseAdam only takes sparse gradients, and sparse layouts are not supported on neuron "
        "(strided tensors only, as in test_opinfo.py): moving a sparse COO grad to neuron raises "
        "NotImplementedError for aten::_sparse_coo_tensor_with_dims_and_tensors on Sparseneuron"),
}
# The exception a strict xfail must raise, where another one would mean a different failure (for
# SparseAdam: CPU's run, which comes first, must not be what fails).
XFAIL_RAISES = {("SparseAdam", None, "forloop", None): NotImplementedError}

# float32: assert_close's defaults (rtol=1.3e-6, atol=1e-5). bfloat16: exact for the
# implementations CPU also runs (for-loop, foreach, fused): neuron runs ATen's CPU kernels or
# native kernels that round like them, so results agree bit for bit, and with 8 significant bits
# any tolerance would allow whole-ulp errors such as a scalar rounded differently.
TOLERANCES: dict[tuple[str, str], dict[str, float]] = {}

# Capturable runs compare with CPU's for-loop, a different op sequence (step count and bias
# corrections as device tensors, updates via tensor ops): bfloat16 has 8 significant bits (1 ulp is
# 2^-7 ~ 7.8e-3 relative), so allow about two ulp (as test_opinfo.py and test_modules.py).
CAPTURABLE_DTYPE_TOLERANCES = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
}
_EXACT = {"atol": 0.0, "rtol": 0.0}


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _slug(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_") or "default"


def _configs(info):
    """(desc, kwargs, impl) for every config the optimizer has on neuron.

    optim_inputs_func(device) gates its capturable configs on CUDA/XPU only, but torch.optim
    accepts capturable=True on PrivateUse1 (optimizer._get_capturable_supported_devices), so those
    are taken from the func's CUDA list and run on neuron as impl "capturable" (and
    "capturable_foreach" with foreach=True, as test_optim.py adds foreach to them). foreach and
    fused are added as test_optim.py's _get_optim_inputs_including_global_cliquey_kwargs does from
    supported_impls; fused is kept for every optimizer that has it because torch.optim allows
    fused on PrivateUse1 (_get_fused_kernels_supported_devices), even though optim_db's
    supports_fused_on does not list neuron. differentiable is not a numerics variant (it only lets
    autograd see through step()), so it is not run.
    """
    params = inspect.signature(info.optim_inputs_func).parameters
    assert "device" in params, f"{info.name}: optim_inputs_func takes no device"
    base = {i.desc: i.kwargs for i in info.optim_inputs_func(device="cpu")}
    for i in info.optim_inputs_func(device="neuron"):
        base.setdefault(i.desc, i.kwargs)
    cuda_only = {i.desc: i.kwargs for i in info.optim_inputs_func(device="cuda")
                 if i.desc not in base}
    for desc, kwargs in base.items():
        assert not kwargs.get("capturable"), f"{info.name} {desc}: capturable in a cpu config"
        yield desc, kwargs, "forloop"
        for impl in ("foreach", "fused"):
            if impl in info.supported_impls:
                yield desc, kwargs, impl
    if info.has_capturable_arg:
        for desc, kwargs in cuda_only.items():
            assert kwargs.get("capturable"), f"{info.name} {desc}: CUDA-only config that is " \
                                             "not capturable; decide how to run it"
            yield desc, kwargs, "capturable"
            if "foreach" in info.supported_impls:
                yield desc, kwargs, "capturable_foreach"


def _params():
    for info in optim_db:
        for (desc, kwargs, impl), dtype in itertools.product(_configs(info), DTYPES):
            keys = itertools.product([info.name], [desc, None], [impl], [dtype, None])
            key = next((k for k in keys if k in XFAILS), None)
            marks = [pytest.mark.xfail(strict=True, reason=XFAILS[key],
                                       raises=XFAIL_RAISES.get(key))] if key else []
            yield pytest.param(info, desc, kwargs, impl, dtype, marks=marks,
                               id=f"{info.name}-{_slug(desc)}-{impl}-{_dtype_name(dtype)}")


SUMMARY = f"OptimizerInfo compare neuron vs cpu, (optimizer, config) pairs ({STEPS} steps):"


def _make_params(info, dtype):
    """A small mixed set: matrix, vector, 3-d and 0-d tensors (the 0-d one catches scalar
    handling in foreach/fused lists). Muon only takes 2-d parameters, so it gets matrices."""
    shapes = [(4, 3), (3, 5), (2, 6)] if info.name == "Muon" else [(4, 3), (7,), (2, 3, 2), ()]
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _grads(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


def _impl_kwargs(info, kwargs, impl, device):
    """The config's kwargs for one side. CPU runs the same implementation (foreach: ATen's
    per-tensor slow path; fused: ATen's CPU fused kernels, which keep bfloat16 intermediates in
    float32 and so differ from the for-loop by design), except for the capturable ones, where it
    runs the for-loop: CPU is not a capturable device, and the Tensor-lr capturable configs are
    rejected with foreach=True and capturable=False."""
    kwargs = copy.deepcopy(kwargs)
    on_neuron = device == "neuron"
    if "foreach" in info.supported_impls:
        kwargs["foreach"] = impl == "foreach" or (on_neuron and impl == "capturable_foreach")
    if "fused" in info.supported_impls:
        assert "cpu" in info.supports_fused_on, f"{info.name}: no CPU fused reference"
        kwargs["fused"] = impl == "fused"
    if info.has_capturable_arg:
        kwargs["capturable"] = on_neuron and impl.startswith("capturable")
    return kwargs


def _closure_loss(params, weights):
    # LBFGS needs a closure it can call repeatedly (line search): a fixed quadratic whose
    # gradients depend on the parameters, so the line search has something to do.
    return sum(((p - 0.5) * w).pow(2).sum() + (p * w).sum() for p, w in zip(params, weights,
                                                                          strict=True))


def _to_cpu(x):
    return x.detach().to("cpu") if isinstance(x, torch.Tensor) else x


class _Run:
    def __init__(self, info, kwargs, impl, device, init):
        self.info, self.device = info, device
        self.params = [torch.nn.Parameter(p.clone().to(device)) for p in init]
        self.opt = info.optim_cls(self.params, **_impl_kwargs(info, kwargs, impl, device))
        self.weights = [w.to(device) for w in _grads(init, -1)]
        self.losses = []

    def step(self, step):
        if self.info.step_requires_closure:
            def closure():
                self.opt.zero_grad()
                loss = _closure_loss(self.params, self.weights)
                loss.backward()
                return loss
            self.losses.append(self.opt.step(closure).detach().to("cpu"))
            return
        for p, g in zip(self.params, _grads(self.params, step), strict=True):
            # SparseAdam takes only sparse gradients (of dense parameters).
            p.grad = (g.to_sparse() if self.info.only_supports_sparse_grads else g).to(self.device)
        self.opt.step()

    def state(self):
        """Parameters and optimizer state by parameter index, moved to CPU."""
        by_param = [self.opt.state.get(p, {}) for p in self.params]
        return tree_map(_to_cpu, {"params": list(self.params), "state": by_param,
                                 "losses": self.losses})


@pytest.mark.parametrize("info,desc,kwargs,impl,dtype", list(_params()))
def test_optimizer_cpu_parity(info, desc, kwargs, impl, dtype, request):
    summarize(request, SUMMARY, f"{_dtype_name(dtype)} {impl}")
    if impl.startswith("capturable"):
        tol = CAPTURABLE_DTYPE_TOLERANCES.get(dtype, {})
    else:
        tol = _EXACT if dtype == torch.bfloat16 else {}
    tol = TOLERANCES.get((info.name, impl), tol)
    init = _make_params(info, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = _Run(info, kwargs, impl, "cpu", init)
        neuron = _Run(info, kwargs, impl, "neuron", init)
        for step in range(STEPS):
            cpu.step(step)
            neuron.step(step)
            # NOTE: non_blocking copies to CPU are only complete after a synchronize, as on CUDA.
            torch.neuron.synchronize()
            expected, actual = cpu.state(), neuron.state()
            torch.testing.assert_close(
                actual, expected, check_device=False, equal_nan=True, **tol,
                msg=lambda m, s=step: f"{info.name} ({desc}, {impl}) after step {s + 1}: {m}")
