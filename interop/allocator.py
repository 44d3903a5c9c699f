"""One memory pool for PyTorch and CuPy: ``interop.use_torch_allocator``.

CuPy's allocations are served by PyTorch's caching allocator. That allocator
is stream-ordered: a block is allocated for one stream and, once freed, handed
out again for work on that stream at once. Two rules keep that safe:

* an allocation is made on PyTorch's current stream and only while CuPy's
  current stream is the same one (:class:`StreamMismatchError` otherwise);
* a block that may have been used on another stream -- one made current
  through ``interop.stream`` while the block was alive -- goes back to the pool
  only once an event recorded on that stream at the free has completed (what
  ``Tensor.record_stream`` does for tensors).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from . import _backends, streams
from .errors import InteropError
from .streams import PER_THREAD_DEFAULT, cupy_stream, same_stream

__all__ = ["StreamMismatchError", "use_torch_allocator"]


class StreamMismatchError(InteropError, RuntimeError):
    """CuPy allocated while its current stream differs from PyTorch's."""


class DeferredFrees:
    """The frees of a stream-ordered pool, deferred while other streams may
    still use a block.

    Parameters
    ----------
    record : callable
        ``record(device, handle)`` records and returns an event (with
        ``query()``) on stream ``handle`` of ``device``.
    delete : callable
        ``delete(ptr)`` gives a block back to the pool.
    """

    def __init__(self, record: Callable[[int, int], Any], delete: Callable[[int], None]) -> None:
        self._record = record
        self._delete = delete
        self._lock = threading.Lock()
        self._live: dict[int, tuple[int, int, int]] = {}  # ptr -> (device, stream, tick)
        self._waiting: list[tuple[int, list[Any]]] = []  # ptr, events not yet seen complete

    def allocated(self, ptr: int, device: int, handle: int) -> None:
        """Remember that ``ptr`` was allocated on stream ``handle`` of ``device``."""
        tick = streams.stream_uses.now()
        with self._lock:
            self._live[ptr] = (device, handle, tick)

    def free(self, ptr: int) -> None:
        """Give ``ptr`` back now, or once the other streams it may be used on
        have reached this point."""
        self.collect()
        with self._lock:
            entry = self._live.pop(ptr, None)
        if entry is None:
            # Not allocated through this pool: a parent's block in a forked
            # child, whose CUDA context is gone. CuPy frees from a destructor,
            # where an exception would only be printed.
            return
        device, handle, tick = entry
        others = streams.stream_uses.since(tick, device) - {handle}
        if not others:
            self._delete(ptr)
            return
        events = [self._record(device, h) for h in sorted(others)]
        with self._lock:
            self._waiting.append((ptr, events))

    def collect(self) -> None:
        """Give back every deferred block whose events have completed."""
        with self._lock:
            ready = [ptr for ptr, events in self._waiting if all(e.query() for e in events)]
            self._waiting = [(p, e) for p, e in self._waiting if p not in ready]
        for ptr in ready:
            self._delete(ptr)

    @property
    def deferred(self) -> int:
        """Blocks freed by CuPy and not yet given back."""
        with self._lock:
            return len(self._waiting)


class _RecordedEvent:
    """A CUDA event recorded on a stream, queried without blocking."""

    def __init__(self, device: int, handle: int) -> None:
        cp = _backends.cupy()
        with cp.cuda.Device(device):
            self._event = cp.cuda.Event(disable_timing=True)
            self._event.record(cupy_stream(handle, device))

    def query(self) -> bool:
        return bool(self._event.done)


def _delete_cuda(ptr: int) -> None:
    _backends.torch().cuda.caching_allocator_delete(ptr)


_frees = DeferredFrees(_RecordedEvent, _delete_cuda)


def _malloc(size: int, device: int) -> int:
    """Allocate ``size`` bytes for CuPy from PyTorch's caching allocator,
    ordered on PyTorch's current stream of ``device``."""
    th = _backends.torch()
    cp = _backends.cupy()
    _frees.collect()
    torch_handle = int(th.cuda.current_stream(device).cuda_stream)
    with cp.cuda.Device(device):
        cupy_handle = int(cp.cuda.get_current_stream().ptr)
    if cupy_handle == PER_THREAD_DEFAULT and torch_handle != PER_THREAD_DEFAULT:
        raise StreamMismatchError(
            "expected CuPy's current stream to be one PyTorch can allocate on (got the "
            "per-thread default stream: CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1); run the CuPy code "
            "inside `with interop.stream(s):` with an explicit stream, or unset "
            "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"
        )
    if not same_stream(cupy_handle, torch_handle):
        raise StreamMismatchError(
            f"expected CuPy and PyTorch to share the current stream on cuda:{device} while "
            f"CuPy allocates from PyTorch's pool (got CuPy stream {cupy_handle:#x}, PyTorch "
            f"stream {torch_handle:#x}); memory would be ordered on the wrong stream. Use "
            "`with interop.stream(s):` instead of torch.cuda.stream / cupy.cuda.Stream alone."
        )
    if size == 0:
        return 0
    try:
        ptr = int(th.cuda.caching_allocator_alloc(size, device, th.cuda.current_stream(device)))
    except th.cuda.OutOfMemoryError as exc:
        # CuPy's own error, which CuPy code and its users catch (PyTorch's is a RuntimeError)
        raise cp.cuda.memory.OutOfMemoryError(size, th.cuda.memory_allocated(device)) from exc
    _frees.allocated(ptr, device, torch_handle)
    return ptr


