# torch.neuron.amp, mirroring torch.cuda.amp: the deprecated spellings a CUDA script still uses
# (torch.cuda.amp.autocast / GradScaler / custom_fwd / custom_bwd) keep working after "cuda" ->
# "neuron", with torch.cuda.amp's defaults (autocast's dtype float16) and its FutureWarnings.
import functools
import sys

import torch
from typing_extensions import deprecated

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


@deprecated(
    "`torch.neuron.amp.autocast(args...)` is deprecated. "
    "Please use `torch.amp.autocast('neuron', args...)` instead.",
    category=FutureWarning,
)
class autocast(torch.amp.autocast_mode.autocast):
    """torch.autocast("neuron", ...) with torch.cuda.amp.autocast's signature and defaults."""

    # NOTE: as torch.cuda.amp.autocast: before Python 3.13 a class decorated with @deprecated
    # needs its own __new__ for inspect.signature to see the arguments.
    if sys.version_info < (3, 13):

        def __new__(
            cls,
            enabled: bool = True,
            dtype: torch.dtype = torch.float16,
            cache_enabled: bool = True,
        ):
            return super().__new__(cls)

        def __init_subclass__(cls):
            pass

    def __init__(
        self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
    ):
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("neuron", ...) with torch.cuda.amp.GradScaler's signature."""

    @deprecated(
        "`torch.neuron.amp.GradScaler(args...)` is deprecated. "
        "Please use `torch.amp.GradScaler('neuron', args...)` instead.",
        category=FutureWarning,
    )
    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            "neuron",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


@deprecated(
    "`torch.neuron.amp.custom_fwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_fwd(args..., device_type='neuron')` instead.",
    category=FutureWarning,
)
def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.amp.custom_fwd(..., device_type="neuron")."""
    return functools.partial(torch.amp.custom_fwd, device_type="neuron")(
        fwd=fwd, cast_inputs=cast_inputs
    )


@deprecated(
    "`torch.neuron.amp.custom_bwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_bwd(args..., device_type='neuron')` instead.",
    category=FutureWarning,
)
def custom_bwd(bwd):
    """torch.amp.custom_bwd(..., device_type="neuron")."""
    return functools.partial(torch.amp.custom_bwd, device_type="neuron")(bwd)
