# PyTorch's OpInfo database (op_db) run on "cpu" and "neuron" and compared for float32, bfloat16,
# float16, int64 and bool (every dtype CPU supports for the op), modeled on test/test_ops.py
# TestCommon.test_compare_cpu: samples are generated on CPU, moved to neuron, and results moved
# back are compared with assert_close. Every known failure is a strict xfail with its reason; ops
# whose results are random or uninitialized are excluded (see EXCLUDED). The pass count per dtype
# is printed in the terminal summary. Also: the add/sub/mul/div and fill_ fast-path cases.
import itertools
import os
import warnings

import pytest
import torch
from conftest import summarize
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

import openneuron  # noqa: F401  (registers the device)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
# Samples per (op, dtype): all of them by default (the whole file takes ~2.5 min on 2 cores,
# inside its 4-minute budget); OPENNEURON_OPINFO_SAMPLES=N caps it for a quicker run.
MAX_SAMPLES = int(os.environ.get("OPENNEURON_OPINFO_SAMPLES", "0")) or None

_RANDOM = "result is random: neuron draws from its own Philox-seeded generator, CPU from " \
          "mt19937, so values differ by design (determinism is covered by test_rng.py)"
_UNINIT = "result is uninitialized memory"
EXCLUDED = {
    **dict.fromkeys([
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
        "normal.in_place", "normal.number_mean", "uniform", "multinomial", "randn",
        "randn_like", "rand_like", "randint", "randint_like", "nn.functional.dropout",
        "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
        "svd_lowrank",  # random projection drawn with torch.randn on the input's device
    ], _RANDOM),
    **dict.fromkeys([
        "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
        "empty_permuted",
    ], _UNINIT),
}

_SPARSE = "sparse layouts are not supported on neuron (strided tensors only)"
_JITERATOR = "jiterator is a CUDA-only code generator"
XFAILS = {
    "sparse.sampled_addmm": _SPARSE,
    "sparse.mm.reduce": _SPARSE,
    "to_sparse": _SPARSE,
    "jiterator_unary": _JITERATOR,
    "jiterator_binary": _JITERATOR,
    "jiterator_4inputs_with_extra_args": _JITERATOR,
    "jiterator_binary_return_by_ref": _JITERATOR,
    "jiterator_2inputs_2outputs": _JITERATOR,
    "as_strided.partial_views": "the sample reads storage outside its input view; moving the "
                                "input to neuron copies only the view, so the storage differs",
    "tensor_split": "the sample's indices tensor must stay on CPU (tensor_split requires it) but "
                    "moving the sample to neuron moves every tensor",
}

# Ops whose results legitimately differ by rounding between two runs of the same CPU kernel.
TOLERANCES = {
    # 1-element normalized shapes: (x - mean) * rsqrt(var + eps) amplifies rounding noise of
    # x - mean (~1e-8) by 1/sqrt(eps).
    "nn.functional.layer_norm": {"atol": 1e-3, "rtol": 1e-3},
    "native_layer_norm": {"atol": 1e-3, "rtol": 1e-3},
    # neuron runs SDPA's math decomposition (no fused-kernel choice registered for it), CPU its
    # fused flash kernel: same math, different summation order.
    "nn.functional.scaled_dot_product_attention": {"atol": 1e-4, "rtol": 1e-4},
    "nn.functional.multi_head_attention_forward": {"atol": 1e-4, "rtol": 1e-4},
}

# bfloat16/float16: as test/test_ops.py test_compare_cpu (atol=rtol=1e-3), loosened for bfloat16
# to about two units in the last place (8 significant bits: 1 ulp is 2^-7 relative), where a
# different summation order or a float32 intermediate on one side moves the result by an ulp.
# An op's own TOLERANCES entry, if looser, wins. Integers and bool compare exactly.
DTYPE_TOLERANCES = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
    torch.float16: {"atol": 1e-3, "rtol": 1e-3},
}

# Failures of one op in one dtype, keyed (op, dtype); (op, "low") covers bfloat16 and float16.
_LOW_PRECISION_UNEXPLAINED = (
    "neuron bug, not yet isolated: low-precision results differ from CPU past the tolerance "
    "(not the scalar-rounding bug of the mul/div fast path, fixed; to investigate with "
    "openneuron.ops_report which ops the neuron run decomposes into)")
