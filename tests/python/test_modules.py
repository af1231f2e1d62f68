# PyTorch's ModuleInfo database (module_db) run on "cpu" and "neuron" and compared for float32 and
# bfloat16, modeled on test/test_modules.py TestModule.test_cpu_gpu_parity: each sample's module is
# built and seeded on CPU and deep-copied to neuron (so both start from the same parameters and
# buffers), the forward inputs are moved to neuron, and forward outputs, input gradients, parameter
# gradients and buffers (e.g. BatchNorm running stats) are compared with assert_close after a
# backward with the same random grad_output on both sides. Modules whose train and eval behaviour
# differ run in both modes. A bfloat16 sample that CPU itself cannot run is counted as "cpu
# unsupported", never as a pass. Every known failure is a strict xfail with its reason; modules
# whose results are random are excluded (see EXCLUDED). The counts per dtype are printed in the
# terminal summary.
import copy
import dataclasses
import itertools
import os
import warnings

import pytest
import torch
from conftest import summarize
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_flatten, tree_map

import openneuron  # noqa: F401  (registers the device)

DTYPES = (torch.float32, torch.bfloat16)
# Samples per (module, dtype, mode): all of them by default; OPENNEURON_MODULE_SAMPLES=N caps it
# for a quicker run.
MAX_SAMPLES = int(os.environ.get("OPENNEURON_MODULE_SAMPLES", "0")) or None

# module_db has no dropout or RReLU entries (their results are random by design); every module it
# does have is deterministic once its constructor runs on CPU (FractionalMaxPool gets its
# _random_samples buffer from the sample, Transformer samples pass dropout=0.0), so nothing is
# excluded today. A random module added to module_db later goes here with its reason, as in
# test_opinfo.py.
EXCLUDED: dict[str, str] = {}

# Known failures keyed (module, dtype), dtype None for every dtype: (the descs of the samples that
# fail, reason). Every other sample of the module must still pass, and the listed ones must fail:
# the test raises _KnownSampleFailure only when exactly those fail, and the strict xfail accepts
# nothing else.
XFAILS: dict[tuple[str, torch.dtype | None], tuple[tuple[str, ...], str]] = {
}


class _KnownSampleFailure(AssertionError):
    """Exactly the samples XFAILS lists failed (and no other)."""


# float32: assert_close's defaults (rtol=1.3e-6, atol=1e-5), as test_cpu_gpu_parity's
# assertEqual. Modules listed here legitimately differ by summation order.
_ATTENTION = {"atol": 1e-4, "rtol": 1e-4}
TOLERANCES: dict[str, dict[str, float]] = {
    # neuron runs attention as its own fused SDPA kernel, CPU its flash kernel: same math,
    # different summation order (as test_opinfo.py's SDPA/MHA tolerance). Measured against a
    # float64 run, neuron's in-projection weight grads are as close as CPU's.
    **dict.fromkeys(["nn.MultiheadAttention", "nn.TransformerEncoder",
                     "nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer",
                     "nn.Transformer"], _ATTENTION),
}

# bfloat16 has 8 significant bits (1 ulp is 2^-7 ~ 7.8e-3 relative): a different summation order
# or a float32 intermediate on one side moves a result by an ulp, and a backward pass chains
# several such roundings, so allow about two ulp (as test_opinfo.py's bfloat16 tolerance).
DTYPE_TOLERANCES = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
}


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _params():
    for info in module_db:
        if info.name in EXCLUDED:
            continue
        modes = (True, False) if info.train_and_eval_differ else (True,)
        for dtype, training in itertools.product(DTYPES, modes):
            # float32 for every module (test_cpu_gpu_parity's choice); bfloat16 where the module
            # claims it.
            if dtype != torch.float32 and dtype not in info.dtypes:
                continue
            xfail = XFAILS.get((info.name, dtype)) or XFAILS.get((info.name, None))
            marks = [pytest.mark.xfail(strict=True, raises=_KnownSampleFailure,
                                       reason=f"samples {', '.join(xfail[0])}: {xfail[1]}")
                     ] if xfail else []
            mode = "train" if training else "eval"
            yield pytest.param(info, dtype, training, id=f"{info.name}-{mode}-{_dtype_name(dtype)}",
                               marks=marks)


SUMMARY = (f"ModuleInfo compare cpu vs neuron, (module, mode) pairs ({MAX_SAMPLES or 'all'} "
           f"samples per module, mode and dtype; {len(EXCLUDED)} modules excluded: random "
           f"results):")


def _leaf_on(device):
    """Moves a tensor to `device` as a fresh leaf that keeps requires_grad, so input gradients
    are collected in .grad on both sides (samples may build inputs as non-leaf views)."""
    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        leaf = x.detach().clone() if device == "cpu" else x.detach().to(device)
        return leaf.requires_grad_(x.requires_grad)
    return move


def _to_cpu(x):
    return x.detach().to("cpu") if isinstance(x, torch.Tensor) else x


