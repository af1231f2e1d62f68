# OpenNeuron: registers the "neuron" PyTorch device (PrivateUse1) on import and through the
# torch.backends autoload entry point (`_autoload`). Thin on purpose: the device surface is in
# openneuron/neuron/ (torch.neuron), ops and runtime are in the C++ extension openneuron._C.
# Importing this package never raises: a missing extension or a bad configuration warns once.
import importlib
import warnings

__version__ = "0.1.0"
__all__ = ["__version__", "is_registered", "ops_report"]

_BACKEND = "neuron"
_registered = False
_import_error: BaseException | None = None
_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _register() -> None:
    """Import the extension and register the device with torch, in the order torch expects.

    Idempotent; never raises. On failure it warns once and leaves torch without torch.neuron.
    """
    global _registered, _import_error
    # NOTE: torch is imported here, not at module top: when `import openneuron` comes first,
    # `import torch` runs the autoload entry point, which re-enters this function through the
    # partially initialized package; everything it needs is defined by then.
    import torch

    if _registered or _import_error is not None:
        return
    try:
        _C = importlib.import_module("openneuron._C")
    except Exception as err:  # noqa: BLE001 - a broken build must not break `import torch`
        _import_error = err
        _warn_once(
            f"openneuron: the C++ extension openneuron._C could not be loaded ({err}); the "
            "'neuron' device is not registered. Rebuild with `make build`."
        )
        return
    try:
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", _BACKEND):
            raise RuntimeError(
                f"PrivateUse1 is already taken by backend '{current}'; only one PrivateUse1 "
                "backend can be registered per process"
            )
        if current != _BACKEND:
            torch.utils.rename_privateuse1_backend(_BACKEND)
        if not hasattr(torch, _BACKEND):
            from openneuron import neuron

            torch._register_device_module(_BACKEND, neuron)
        if not hasattr(torch.Tensor, "is_" + _BACKEND):
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_storage=True
            )
    except Exception as err:  # noqa: BLE001 - registration must never break `import torch`
        _import_error = err
        _warn_once(f"openneuron: registering the 'neuron' device failed: {err}")
        return
    _registered = True
    try:
        from openneuron import _backends

        _backends.install()  # torch.backends.neuron
    except Exception as err:  # noqa: BLE001 - the device works without torch.backends.neuron
        _warn_once(f"openneuron: registering torch.backends.neuron failed: {err}")
    try:
        from openneuron import distributed

        distributed.register()
    except Exception as err:  # noqa: BLE001 - the device works without the process group
        _warn_once(f"openneuron: registering the 'neuron' distributed backend failed: {err}")
    try:
        from openneuron import _inductor

        _inductor.install()  # registers with Dynamo/Inductor when torch._dynamo is imported
    except Exception as err:  # noqa: BLE001 - the device works without torch.compile
        _warn_once(f"openneuron: registering 'neuron' with torch.compile failed: {err}")
    config_error = _C._config_error()
    if config_error:
        _warn_once(
            f"openneuron: no neuron device is usable: {config_error} "
            "(torch.neuron.is_available() is False)"
        )


def _autoload() -> None:
    """Entry point of the `torch.backends` group: runs during `import torch`. Never raises."""
    _register()


def is_registered() -> bool:
    """True when torch.neuron and the "neuron" device type are registered in this process."""
    return _registered


def ops_report(*args, **kwargs):
    """Which ATen ops ran on which path (native / async / fallback) so far in this process.

    Forwards to openneuron._ops_report.ops_report; see there for arguments and return value.
    """
    try:
        from openneuron._ops_report import ops_report as report
    except ImportError as err:
        raise RuntimeError(
            f"openneuron.ops_report is not available in this build ({err})"
        ) from err
    return report(*args, **kwargs)


_register()
