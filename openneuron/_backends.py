# torch.backends.neuron, mirroring torch.backends.cuda for what a CUDA training script sets
# (after "cuda" -> "neuron"): the matmul precision flags and the scaled-dot-product-attention
# backend switches. Registered by openneuron._register() as torch.backends.neuron.
import sys
import types

import torch
import torch.backends.cuda as _cuda

__all__ = [
    "allow_fp16_bf16_reduction_math_sdp",
    "cudnn_sdp_enabled",
    "enable_cudnn_sdp",
    "enable_flash_sdp",
    "enable_math_sdp",
    "enable_mem_efficient_sdp",
    "flash_sdp_enabled",
    "fp16_bf16_reduction_math_sdp_allowed",
    "is_built",
    "math_sdp_enabled",
    "matmul",
    "mem_efficient_sdp_enabled",
    "sdp_kernel",
]

# NOTE: the very object torch.backends.cuda.matmul is: these flags are process-wide in ATen.
# On neuron they change nothing: float32 matmuls stay float32 (no TF32 on the host) and
# reduced-precision matmuls accumulate in float32, whatever allow_tf32 or
# allow_{fp16,bf16}_reduced_precision_reduction say.
matmul = _cuda.matmul

# Process-wide switches shared with torch.backends.cuda (they are ATen's).
math_sdp_enabled = _cuda.math_sdp_enabled
enable_math_sdp = _cuda.enable_math_sdp
flash_sdp_enabled = _cuda.flash_sdp_enabled
mem_efficient_sdp_enabled = _cuda.mem_efficient_sdp_enabled
cudnn_sdp_enabled = _cuda.cudnn_sdp_enabled
enable_cudnn_sdp = _cuda.enable_cudnn_sdp
allow_fp16_bf16_reduction_math_sdp = _cuda.allow_fp16_bf16_reduction_math_sdp
fp16_bf16_reduction_math_sdp_allowed = _cuda.fp16_bf16_reduction_math_sdp_allowed
sdp_kernel = _cuda.sdp_kernel


def is_built() -> bool:
    """True: this PyTorch has the neuron backend (openneuron is registered)."""
    return True


def _sync_fused() -> None:
    # Neuron has one fused attention kernel, which stands for both flash and memory-efficient
    # attention: it runs while either is enabled, as the overrideable backend.
    torch._C._set_sdp_use_overrideable(
        torch._C._get_flash_sdp_enabled() or torch._C._get_mem_efficient_sdp_enabled()
    )


def enable_flash_sdp(enabled: bool) -> None:
    """Enable or disable flash attention; neuron's fused attention runs while flash or
    memory-efficient attention is enabled (both off: the math path)."""
    torch._C._set_sdp_use_flash(enabled)
    _sync_fused()


def enable_mem_efficient_sdp(enabled: bool) -> None:
    """Enable or disable memory-efficient attention (see enable_flash_sdp)."""
    torch._C._set_sdp_use_mem_efficient(enabled)
    _sync_fused()


def install() -> None:
    """Make this module torch.backends.neuron (idempotent)."""
    module = sys.modules[__name__]
    sys.modules.setdefault("torch.backends.neuron", module)
    if not isinstance(getattr(torch.backends, "neuron", None), types.ModuleType):
        torch.backends.neuron = module
