"""An NKI kernel as a torch.library custom op: its schema from the kernel's parameters (arrays
become Tensors; int/float/bool defaults stay constants), its implementation a launch (queued on
the neuron stream for neuron tensors), its fake implementation the trace's output shapes and
dtypes (no data touched), so torch.compile keeps it as one node. The returned op takes
register_autograd like any torch.library.custom_op. grid: a launch grid, or a callable giving
one from the call's arguments."""

from __future__ import annotations

import inspect

from openneuron.nki._kernel import Kernel, _is_tensor
from openneuron.nki._trace import NkiError


def custom_op(name, kernel, *, mutates_args=(), num_outputs=1, grid=None):
    import torch

    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    if grid is not None and not callable(grid):
        k = k[grid]

    def bound(args):  # grid=callable: the launch grid from the arguments, e.g. batch * heads
        return k[grid(*args)] if callable(grid) else k

    sig = inspect.signature(k.func)
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise NkiError(f"custom_op {name}: kernel '{k.__name__}' takes *args/**kwargs; a "
                           "custom op needs named parameters")
        if p.default is inspect.Parameter.empty:
            ann = torch.Tensor
        elif isinstance(p.default, (bool, int, float)):
            ann = type(p.default)
        else:
            raise NkiError(f"custom_op {name}: parameter {p.name} defaults to "
                           f"{p.default!r}; constants must be int, float or bool")
        params.append(p.replace(annotation=ann, kind=p.POSITIONAL_OR_KEYWORD))
    if num_outputs == 0:
        ret = None
    elif num_outputs == 1:
        ret = torch.Tensor
    else:
        ret = tuple[tuple([torch.Tensor] * num_outputs)]

    def check(out):
        n = 0 if out is None else (1 if _is_tensor(out) else len(out))
        if n != num_outputs:
            raise NkiError(f"custom_op {name}: kernel '{k.__name__}' returns {n} tensor(s); "
                           f"registered with num_outputs={num_outputs}")
        return tuple(out) if isinstance(out, list) else out

    def impl(*args, **kwargs):
        return check(bound(args)(*args, **kwargs))

    impl.__signature__ = sig.replace(parameters=params, return_annotation=ret)
    impl.__name__ = k.__name__
    op = torch.library.custom_op(name, impl, mutates_args=mutates_args)

    def fake(*args, **kwargs):
        traced = bound(args).specialize(*args, **kwargs)
        like = next(a for a in args if _is_tensor(a))
        outs = []
        for (shape, dt), src in zip(traced.out_specs, traced.input_outputs):
            if src is not None:
                raise NkiError(f"custom_op {name}: the kernel returns its input; a custom op's "
                               "outputs must be new tensors (declare it in mutates_args and "
                               "return nothing)")
            outs.append(like.new_empty(shape, dtype=getattr(torch, dt)))
        return check(traced.pack(outs))

    fake.__signature__ = impl.__signature__
    op.register_fake(fake)
    return op
