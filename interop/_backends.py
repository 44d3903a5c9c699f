"""The one place that answers "is library X usable here?", without importing it."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

from .errors import BackendUnavailableError, CudaAfterForkError, NoDeviceError

__all__: list[str] = []

# The name to install interop under (PyPI's "interop" is Illumina's InterOp).
DISTRIBUTION = "torch-cupy-interop"


def install_command(extra: str) -> str:
    """The pip command adding ``extra``: from the source tree installed from (PEP 610), or PyPI."""
    import shlex  # not at import: only error messages need it

    tree, editable = _source_tree()
    if tree is None:
        return f"pip install {shlex.quote(f'{DISTRIBUTION}[{extra}]')}"
    return f"pip install {'-e ' * editable}{shlex.quote(f'{tree}[{extra}]')}"


def _source_tree() -> tuple[str | None, bool]:
    """(the directory interop was installed from, or None; whether the install is editable)."""
    import importlib.metadata
    import json
    import urllib.parse
    import urllib.request

    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        direct = json.loads(text or "{}")  # none: installed from an index
        url = urllib.parse.urlparse(direct.get("url", ""))
        tree = urllib.request.url2pathname(url.path) if url.scheme == "file" else ""
        editable = bool(direct["dir_info"].get("editable", False))  # KeyError: from a wheel
    except (importlib.metadata.PackageNotFoundError, ValueError, KeyError, AttributeError):
        return None, False
    return (tree, editable) if os.path.isdir(tree) else (None, False)


def _import(name: str) -> ModuleType:
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = (
            f"{install_command('torch')} (or follow pytorch.org for a CUDA build)"
            if name == "torch"
            else f"{install_command('cuda12')} or {install_command('cuda13')} "
            "(matching your CUDA driver)"
        )
        raise BackendUnavailableError(
            f"this call needs {name}, which cannot be imported ({exc}); install it with: {hint}"
        ) from exc


def torch() -> ModuleType:
    """The ``torch`` module (imported on first use; ``BackendUnavailableError`` if it cannot be)."""
    return _import("torch")


def cupy() -> ModuleType:
    """The ``cupy`` module (imported on first use; ``BackendUnavailableError`` if it cannot be)."""
    return _import("cupy")


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a ``torch.Tensor`` (never imports torch)."""
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def is_cupy_array(x: Any) -> bool:
    """True if ``x`` is a ``cupy.ndarray`` (never imports cupy)."""
    mod = sys.modules.get("cupy")
    return mod is not None and isinstance(x, mod.ndarray)


class _NotImported:
    """The type of a library not imported: nothing is an instance."""


def array_types() -> tuple[Any, Any]:
    """``(torch.Tensor, cupy.ndarray)``, or :class:`_NotImported` where not imported."""
    th, cp = sys.modules.get("torch"), sys.modules.get("cupy")
    return (_NotImported if th is None else th.Tensor, _NotImported if cp is None else cp.ndarray)


def cupy_device_count() -> int:
    """Number of CUDA devices CuPy can use (0 without a driver); notes CUDA initialised."""
    return _cupy_device_count_or_error()[0]


def _cupy_device_count_or_error() -> tuple[int, Exception | None]:
    cp = cupy()
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, insufficient driver, no device
        return 0, exc
    if count:
        note_cuda_initialised()
    return count, None


# The pid where CUDA was first seen initialised; a forked child inherits it with another pid.
_cuda_initialised_in: int | None = None


def note_cuda_initialised() -> None:
    """Record that this process initialised CUDA (call where interop first does)."""
    global _cuda_initialised_in
    if _cuda_initialised_in is None:
        _cuda_initialised_in = os.getpid()


def cuda_driver_initialised() -> bool:
    """True if the CUDA driver was initialised here, asked without initialising it."""
    cp = sys.modules.get("cupy")
    driver = getattr(getattr(cp, "cuda", None), "driver", None)
    get_current = getattr(driver, "ctxGetCurrent", None)
    if get_current is None:
        return False
    try:
        get_current()
    except Exception:  # CUDADriverError (not initialised), or no libcuda at all
        return False
    return True


def note_if_driver_initialised() -> None:
    """Note this process if the driver says it was initialised (a fork handler: never raises)."""
    with contextlib.suppress(Exception):
        if _cuda_initialised_in is None and cuda_driver_initialised():
            note_cuda_initialised()


def check_not_forked() -> None:
    """Raise :class:`CudaAfterForkError` in a child forked after CUDA was initialised."""
    parent = _cuda_initialised_in
    bad_fork = getattr(getattr(sys.modules.get("torch"), "cuda", None), "_is_in_bad_fork", None)
    if (parent is None or parent == os.getpid()) and not (callable(bad_fork) and bad_fork()):
        return
    who = "its parent" if parent is None else f"process {parent}"
    raise CudaAfterForkError(
        f"expected a process that may use CUDA (got process {os.getpid()}, forked after CUDA "
        f"was initialised in {who}); CUDA cannot be used after fork: use multiprocessing's "
        "'spawn' start method (multiprocessing.get_context('spawn')), or fork before CUDA is used"
    )


# The pid where PyTorch said it has a CUDA device (torch.cuda.is_available() costs us).
_torch_cuda_in: int | None = None


def require_cupy_device() -> ModuleType:
    """``cupy``, once a CUDA device is visible to it, else the error."""
    cp = cupy()
    check_not_forked()
    count, error = _cupy_device_count_or_error()
    if count == 0:
        said = "" if error is None else f"; CUDA says {error}"
        forked = (
            "; a process forked from one that had used CUDA gets this error too: start such "
            "processes with multiprocessing's 'spawn' start method"
            if "cudaErrorInitializationError" in said
            else ""
        )
        raise NoDeviceError(
            f"expected a CUDA device for CuPy (got none: cupy.cuda.is_available() is False{said}); "
            f"run on a machine with an NVIDIA GPU, or keep the data on the host{forked}"
        )
    return cp


def require_torch_cuda() -> ModuleType:
    """``torch``, once PyTorch sees a CUDA device, else the error."""
    global _torch_cuda_in
    th = torch()
    check_not_forked()
    pid = os.getpid()
    if _torch_cuda_in == pid:
        return th
    if not th.cuda.is_available():
        raise NoDeviceError(
            "expected a CUDA device for PyTorch (got none: torch.cuda.is_available() is False, "
            f"torch {th.__version__}); use a CUDA build on an NVIDIA GPU, or device='cpu'"
        )
    note_cuda_initialised()
    _torch_cuda_in = pid
    return th


def cupy_supports_bfloat16() -> bool:
    """True if the installed CuPy can hold ``bfloat16`` arrays."""
    return bfloat16_capable(cupy().__version__, np.__version__)


def bfloat16_capable(cupy_version: str, numpy_version: str) -> bool:
    """True if CuPy ``cupy_version`` has bfloat16 with this NumPy (CuPy >= 14, NumPy >= 2.1.2)."""
    try:
        return (
            int(cupy_version.split(".")[0]) >= 14 and np.lib.NumpyVersion(numpy_version) >= "2.1.2"
        )
    except ValueError:
        return False