DTYPE_XFAILS = {
    **dict.fromkeys([("addr", "low"),
                     ("nn.functional.linear_cross_entropy.chunked_none", torch.float16)],
                    _LOW_PRECISION_UNEXPLAINED),
}


def _full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _xfail_reason(name, dtype):
    if name in XFAILS:
        return XFAILS[name]
    return DTYPE_XFAILS.get((name, dtype)) or (
        DTYPE_XFAILS.get((name, "low")) if dtype in (torch.bfloat16, torch.float16) else None)


# Under `make test-fusion` (adaptive eager on at import) only the ops adaptive eager records run
# here: every other op takes the path it takes in `make test-python`, which already ran all of
# op_db. Casts are recorded copies (the conversion OpInfos); the composite ops built from these
# run in test_fusion.py and the model tests of the fusion pass.
_FUSION_ON = os.environ.get("TORCH_NEURONX_ENABLE_CONCATENATION", "0").lower() in (
    "1", "true", "on", "yes")
_CASTS = {"to", "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "byte",
          "char", "type_as", "square", "rsub", "true_divide"}


def _fused(op) -> bool:
    names = torch.ops.openneuron_fusion.fused_ops()
    bases = {n.split("::")[1].split(".")[0].rstrip("_") for n in names} | _CASTS
    return op.aten_name in bases or op.name.split(".")[0] in bases


def _params():
    for op in op_db:
        name = _full_name(op)
        if name in EXCLUDED or (_FUSION_ON and not _fused(op)):
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            reason = _xfail_reason(name, dtype)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(op, dtype, id=f"{name}-{_dtype_name(dtype)}", marks=marks)


def _to_neuron(x):
    return x.to("neuron") if isinstance(x, torch.Tensor) else x


def _to_cpu(x):
    return x.to("cpu") if isinstance(x, torch.Tensor) else x


def _is_random_sample(name, sample) -> bool:
    """Samples that switch on dropout inside an otherwise deterministic op (SDPA, MHA)."""
    p = sample.kwargs.get("dropout_p", 0.0)
    if name == "nn.functional.multi_head_attention_forward" and len(sample.args) > 9:
        p = sample.args[9]  # dropout_p is positional there
    return isinstance(p, float) and p > 0.0 and sample.kwargs.get("training", True)


SUMMARY = (f"OpInfo compare cpu vs neuron, (op, dtype) pairs ({MAX_SAMPLES or 'all'} samples per "
           f"op and dtype; {len(EXCLUDED)} ops excluded: random or uninitialized results):")


def _samples(op, name, dtype):
    samples = op.sample_inputs("cpu", dtype)
    samples = (s for s in samples if not _is_random_sample(name, s))
    return itertools.islice(samples, MAX_SAMPLES)


@pytest.mark.parametrize("op,dtype", list(_params()))
def test_compare_cpu(op, dtype, request):
    summarize(request, SUMMARY, _dtype_name(dtype))
    name = _full_name(op)
    op_tol, dtype_tol = TOLERANCES.get(name, {}), DTYPE_TOLERANCES.get(dtype, {})
    tol = {k: max(op_tol.get(k, 0.0), dtype_tol.get(k, 0.0)) for k in {*op_tol, *dtype_tol}}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sample in _samples(op, name, dtype):
            neuron_sample = sample.transform(_to_neuron)
            kwargs = dict(neuron_sample.kwargs)
            if kwargs.get("device") in ("cpu", torch.device("cpu")):
                kwargs["device"] = "neuron"
            expected = sample.output_process_fn_grad(op(sample.input, *sample.args,
                                                        **sample.kwargs))
            actual = neuron_sample.output_process_fn_grad(op(neuron_sample.input,
                                                             *neuron_sample.args, **kwargs))
            # NOTE: non_blocking copies to CPU are only complete after a synchronize, as on CUDA.
            torch.neuron.synchronize()
            torch.testing.assert_close(tree_map(_to_cpu, actual), expected, equal_nan=True,
                                       check_device=False, **tol,
                                       msg=lambda m, s=sample: f"{name} sample {s.summary()}: {m}")


_BINARY = [torch.add, torch.sub, torch.mul, torch.div]


@pytest.mark.parametrize("fn", _BINARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", ["same_shape", "python_scalar", "cpu_scalar_tensor",
                                  "int_and_float", "broadcast", "non_contiguous", "in_place",
                                  "in_place_self_alias", "zero_dim"])
