"""`torch.nn.attention.flex_attention` on neuron, eager and compiled, forward and backward.

PyTorch 2.13 lists the devices flex attention accepts and refuses backward on CPU (Inductor's
C++ template is inference-only). On neuron:
- Inference (no input needs a gradient, no logsumexp or max asked for): the flex_attention HOP
  stays in the graph and Inductor lowers it with its C++ flash template (`lower_cpu`:
  block-sparse, never materializes the scores), like CPU's.
- Training, or the logsumexp / max scores asked for (`return_aux`, as Hugging Face does on every
  device but CPU; the template cannot return them): the HOP's autograd rule runs the dense math (`sdpa_dense`: scores, score_mod and
  mask_mod vmapped over (b, h, q, kv), softmax) as ordinary differentiable ops, so eager autograd
  and AOTAutograd differentiate it (score_mod's captured tensors included) and Inductor fuses the
  pointwise parts. Memory is O(q_len * kv_len) per head, as the reference implementation.
Each patch applies to neuron tensors only; other devices keep PyTorch's paths.
"""
from __future__ import annotations

import functools

import torch

NEURON = "neuron"


def patch_validate_device(module) -> None:
    """`torch.nn.attention.flex_attention._validate_device` accepts neuron tensors."""
    original = module._validate_device
    if getattr(original, "_openneuron", False):
        return

    @functools.wraps(original)
    def _validate_device(query, key, value):
        if query.device.type != NEURON:
            original(query, key, value)

    _validate_device._openneuron = True
    module._validate_device = _validate_device


def patch_autograd(module) -> None:
    """The flex_attention HOP's Autograd rule (torch._higher_order_ops.flex_attention): neuron
    inputs that need gradients, or a logsumexp, take the differentiable dense math (see the
    module docstring). Also its autocast rule for neuron."""
    from torch._C import DispatchKey

    hop = module.flex_attention
    original = hop.py_kernels[DispatchKey.Autograd]
    if getattr(original, "_openneuron", False):
        return

    def autograd(query, key, value, score_mod, block_mask, scale, kernel_options,
                 score_mod_other_buffers=(), mask_mod_other_buffers=()):
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in (query, key, value, *score_mod_other_buffers))
        aux = kernel_options.get("OUTPUT_LOGSUMEXP") or kernel_options.get("OUTPUT_MAX")
        if query.device.type != NEURON or not (needs_grad or aux):
            return original(query, key, value, score_mod, block_mask, scale, kernel_options,
                            score_mod_other_buffers, mask_mod_other_buffers)
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

        with TransformGetItemToIndex():
            out, lse, max_scores = module.sdpa_dense(
                query, key, value, score_mod, block_mask, scale, kernel_options,
                score_mod_other_buffers, mask_mod_other_buffers)
        # the HOP's contract: lse and max_scores carry no gradient (as its autograd Function)
        return out, lse.detach(), None if max_scores is None else max_scores.detach()

    autograd._openneuron = True
    hop.py_kernels[DispatchKey.Autograd] = autograd
    if DispatchKey.AutocastPrivateUse1 not in hop.py_kernels:
        hop.py_impl(DispatchKey.AutocastPrivateUse1)(functools.partial(_autocast, module))
    hop._dispatch_cache.clear()


def _autocast(module, query, key, value, *rest):
    """Under torch.autocast("neuron"): q, k, v cast to the autocast dtype, then the op below
    autocast (PyTorch registers this shim for CPU and CUDA only)."""
    from torch.amp.autocast_mode import _cast

    dtype = torch.get_autocast_dtype(NEURON)
    query, key, value = (_cast(t, NEURON, dtype) for t in (query, key, value))
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        return module.flex_attention(query, key, value, *rest)


def patch_lowering() -> None:
    """Inductor lowers the flex_attention HOP on neuron with the C++ template (inference: the
    training path never reaches Inductor as a HOP, see patch_autograd)."""
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu
    from torch._inductor.lowering import lowerings

    hop = torch.ops.higher_order.flex_attention
    original = lowerings[hop]
    if getattr(original, "_openneuron", False):
        return

    @functools.wraps(original)
    def lower(query, *args, **kwargs):
        if query.get_device().type != NEURON:
            return original(query, *args, **kwargs)
        return lower_cpu(query, *args, **kwargs)

    lower._openneuron = True
    lowerings[hop] = lower
