"""One memory pool for PyTorch and CuPy: ``interop.use_torch_allocator``."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from . import _backends
from .errors import InteropError

__all__ = ["StreamMismatchError", "use_torch_allocator"]


class StreamMismatchError(InteropError, RuntimeError):
    """CuPy allocated while its current stream differs from PyTorch's."""


def _malloc(size: int, device: int) -> int:
    """Allocate ``size`` bytes for CuPy from PyTorch's caching allocator,
    ordered on PyTorch's current stream of ``device``."""
    th = _backends.torch()
    cp = _backends.cupy()
    torch_stream = th.cuda.current_stream(device)
    with cp.cuda.Device(device):
        cupy_handle = int(cp.cuda.get_current_stream().ptr)
    if cupy_handle != int(torch_stream.cuda_stream):
        raise StreamMismatchError(
            f"expected CuPy and PyTorch to share the current stream on cuda:{device} while "
            f"CuPy allocates from PyTorch's pool (got CuPy stream {cupy_handle:#x}, PyTorch "
            f"stream {int(torch_stream.cuda_stream):#x}); memory would be ordered on the wrong "
            "stream. Use `with interop.stream(s):` instead of torch.cuda.stream / "
            "cupy.cuda.Stream alone."
        )
    if size == 0:
        return 0
    return int(th.cuda.caching_allocator_alloc(size, device, torch_stream))


def _free(ptr: int, device: int) -> None:
    if ptr:
        _backends.torch().cuda.caching_allocator_delete(ptr)


class _TorchAllocatorScope:
    """The installed allocator; restores CuPy's previous one on ``__exit__``."""

    def __init__(self) -> None:
        _backends.require_torch_cuda()
        cp = _backends.require_cupy_device()
        self._cp = cp
        self._previous = cp.cuda.get_allocator()
        self._allocator = cp.cuda.PythonFunctionAllocator(_malloc, _free)
        cp.cuda.set_allocator(self._allocator.malloc)

    def __enter__(self) -> _TorchAllocatorScope:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cp.cuda.set_allocator(self._previous)


def use_torch_allocator() -> Any:
    """Serve CuPy's device allocations from PyTorch's caching allocator.

    Usable as a plain call (for the rest of the process, in this thread) or as
    a context manager (restores CuPy's previous allocator on exit, also on
    an exception)::

        interop.use_torch_allocator()
        with interop.use_torch_allocator(): ...

    Notes
    -----
    One pool for both libraries: memory freed by CuPy goes back to PyTorch's
    cache and can be reused by either, and ``torch.cuda.memory_allocated()``
    counts CuPy's arrays. PyTorch's allocator is stream-ordered, so each
    CuPy allocation is made on PyTorch's current stream; an allocation while
    CuPy's current stream differs from PyTorch's raises
    :class:`StreamMismatchError` instead of handing out memory ordered on the
    wrong stream — use :func:`interop.stream` to set both. CuPy's allocator
    setting is per thread (``cupy.cuda.set_allocator``): call this in each
    thread that allocates with CuPy.

    Raises
    ------
    BackendUnavailableError
        PyTorch or CuPy is not installed.
    NoDeviceError
        No CUDA device is visible.
    """
    return _TorchAllocatorScope()