def _tensors(tree):
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _pin_auto_options(kwargs, dtype):
    """LinearCrossEntropyLoss's options="auto" resolve per device type by design: CPU picks
    acc_policy="accurate" with float32 accumulation for bfloat16, any other device "compact" with
    bfloat16 accumulation and a different chunk size. Pin both sides to CPU's pick so they run
    the same algorithm (an explicit policy is honoured on every device)."""
    from torch.nn.modules import linear_cross_entropy_options as lce

    opts = kwargs.get("options")
    if not isinstance(opts, lce.LinearCrossEntropyOptions):
        return kwargs
    auto = lce._AUTO_DEFAULTS.get(("cpu", dtype), lce._AUTO_FALLBACK)
    pinned = {}
    if opts.acc_policy == "auto":
        pinned["acc_policy"] = auto.acc_policy
        if opts.acc_dtype is None:
            pinned["acc_dtype"] = lce.LinearCrossEntropyOptions._resolve_auto_acc_dtype(
                dtype, torch.device("cpu"))
    if opts.chunking_method == "auto" and opts.batch_chunk_size is None:
        pinned["chunking_method"] = auto.chunking_method
    return {**kwargs, "options": dataclasses.replace(opts, **pinned)}


def _build(info, sample, dtype, training, cpu_args, cpu_kwargs):
    args = sample.constructor_input.args
    kwargs = _pin_auto_options(sample.constructor_input.kwargs, dtype)
    torch.manual_seed(0)
    module = info.module_cls(*args, **kwargs).to(dtype)
    module.train(training)
    if info.is_lazy:
        # Lazy parameters are created by the first forward; materialize them on CPU so the copy
        # starts from the same values (neuron's generator differs from CPU's by design).
        with torch.no_grad():
            module(*tree_map(_leaf_on("cpu"), cpu_args), **tree_map(_leaf_on("cpu"), cpu_kwargs))
    return module, copy.deepcopy(module).to("neuron")


def _compare(actual, expected, tol, what):
    torch.testing.assert_close(tree_map(_to_cpu, actual), tree_map(_to_cpu, expected),
                               equal_nan=True, check_device=False, **tol,
                               msg=lambda m: f"{what}: {m}")


def _run_sample(info, sample, dtype, training, tol):
    fwd = sample.forward_input
    c_args, c_kwargs = tree_map(_leaf_on("cpu"), (fwd.args, fwd.kwargs))
    n_args, n_kwargs = tree_map(_leaf_on("neuron"), (fwd.args, fwd.kwargs))
    try:
        c_module, n_module = _build(info, sample, dtype, training, fwd.args, fwd.kwargs)
        expected = c_module(*c_args, **c_kwargs)
        c_outs = [t for t in _tensors(expected) if t.requires_grad]
        g = torch.Generator().manual_seed(0)
        grads = [torch.randn(t.shape, generator=g).to(t.dtype) for t in c_outs]
        if c_outs:
            torch.autograd.backward(c_outs, grads)
    except RuntimeError:
        if dtype == torch.float32:
            raise
        return False  # CPU itself does not run this module in this dtype
    actual = n_module(*n_args, **n_kwargs)
    _compare(actual, expected, tol, "forward output")
    n_outs = [t for t in _tensors(actual) if t.requires_grad]
    assert len(n_outs) == len(c_outs), "outputs requiring grad differ"
    if n_outs:
        torch.autograd.backward(n_outs, [x.to("neuron") for x in grads])
    _compare([t.grad for t in _tensors((n_args, n_kwargs))],
             [t.grad for t in _tensors((c_args, c_kwargs))], tol, "input grads")
    for (name, n_p), (_, c_p) in zip(n_module.named_parameters(), c_module.named_parameters(),
                                     strict=True):
        _compare(n_p.grad, c_p.grad, tol, f"grad of parameter {name}")
    for (name, n_b), (_, c_b) in zip(n_module.named_buffers(), c_module.named_buffers(),
                                     strict=True):
        _compare(n_b, c_b, tol, f"buffer {name}")
    # NOTE: non_blocking copies to CPU are only complete after a synchronize, as on CUDA.
    torch.neuron.synchronize()
    return True


@pytest.mark.parametrize("info,dtype,training", list(_params()))
def test_module_cpu_parity(info, dtype, training, request):
    summarize(request, SUMMARY, _dtype_name(dtype), skipped_key="cpu unsupported")
    samples_seen = {"samples pass": 0, "samples fail (known or not)": 0,
                    "samples cpu unsupported": 0}
    request.node.user_properties.append(("db_extra", samples_seen))
    op_tol, dtype_tol = TOLERANCES.get(info.name, {}), DTYPE_TOLERANCES.get(dtype, {})
    tol = {k: max(op_tol.get(k, 0.0), dtype_tol.get(k, 0.0)) for k in {*op_tol, *dtype_tol}}
    torch.manual_seed(0)
    samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                      training=training)
    compared, failures = 0, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, sample in enumerate(itertools.islice(samples, MAX_SAMPLES)):
            try:
                ran = _run_sample(info, sample, dtype, training, tol)
            except Exception as e:  # noqa: BLE001  (every sample runs; failures reported below)
                failures.setdefault(sample.desc, []).append(f"sample {i} ({sample.desc!r}): {e}")
                samples_seen["samples fail (known or not)"] += 1
                continue
            samples_seen["samples pass" if ran else "samples cpu unsupported"] += 1
            compared += ran
    xfail = XFAILS.get((info.name, dtype)) or XFAILS.get((info.name, None))
    report = "\n\n".join(m for msgs in failures.values() for m in msgs)
    if failures and xfail and set(failures) == set(xfail[0]):
        raise _KnownSampleFailure(f"{info.name}: the known failures:\n{report}")
    if failures:
        raise AssertionError(f"{info.name}: {len(failures)} failing sample descs"
                             f"{f' (known: {xfail[0]})' if xfail else ''}:\n{report}")
    if not compared:
        pytest.skip(f"cpu unsupported: CPU raises for every {_dtype_name(dtype)} sample")