def _free(ptr: int, device: int) -> None:
    if ptr:
        _frees.free(ptr)


# The process-wide install and the `with` blocks. Constructing a scope
# installs the allocator for the whole process (what the plain call means);
# entering it as a block instead makes it this thread's for the block
# (cupy.cuda.using_allocator) and takes the process-wide install back, unless
# a plain call happened meanwhile (a scope dropped without being entered).
_state = threading.Lock()
_pending = 0  # scopes constructed and neither entered nor dropped
_plain = False  # a plain call installed the allocator for the rest of the process
_base: Any = None  # CuPy's process-wide allocator before interop's
_allocator: Any = None


def _torch_malloc() -> Any:
    global _allocator
    if _allocator is None:
        _allocator = _backends.cupy().cuda.PythonFunctionAllocator(_malloc, _free)
    return _allocator.malloc


@contextlib.contextmanager
def _process_wide(cp: Any) -> Iterator[None]:
    """Act on CuPy's process-wide allocator setting, also from a thread inside
    ``cupy.cuda.using_allocator`` (which reads and refuses to change it)."""
    memory = cp.cuda.memory
    get_local = getattr(memory, "_get_thread_local_allocator", None)
    set_local = getattr(memory, "_set_thread_local_allocator", None)
    local = get_local() if get_local is not None else None
    if local is None or set_local is None:
        yield
        return
    set_local(None)
    try:
        yield
    finally:
        set_local(local)


class AllocatorScope:
    """CuPy allocator ``malloc`` installed for the process; a ``with`` block
    makes it this thread's only, for the block."""

    def __init__(self, cp: Any, malloc: Any) -> None:
        global _pending, _base
        self._cp = cp
        self._malloc = malloc
        self._block: Any = None
        self._counted = False
        with _state, _process_wide(cp):
            current = cp.cuda.get_allocator()
            if current != malloc:
                _base = current
            cp.cuda.set_allocator(malloc)
            _pending += 1
            self._counted = True

    def __enter__(self) -> AllocatorScope:
        global _pending
        with _state, _process_wide(self._cp):
            if self._counted:
                self._counted = False
                _pending -= 1
                if not _pending and not _plain:
                    self._cp.cuda.set_allocator(_base)
        self._block = self._cp.cuda.using_allocator(self._malloc)
        self._block.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        block, self._block = self._block, None
        if block is not None:
            block.__exit__(exc_type, exc, tb)

    def __del__(self) -> None:
        global _pending, _plain
        if getattr(self, "_counted", False):  # never entered: the plain call
            with _state:
                _pending -= 1
                _plain = True


def use_torch_allocator() -> Any:
    """Serve CuPy's device allocations from PyTorch's caching allocator.

    Usable as a plain call (every thread, for the rest of the process) or as
    a ``with`` block (this thread only, until the block exits, also on an
    exception; blocks nest and may overlap across threads)::

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
    wrong stream -- use :func:`interop.stream` to set both. A block used
    inside ``interop.stream(s)`` on a stream other than the one it was
    allocated on goes back to the pool only after the work queued on ``s``
    before the free has completed. interop's own staging memory always comes
    from CuPy's pool. When PyTorch's pool cannot serve an allocation, CuPy
    raises its own ``cupy.cuda.memory.OutOfMemoryError`` (chained to
    PyTorch's).

    Raises
    ------
    BackendUnavailableError
        PyTorch or CuPy is not installed.
    NoDeviceError
        No CUDA device is visible.
    """
    _backends.require_torch_cuda()
    cp = _backends.require_cupy_device()
    return AllocatorScope(cp, _torch_malloc())


def _after_fork_in_child() -> None:
    # A lock held by another thread at the fork would never be released in the
    # child; the parent's deferred frees belong to its CUDA context.
    global _state, _frees
    _state = threading.Lock()
    _frees = DeferredFrees(_RecordedEvent, _delete_cuda)


os.register_at_fork(after_in_child=_after_fork_in_child)
