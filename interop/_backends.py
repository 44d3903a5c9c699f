"""Lazy detection of NumPy, PyTorch and CuPy, and the one place that answers "is
library X usable here?" (:func:`torch`, :func:`cupy` and the ``require_*`` checks).

``import interop`` imports neither torch nor cupy: arrays are recognised through
``sys.modules`` (a library never imported has no arrays).
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from .errors import BackendUnavailableError, CudaAfterForkError, NoDeviceError

__all__: list[str] = []

# The name to install interop under. The PyPI name "interop" is an unrelated
# package (Illumina's InterOp) that also imports as ``interop``.
DISTRIBUTION = "torch-cupy-interop"


def install_command(extra: str) -> str:
    """The pip command that adds ``extra`` to this installation: from the source tree
    it was installed from where that still exists (PEP 610's ``direct_url.json``,
    ``-e`` if editable), else from the index."""
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
    """No object is an instance of this: the type of a library not imported."""


def array_types() -> tuple[Any, Any]:
    """``(torch.Tensor, cupy.ndarray)``, each a type of nothing where its library was
    never imported (imports neither)."""
    th, cp = sys.modules.get("torch"), sys.modules.get("cupy")
    return (
        _NotImported if th is None else th.Tensor,
        _NotImported if cp is None else cp.ndarray,
    )


def cupy_device_count() -> int:
    """Number of CUDA devices CuPy can use (0 without a driver or device). Asking
    initialises the driver: where a device is found, this process is noted as
    one that initialised CUDA."""
    count, _ = _cupy_device_count_or_error()
    return count


def _cupy_device_count_or_error() -> tuple[int, Exception | None]:
    cp = cupy()
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, insufficient driver, no device
        return 0, exc
    if count:
        note_cuda_initialised()
    return count, None


# The process in which the CUDA driver was first seen initialised, or None: where
# interop found a usable device, or where the driver said so just before a fork. A
# forked child inherits the value with another pid: there, CUDA is unusable.
_cuda_initialised_in: int | None = None


def note_cuda_initialised() -> None:
    """Record that this process initialised CUDA (call where interop first does)."""
    global _cuda_initialised_in
    if _cuda_initialised_in is None:
        _cuda_initialised_in = os.getpid()


def cuda_driver_initialised() -> bool:
    """True if anyone initialised the CUDA driver in this process, as far as CuPy's
    driver bindings tell without initialising it (``cuCtxGetCurrent``); False where
    CuPy was never imported or there is no driver."""
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
    """Note this process where nothing is noted yet and the driver says it was
    initialised (the fork handler asks, before a fork: CuPy keeps no record of it)."""
    if _cuda_initialised_in is None and cuda_driver_initialised():
        note_cuda_initialised()


def _torch_in_bad_fork() -> bool:
    """True in a child forked after PyTorch initialised CUDA in its parent."""
    th = sys.modules.get("torch")
    check = getattr(getattr(th, "cuda", None), "_is_in_bad_fork", None)
    return bool(check()) if callable(check) else False


def check_not_forked() -> None:
    """Raise :class:`CudaAfterForkError` in a child forked after an ancestor
    initialised CUDA, where every driver call fails (a pid comparison, and
    PyTorch's flag; docs/config.md says which initialisations are seen)."""
    parent = _cuda_initialised_in
    if (parent is None or parent == os.getpid()) and not _torch_in_bad_fork():
        return
    who = "its parent" if parent is None else f"process {parent}"
    raise CudaAfterForkError(
        f"expected a process that may use CUDA (got process {os.getpid()}, forked after CUDA "
        f"was initialised in {who}); CUDA cannot be used after fork. Start processes that "
        "use the GPU with multiprocessing's 'spawn' start method "
        "(multiprocessing.get_context('spawn'), or "
        "torch.multiprocessing.set_start_method('spawn')), or fork before the parent first "
        "uses CUDA"
    )


# The process in which PyTorch last said it has a usable CUDA device: the answer
# cannot change within a process, and torch.cuda.is_available() costs microseconds.
_torch_cuda_in: int | None = None


def require_cupy_device() -> ModuleType:
    """``cupy``, once a CUDA device is visible to it (else ``BackendUnavailableError``,
    ``CudaAfterForkError`` or ``NoDeviceError``)."""
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
            "run on a machine with an NVIDIA GPU and driver, or keep the data on the host "
            f"with interop.to_numpy / interop.to_torch{forked}"
        )
    return cp


def require_torch_cuda() -> ModuleType:
    """``torch``, once PyTorch sees a CUDA device (else ``BackendUnavailableError``,
    ``CudaAfterForkError`` or ``NoDeviceError``)."""
    global _torch_cuda_in
    th = torch()
    check_not_forked()
    pid = os.getpid()
    if _torch_cuda_in == pid:
        return th
    if not th.cuda.is_available():
        raise NoDeviceError(
            "expected a CUDA device for PyTorch (got none: torch.cuda.is_available() is False, "
            f"torch {th.__version__}); install a CUDA build of PyTorch on a machine with an "
            "NVIDIA GPU, or use device='cpu'"
        )
    note_cuda_initialised()
    _torch_cuda_in = pid
    return th


def cupy_supports_bfloat16() -> bool:
    """True if the installed CuPy can hold ``bfloat16`` arrays."""
    import numpy as np

    return bfloat16_capable(cupy().__version__, np.__version__)


def bfloat16_capable(cupy_version: str, numpy_version: str) -> bool:
    """True if CuPy ``cupy_version`` has ``bfloat16`` arrays next to NumPy
    ``numpy_version`` (CuPy >= 14, which turns them off below NumPy 2.1.2)."""
    import numpy as np

    try:
        major = int(cupy_version.split(".")[0])
        return major >= 14 and np.lib.NumpyVersion(numpy_version) >= "2.1.2"
    except ValueError:
        return False
