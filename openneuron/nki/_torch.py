"""An NKI kernel as a torch.library custom op: its schema from the kernel's parameters (arrays
become Tensors; int/float/bool defaults stay constants), its implementation a launch (queued on
the neuron stream for neuron tensors), its fake implementation the trace's output shapes and
dtypes (no data touched), so torch.compile keeps it as one node. The returned op takes
register_autograd like any torch.library.custom_op. grid: a launch grid, or a callable giving
one from the call's arguments."""

from __future__ import annotations

import ast
import inspect
import textwrap

from openneuron.nki._kernel import Kernel, _is_tensor
from openneuron.nki._trace import NkiError


def _returned_count(name, func) -> int:
    """How many tensors the kernel returns, read from its return statements: `return a, b` is
    2, `return out` 1 (a name: checked when the op runs), none or a bare `return` 0. A return
    whose count the source does not show (a call, a starred tuple) needs num_outputs."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError) as err:
        raise NkiError(f"custom_op {name}: the source of kernel '{func.__name__}' is not "
                       f"available ({err}); pass num_outputs=") from None
    fn = tree.body[0]
    counts = set()
    nested = {id(n) for n in ast.walk(fn) if n is not fn and isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))}
    todo = list(ast.iter_child_nodes(fn))
    while todo:  # the kernel's own returns, not those of functions defined inside it
        node = todo.pop()
        if id(node) in nested:
            continue
        todo.extend(ast.iter_child_nodes(node))
        if not isinstance(node, ast.Return):
            continue
        v = node.value
        if v is None or (isinstance(v, ast.Constant) and v.value is None):
            counts.add(0)
        elif isinstance(v, (ast.Tuple, ast.List)) and not any(
                isinstance(e, ast.Starred) for e in v.elts):
            counts.add(len(v.elts))
        elif isinstance(v, ast.Name):
            counts.add(1)
        else:
            raise NkiError(f"custom_op {name}: kernel '{func.__name__}' returns "
                           f"`{ast.unparse(v)}` (line {node.lineno} of its source), whose number "
                           "of tensors its source does not show; pass num_outputs=")
    if not counts:
        return 0
    if len(counts) > 1:
        raise NkiError(f"custom_op {name}: kernel '{func.__name__}' returns "
                       f"{sorted(counts)} tensors on different paths; a custom op has one "
                       "schema: pass num_outputs=")
    return counts.pop()


def custom_op(name, kernel, *, mutates_args=(), num_outputs=None, grid=None):
    import torch

    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    inferred = num_outputs is None
    if inferred:
        num_outputs = _returned_count(name, k.func)
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
            how = "read from its return statements" if inferred else "registered with"
            raise NkiError(f"custom_op {name}: kernel '{k.__name__}' returns {n} tensor(s); "
                           f"{how}: num_outputs={num_outputs}; pass num_outputs={n}")
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
