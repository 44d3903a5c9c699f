"""Lazy detection of NumPy, PyTorch and CuPy.

``import interop`` must not import torch or cupy. Arrays are recognised through
``sys.modules``: if ``torch`` was never imported, no object can be a tensor, so
there is nothing to import. The one place that answers "is library X usable
here?" is :func:`torch` / :func:`cupy` (and the ``require_*_device`` checks),
which raise :class:`~interop.errors.BackendUnavailableError` or
:class:`~interop.errors.NoDeviceError` with the fix in the message.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from .errors import BackendUnavailableError, NoDeviceError

__all__: list[str] = []

# The name to install interop under. The PyPI name "interop" is an unrelated
# package (Illumina's InterOp) that also imports as ``interop``.
DISTRIBUTION = "torch-cupy-interop"

_EXTRAS = {
    "torch": f"pip install '{DISTRIBUTION}[torch]' (or follow pytorch.org for a CUDA build)",
    "cupy": (
        f"pip install '{DISTRIBUTION}[cuda12]' or '{DISTRIBUTION}[cuda13]' "
        "(matching your CUDA driver)"
    ),
}


def _import(name: str) -> ModuleType:
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"this call needs {name}, which cannot be imported ({exc}); "
            f"install it with: {_EXTRAS[name]}"
        ) from exc


def torch() -> ModuleType:
    """Return the ``torch`` module, importing it on first use.

    Raises
    ------
    BackendUnavailableError
        PyTorch is not installed or fails to import.
    """
    return _import("torch")


def cupy() -> ModuleType:
    """Return the ``cupy`` module, importing it on first use.

    Raises
    ------
    BackendUnavailableError
        CuPy is not installed or fails to import.
    """
    return _import("cupy")


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a ``torch.Tensor`` (never imports torch)."""
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def is_cupy_array(x: Any) -> bool:
    """True if ``x`` is a ``cupy.ndarray`` (never imports cupy)."""
    mod = sys.modules.get("cupy")
    return mod is not None and isinstance(x, mod.ndarray)


def cupy_device_count() -> int:
    """Number of CUDA devices CuPy can use; 0 when there is no driver or device."""
    cp = cupy()
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # CUDARuntimeError: no driver, insufficient driver, no device
        return 0


def require_cupy_device() -> ModuleType:
    """Return ``cupy`` after checking that a CUDA device is visible to it.

    Raises
    ------
    BackendUnavailableError
        CuPy is not installed.
    NoDeviceError
        CuPy imports but sees no CUDA device (no GPU, no or too old a driver).
    """
    cp = cupy()
    if cupy_device_count() == 0:
        raise NoDeviceError(
            "expected a CUDA device for CuPy (got none: cupy.cuda.is_available() is False); "
            "run on a machine with an NVIDIA GPU and driver, or keep the data on the host "
            "with interop.to_numpy / interop.to_torch"
        )
    return cp


def require_torch_cuda() -> ModuleType:
    """Return ``torch`` after checking that PyTorch sees a CUDA device.

    Raises
    ------
    BackendUnavailableError
        PyTorch is not installed.
    NoDeviceError
        PyTorch is a CPU-only build or sees no CUDA device.
    """
    th = torch()
    if not th.cuda.is_available():
        raise NoDeviceError(
            "expected a CUDA device for PyTorch (got none: torch.cuda.is_available() is False, "
            f"torch {th.__version__}); install a CUDA build of PyTorch on a machine with an "
            "NVIDIA GPU, or use device='cpu'"
        )
    return th


def cupy_supports_bfloat16() -> bool:
    """True if the installed CuPy can hold ``bfloat16`` arrays (CuPy >= 14)."""
    cp = cupy()
    try:
        major = int(cp.__version__.split(".")[0])
    except ValueError:
        return False
    return major >= 14
