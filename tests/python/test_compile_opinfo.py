"""A subset of PyTorch's OpInfo database (op_db) under torch.compile on neuron (TorchInductor,
openneuron/_inductor/): each op's first samples compiled on neuron, forward and (where the op is
differentiable) backward through AOTAutograd, against eager CPU. The subset covers what Inductor
generates C++ for (pointwise, reductions, scans, indexing, views, norms) and what it leaves to
extern kernels or fallbacks dispatched to neuron (matmuls, convolution, sort/topk, SDPA,
cross-entropy). float32 forward + backward; bfloat16 forward for the pointwise and reduction ops.
Pass counts print in pytest's summary. The compile cache is shared by the test run (conftest.py)."""
import itertools
import warnings

import pytest
import torch
import torch._dynamo
from conftest import summarize
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

DEV = torch.device("neuron:0")
SAMPLES = 2  # per op and dtype: every extra sample is one more compile

POINTWISE = ["abs", "exp", "log", "sin", "tanh", "sigmoid", "rsqrt", "erf", "nn.functional.gelu",
             "nn.functional.silu", "nn.functional.relu", "nn.functional.softplus", "add", "mul",
             "div", "sub", "pow", "maximum", "where", "clamp", "lerp", "addcmul", "masked_fill"]
REDUCTIONS = ["sum", "mean", "amax", "var", "prod", "softmax", "log_softmax", "logsumexp",
              "nn.functional.layer_norm", "nn.functional.rms_norm", "cumsum", "argmax"]
OTHERS = ["matmul", "bmm", "addmm", "nn.functional.linear", "nn.functional.embedding", "cat",
          "stack", "index_select", "gather", "scatter_add", "index_put", "topk", "sort", "flip",
          "roll", "tril", "nn.functional.pad", "transpose", "permute", "expand", "reshape",
          "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
          "nn.functional.cross_entropy", "nn.functional.scaled_dot_product_attention"]
LOW_PRECISION = {*POINTWISE, *REDUCTIONS}

# eager CPU vs Inductor's code: vectorized transcendentals and a different summation order
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2}}
OP_TOL = {  # ops whose results amplify the rounding of their inputs
    "nn.functional.layer_norm": {"atol": 1e-3, "rtol": 1e-3},
    "var": {"atol": 1e-4, "rtol": 1e-4},
    "prod": {"atol": 1e-4, "rtol": 1e-4},
    "nn.functional.scaled_dot_product_attention": {"atol": 1e-4, "rtol": 1e-4},
}

_BY_NAME = {}
for _op in op_db:
    _BY_NAME.setdefault(_op.name, _op)  # the first entry: the op itself, not a variant


def _params():
    for name in POINTWISE + REDUCTIONS + OTHERS:
        op = _BY_NAME[name]
        for dtype in (torch.float32, torch.bfloat16):
            if dtype == torch.bfloat16 and name not in LOW_PRECISION:
                continue
            if dtype in op.supported_dtypes("cpu"):
                yield pytest.param(op, dtype, id=f"{name}-{str(dtype)[6:]}")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _leaves(sample):
    return [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
            if isinstance(t, torch.Tensor) and t.requires_grad]


def _call(op, sample):
    return sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))


SUMMARY = f"OpInfo under torch.compile on neuron vs eager CPU ({SAMPLES} samples per op and dtype):"


@pytest.mark.parametrize("op,dtype", list(_params()))
def test_compiled_matches_eager_cpu(op, dtype, request):
    summarize(request, SUMMARY, str(dtype)[6:])
    tol = {k: max(TOL[dtype][k], OP_TOL.get(op.name, {}).get(k, 0.0)) for k in TOL[dtype]}
    backward = dtype == torch.float32 and op.supports_autograd
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", dtype, requires_grad=backward)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sample in itertools.islice(samples, SAMPLES):
            neuron = sample.transform(
                lambda t: t.detach().to(DEV).requires_grad_(t.requires_grad)
                if isinstance(t, torch.Tensor) else t)
            compiled = torch.compile(lambda s=neuron: _call(op, s), dynamic=False)
            got, want = compiled(), _call(op, sample)
            msg = lambda m, s=sample: f"{op.name} sample {s.summary()}: {m}"
            torch.testing.assert_close(tree_map(lambda t: t.cpu() if isinstance(
                t, torch.Tensor) else t, got), want, equal_nan=True, check_device=False,
                **tol, msg=msg)
            outs = [t for t in tree_flatten(want)[0] if isinstance(t, torch.Tensor)
                    and t.requires_grad and t.is_floating_point()]
            if not backward or not outs:
                continue
            cpu_leaves, neuron_leaves = _leaves(sample), _leaves(neuron)
            got_outs = [t for t in tree_flatten(got)[0] if isinstance(t, torch.Tensor)
                        and t.requires_grad and t.is_floating_point()]
            g = torch.Generator().manual_seed(1)
            grads = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
            want_g = torch.autograd.grad(outs, cpu_leaves, grads, allow_unused=True)
            got_g = torch.autograd.grad(got_outs, neuron_leaves, [x.to(DEV) for x in grads],
                                        allow_unused=True)
            for i, (a, b) in enumerate(zip(got_g, want_g)):
                if b is None:
                    continue
                torch.testing.assert_close(a.cpu(), b, equal_nan=True, **tol,
                                           msg=lambda m, i=i: f"grad of input {i}: {m}")