def test_binary_fast_path_matches_cpu(fn, case):
    """add/sub/mul/div have native fast paths; each case is either taken or falls back."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, generator=g)
    b = torch.randn(4, 5, generator=g)
    args = {
        "same_shape": (a, b),
        "python_scalar": (a, 2.5),
        "cpu_scalar_tensor": (a, torch.tensor(3.0)),
        "int_and_float": (torch.arange(20).reshape(4, 5), b),
        "broadcast": (a, b[0]),
        "non_contiguous": (a.t(), b.t()),
        "in_place": None,
        "in_place_self_alias": None,
        "zero_dim": (a.sum(), torch.tensor(7, dtype=torch.int64)),
    }[case]
    if case.startswith("in_place"):
        name = fn.__name__ + "_"
        x_c, x_n = a.clone(), a.to("neuron")
        other_c, other_n = (x_c, x_n) if case == "in_place_self_alias" else (b, b.to("neuron"))
        getattr(x_c, name)(other_c)
        getattr(x_n, name)(other_n)
        torch.testing.assert_close(x_n.cpu(), x_c)
        return
    expected = fn(*args)
    # 0-dim CPU tensors stay on CPU (allowed, as on CUDA) except in the zero_dim case.
    actual = fn(*(_to_neuron(x) if isinstance(x, torch.Tensor) and (x.dim() > 0 or
                                                                   case == "zero_dim")
                  else x for x in args))
    assert actual.device.type == "neuron"
    torch.testing.assert_close(actual.cpu(), expected)


def test_queued_op_uses_geometry_at_dispatch():
    """A metadata change (t_, resize_) right after an op was enqueued does not affect it."""
    x = torch.arange(12.0).reshape(3, 4)
    n = x.to("neuron")
    s = n.sum(0)
    n.t_()
    m = n.clone()
    n.resize_(2)
    torch.testing.assert_close(s.cpu(), x.sum(0))
    torch.testing.assert_close(m.cpu(), x.t())


def test_out_argument_is_resized_and_returned():
    a = torch.randn(3, 4)
    out = torch.empty(0, device="neuron")
    res = torch.matmul(a.to("neuron"), a.t().to("neuron"), out=out)
    assert res is out and out.shape == (3, 3)
    torch.testing.assert_close(out.cpu(), a @ a.t())
    idx_out = torch.empty(0, dtype=torch.long, device="neuron")
    torch.nonzero(torch.tensor([0.0, 1.0, 2.0], device="neuron"), out=idx_out)
    torch.testing.assert_close(idx_out.cpu(), torch.tensor([[1], [2]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_fill_and_zero_fast_path_match_cpu(dtype):
    """fill_/zero_ have native kernels for contiguous tensors; other layouts use the fallback."""
    base = torch.arange(24).reshape(4, 6).to(dtype)
    for value in (3, 2.5, True):
        for view in (lambda t: t, lambda t: t[:, ::2], lambda t: t.t(), lambda t: t[1:3]):
            c, n = base.clone(), base.to("neuron")
            view(c).fill_(value)
            view(n).fill_(value)
            torch.testing.assert_close(n.cpu(), c)
            view(c).zero_()
            view(n).zero_()
            torch.testing.assert_close(n.cpu(), c)
    torch.testing.assert_close(torch.ones(3, 2, dtype=dtype, device="neuron").cpu(),
                               torch.ones(3, 2, dtype=dtype))
    torch.testing.assert_close(torch.full((5,), 7, dtype=dtype, device="neuron").cpu(),
                               torch.full((5,), 7, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fast_path_cpu_scalar_operand_matches_cpu_bitwise(dtype):
    # The scalar keeps its own dtype (as in ATen's CPU kernel): rounding 0.1 to half first
    # made x * 0.1 differ from CPU by an ulp in about a third of the elements.
    x = torch.randn(10000).to(dtype)
    xn = x.to("neuron")
    for scalar in (0.1, torch.tensor(0.1), torch.tensor(3.0, dtype=torch.float64)):
        torch.testing.assert_close((xn * scalar).cpu(), x * scalar, rtol=0, atol=0)
        torch.testing.assert_close((xn / scalar).cpu(), x / scalar, rtol=0, atol=0)
        torch.testing.assert_close((xn + scalar).cpu(), x + scalar, rtol=0, atol=0)
