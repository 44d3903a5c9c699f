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
    """The pip command that adds ``extra`` (``"torch"``, ``"dask"``, ...) to this installation:
    ``pip install -e '/path/to/tree[extra]'`` where interop was installed from a source tree
    that still exists (PEP 610's ``direct_url.json``; ``-e`` where the install was editable),
    else ``pip install 'torch-cupy-interop[extra]'``."""
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


class _NotImported:
    """No object is an instance of this: the type of a library not imported."""


def array_types() -> tuple[Any, Any]:
    """``(torch.Tensor, cupy.ndarray)``, each replaced by a type nothing is an
    instance of when its library was never imported (never imports one)."""
    th, cp = sys.modules.get("torch"), sys.modules.get("cupy")
    return (
        _NotImported if th is None else th.Tensor,
        _NotImported if cp is None else cp.ndarray,
    )


def cupy_device_count() -> int:
    """Number of CUDA devices CuPy can use; 0 when there is no driver or device.

    Asking initialises the CUDA driver (``cudaGetDeviceCount`` runs
    ``cuInit``); where a device was found, this process is recorded as one
    that initialised CUDA (:func:`note_cuda_initialised`).
    """
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


# --------------------------------------------------------------------------- fork

# The process in which the CUDA driver was first seen initialised, or None:
# where interop found a usable device through CuPy or PyTorch, or where the
# driver said so just before an os.fork() (CuPy, or anything else, used the
# GPU without interop). A child made by os.fork() inherits the value with
# another pid: the driver's state it inherited is unusable there, whatever it
# tries.
_cuda_initialised_in: int | None = None


def note_cuda_initialised() -> None:
    """Record that this process initialised CUDA (call where interop first does)."""
    global _cuda_initialised_in
    if _cuda_initialised_in is None:
        _cuda_initialised_in = os.getpid()


def cuda_driver_initialised() -> bool:
    """True if the CUDA driver was initialised in this process, by anyone
    (CuPy, PyTorch, interop), as far as CuPy's driver bindings tell without
    initialising it.

    Asks ``cuCtxGetCurrent``, which answers ``CUDA_ERROR_NOT_INITIALIZED``
    until ``cuInit`` ran and initialises nothing. False where CuPy was not
    imported (nothing is imported here) or the driver library cannot be
    loaded (no NVIDIA driver).
    """
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
    """Record this process as one that initialised CUDA where nothing is recorded yet
    and the driver says so (asked by the fork handler, in the parent, before a fork:
    CuPy keeps no record of it, and PyTorch's covers PyTorch only)."""
    if _cuda_initialised_in is None and cuda_driver_initialised():
        note_cuda_initialised()


def _torch_in_bad_fork() -> bool:
    """True in a child forked after PyTorch initialised CUDA in its parent
    (PyTorch keeps the flag; it may have done so outside interop)."""
    th = sys.modules.get("torch")
    check = getattr(getattr(th, "cuda", None), "_is_in_bad_fork", None)
    return bool(check()) if callable(check) else False


def check_not_forked() -> None:
    """Refuse CUDA in a child forked after CUDA was initialised in its parent.

    CUDA cannot be used in such a child: every driver call fails (CuPy would
    report no device at all). Cheap: a pid comparison, and a flag of PyTorch's
    when torch was imported. Seen: CUDA initialised in an ancestor by
    interop, by PyTorch, or by anything else where CuPy was imported there
    before the fork (the driver is asked at the fork); not seen: CUDA
    initialised without CuPy or PyTorch imported in the parent, or a parent
    that imported interop only after its fork.

    Raises
    ------
    CudaAfterForkError
        This process was forked after its parent (or an ancestor) initialised
        CUDA; the message says to start workers with the ``spawn`` method.
    """
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


# The process in which PyTorch last said it has a usable CUDA device. The
# answer cannot change within a process (the driver reads the visible devices
# once), so the checks that guard every device call skip asking again there:
# torch.cuda.is_available() costs microseconds on each exchange.
_torch_cuda_in: int | None = None


def require_cupy_device() -> ModuleType:
    """Return ``cupy`` after checking that a CUDA device is visible to it.

    Raises
    ------
    BackendUnavailableError
        CuPy is not installed.
    CudaAfterForkError
        This process was forked after CUDA was initialised in its parent.
    NoDeviceError
        CuPy imports but sees no CUDA device (no GPU, no or too old a driver).
    """
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
    """Return ``torch`` after checking that PyTorch sees a CUDA device.

    Raises
    ------
    BackendUnavailableError
        PyTorch is not installed.
    CudaAfterForkError
        This process was forked after CUDA was initialised in its parent.
    NoDeviceError
        PyTorch is a CPU-only build or sees no CUDA device.
    """
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
    """True if the installed CuPy can hold ``bfloat16`` arrays (CuPy >= 14,
    which enables them only with NumPy >= 2.1.2)."""
    import numpy as np

    return bfloat16_capable(cupy().__version__, np.__version__)


def bfloat16_capable(cupy_version: str, numpy_version: str) -> bool:
    """True if CuPy ``cupy_version`` has ``bfloat16`` arrays next to NumPy
    ``numpy_version`` (CuPy 14 turns them off below NumPy 2.1.2)."""
    import numpy as np

    try:
        major = int(cupy_version.split(".")[0])
        return major >= 14 and np.lib.NumpyVersion(numpy_version) >= "2.1.2"
    except ValueError:
        return False
