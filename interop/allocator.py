"""One memory pool for PyTorch and CuPy: ``interop.use_torch_allocator``.

CuPy's allocations are served by PyTorch's caching allocator, through one CuPy
allocator, :class:`TorchAllocator` (each ``interop.torch_op`` call uses it too).
PyTorch's allocator is stream-ordered: a block is allocated for one stream and,
once freed, handed out again for work on that stream at once. Three rules keep
that safe:

* an allocation is made on PyTorch's current stream and only while CuPy's
  current stream is the same one (:class:`StreamMismatchError` otherwise);
* a block that may have been used on another stream -- one made current
  through ``interop.stream`` while the block was alive -- goes back to the pool
  only once an event recorded on that stream at the free has completed (what
  ``Tensor.record_stream`` does for tensors);
* while a CUDA graph capture is under way no event is recorded or queried
  (CUDA forbids both there, and they would invalidate the capture): such a
  free is set aside and gets its events once no capture is under way, as
  PyTorch's allocator does with its own blocks.

Frees come from CuPy's destructors, which the garbage collector may run in the
middle of any Python code, this module's included. Nothing a destructor
reaches here waits for a lock: a free is queued, and whichever call holds the
lock at that moment (or the next one) hands it on.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import _backends, _process, streams
from .errors import BackendUnavailableError, InteropError
from .streams import (
    LEGACY_DEFAULT,
    PER_THREAD_DEFAULT,
    capture_under_way,
    cupy_stream,
    same_stream,
    torch_stream_handle,
)

__all__ = ["StreamMismatchError", "use_torch_allocator"]


class StreamMismatchError(InteropError, RuntimeError):
    """CuPy allocated while its current stream differs from PyTorch's."""


def _never() -> bool:
    return False


class DeferredFrees:
    """The frees of a stream-ordered pool, deferred while other streams may
    still use a block, and while a CUDA graph capture forbids events.

    Parameters
    ----------
    record : callable
        ``record(device, handle)`` records and returns an event (with
        ``query()``) on stream ``handle`` of ``device``.
    delete : callable
        ``delete(ptr)`` gives a block back to the pool.
    capturing : callable, optional
        ``capturing()`` is True while a capture is under way that forbids
        recording or querying events from the calling thread. Asked only when
        an event is to be recorded or queried. Default: never.

    Notes
    -----
    :meth:`free` is called from CuPy's destructors, which the garbage
    collector may run while this thread is inside any method here. A free
    only queues the block; the queue is handled by whichever call holds the
    lock, which is taken without waiting: a call that finds it held leaves
    the work to its holder (this thread further up, or another thread), who
    looks at the queue again after releasing it. So no call ever waits on a
    lock, and none runs inside another.
    """

    def __init__(
        self,
        record: Callable[[int, int], Any],
        delete: Callable[[int], None],
        capturing: Callable[[], bool] | None = None,
    ) -> None:
        self._record = record
        self._delete = delete
        self._capturing = capturing or _never
        # guards the handling of _freed and all of _aside and _waiting; only ever taken
        # without blocking (see Notes)
        self._lock = threading.Lock()
        self._live: dict[int, tuple[int, int, int]] = {}  # ptr -> (device, stream, tick)
        self._freed: collections.deque[int] = collections.deque()  # not yet looked at
        self._aside: list[tuple[int, int, list[int]]] = []  # ptr, device, streams: no event yet
        self._waiting: list[tuple[int, list[Any]]] = []  # ptr, events not yet seen complete

    def allocated(self, ptr: int, device: int, handle: int) -> None:
        """Remember that ``ptr`` was allocated on stream ``handle`` of ``device``."""
        self._live[ptr] = (device, handle, streams.stream_uses.now())  # one store: atomic

    def free(self, ptr: int) -> None:
        """Give ``ptr`` back now, or once the other streams it may be used on
        have reached this point (and no capture forbids finding that out)."""
        self._freed.append(ptr)
        self._drain()

    def collect(self) -> None:
        """Hand on queued frees, record the events of frees set aside during
        a capture, and give back every block whose events have completed.
        During a capture, no event is recorded or queried."""
        if self._freed or self._aside or self._waiting:  # each allocation asks: stay cheap
            self._drain()

    def _drain(self) -> None:
        while self._lock.acquire(blocking=False):
            try:
                self._step()
            finally:
                self._lock.release()
            if not self._freed:  # nothing queued while the lock was held
                return

    def _step(self) -> None:
        """With the lock held: one pass over the queue, the frees set aside
        and the blocks waiting for their events."""
        while self._freed:
            ptr = self._freed.popleft()
            entry = self._live.pop(ptr, None)
            if entry is None:
                # Not allocated through this pool: a parent's block in a forked
                # child, whose CUDA context is gone. CuPy frees from a destructor,
                # where an exception would only be printed.
                continue
            device, handle, tick = entry
            others = streams.stream_uses.since(tick, device)
            others.discard(handle)
            if others:
                self._aside.append((ptr, device, sorted(others)))
            else:
                self._delete(ptr)
        # A block whose event cannot be recorded or queried, or that cannot be
        # given back, is dropped (lost to the pool rather than handed out while
        # a stream may still use it); the error goes to the caller, the other
        # blocks stay.
        if not (self._aside or self._waiting) or self._capturing():
            return
        if self._aside:
            aside, self._aside = self._aside, []
            for i, (ptr, device, handles) in enumerate(aside):
                try:
                    events = [self._record(device, h) for h in handles]
                except BaseException:
                    self._aside[:0] = aside[i + 1 :]
                    raise
                self._waiting.append((ptr, events))
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for i, (ptr, events) in enumerate(waiting):
                try:
                    done = all(e.query() for e in events)
                    if done:
                        self._delete(ptr)
                except BaseException:
                    self._waiting[:0] = waiting[i + 1 :]
                    raise
                if not done:
                    self._waiting.append((ptr, events))

    @property
    def deferred(self) -> int:
        """Blocks freed by CuPy and not yet given back (set aside or waiting)."""
        return len(self._aside) + len(self._waiting)

    @property
    def set_aside(self) -> int:
        """Blocks freed during a capture whose events are not recorded yet."""
        return len(self._aside)


class _RecordedEvent:
    """A CUDA event recorded on a stream, queried without blocking."""

    def __init__(self, device: int, handle: int) -> None:
        cp = _backends.cupy()
        with cp.cuda.Device(device):
            self._event = cp.cuda.Event(disable_timing=True)
            self._event.record(cupy_stream(handle, device))

    def query(self) -> bool:
        return bool(self._event.done)


# ptr -> the tensor of a block CuPy freed, kept until _frees gives the block back (for
# ever in a forked child, for a block of its parent: the child's _frees never saw it)
_held: dict[int, Any] = {}


def _release(ptr: int) -> None:
    _held.pop(ptr, None)  # the last reference: PyTorch's pool has the block again


_frees = DeferredFrees(_RecordedEvent, _release, capture_under_way)


class TorchBlock:
    """The owner of CuPy memory a :class:`TorchAllocator` made: a ``uint8``
    tensor, handed to the deferred frees (``deferred``: its pointer, else 0)
    when CuPy frees the memory."""

    __slots__ = ("deferred", "maker", "tensor")

    def __init__(self, tensor: Any, deferred: int, maker: TorchAllocator | None) -> None:
        self.tensor, self.deferred, self.maker = tensor, deferred, maker

    def __del__(self) -> None:
        if self.deferred:
            _held[self.deferred] = self.tensor
            _frees.free(self.deferred)


class TorchAllocator:
    """A CuPy allocator (``size -> MemoryPointer``) that serves CuPy from
    PyTorch's caching allocator: the one ``use_torch_allocator`` installs, and
    the one each CUDA call of an ``interop.torch_op`` installs for its thread.

    Each allocation is a ``torch.empty(size, dtype=torch.uint8)`` tensor on
    PyTorch's current stream of CuPy's current device: ordinary PyTorch storage,
    which CUDA graphs and CUDA-graph trees account for like any tensor's (see
    :func:`torch_storage_of`). ``pinned``, ``(device, CuPy stream pointer)``,
    is the one stream it may allocate on (a ``torch_op`` call), whose blocks
    go back to PyTorch's pool when CuPy frees them; without it, CuPy's current
    stream must be PyTorch's, and a freed block goes through
    :class:`DeferredFrees`.

    Raises
    ------
    StreamMismatchError
        An allocation on another stream than those.
    cupy.cuda.memory.OutOfMemoryError
        PyTorch's pool cannot serve it (chained to PyTorch's error).
    """

    __slots__ = ("pinned",)

    def __init__(self, pinned: tuple[int, int] | None = None) -> None:
        self.pinned = pinned

    def __call__(self, size: int) -> Any:
        th, cp = _backends.torch(), _backends.cupy()
        _frees.collect()
        device = cp.cuda.runtime.getDevice()
        handle = int(cp.cuda.get_current_stream().ptr)
        if self.pinned is None:
            _check_streams(device, handle)
        elif (device, handle) != self.pinned:
            raise StreamMismatchError(
                f"expected CuPy to allocate on PyTorch's current stream of cuda:{self.pinned[0]} "
                f"inside an interop.torch_op (got stream {handle:#x} of cuda:{device}); do not "
                "switch CuPy's device or stream inside the function: it already runs on "
                "PyTorch's current stream"
            )
        try:
            tensor = th.empty((size,), dtype=th.uint8, device=th.device("cuda", device))
        except th.cuda.OutOfMemoryError as exc:
            # CuPy's own error, which CuPy code and its users catch (PyTorch's is a RuntimeError)
            raise cp.cuda.memory.OutOfMemoryError(size, th.cuda.memory_allocated(device)) from exc
        ptr = tensor.data_ptr()
        # A torch_op call's blocks are used on its stream only: PyTorch gives them back
        # when CuPy drops them, as for any tensor; the others go through _frees.
        deferred = ptr if self.pinned is None else 0
        if deferred:
            _frees.allocated(ptr, device, 0 if handle == LEGACY_DEFAULT else handle)
        memory = cp.cuda.UnownedMemory(ptr, size, TorchBlock(tensor, deferred, self), device)
        return cp.cuda.MemoryPointer(memory, 0)


def _check_streams(device: int, cupy_handle: int) -> None:
    """Raise unless CuPy's current stream ``cupy_handle`` is PyTorch's on ``device``."""
    torch_handle = torch_stream_handle(device)
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


def torch_storage_of(memory: Any, maker: TorchAllocator | None = None) -> Any:
    """The tensor whose storage holds CuPy ``memory`` (a ``BaseMemory``) if a
    TorchAllocator (``maker``, where given) made it, else None."""
    owner = getattr(memory, "_owner", None)
    if isinstance(owner, TorchBlock) and (maker is None or owner.maker is maker):
        return owner.tensor
    return None


def thread_setting(cp: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """CuPy's getter and setter of the calling thread's own allocator (what
    ``cupy.cuda.using_allocator`` sets)."""
    memory = cp.cuda.memory
    get = getattr(memory, "_get_thread_local_allocator", None)
    set_ = getattr(memory, "_set_thread_local_allocator", None)
    if get is None or set_ is None:
        raise BackendUnavailableError(
            "expected a CuPy with thread-local allocators (cupy.cuda.using_allocator) (got "
            f"CuPy {getattr(cp, '__version__', '?')!r} without them); upgrade CuPy"
        )
    return get, set_


# The two forms. A scope makes the allocator the calling thread's own (CuPy's
# thread-local setting) the moment it is made, so no other thread ever sees a
# block's allocator, not even between the call and the `with`. Entered as a
# block, it keeps it for the block and gives the thread its previous setting
# back at exit. Dropped without having been entered, it was the plain call: it
# then installs the allocator for the whole process (cupy.cuda.set_allocator)
# and gives the thread its previous setting back. In CPython a plain-call
# statement drops it at once. No lock is taken: the garbage collector may drop
# a scope in the middle of anything, this module included.
_process_allocator = TorchAllocator()  # the one use_torch_allocator installs


class AllocatorScope:
    """CuPy allocator ``malloc``, the calling thread's from construction on:
    for the block where entered as a ``with`` block; for every thread, for the
    rest of the process, once dropped without having been entered."""

    def __init__(self, cp: Any, malloc: Any) -> None:
        self._get, self._set = thread_setting(cp)
        self._cp = cp
        self._malloc = malloc
        self._thread = threading.get_ident()
        self._previous = self._get()
        self._blocks: list[Any] = []  # the thread's setting before each open block
        self._set(malloc)
        self._plain = True  # not entered (yet): the plain call, process-wide when dropped

    def __enter__(self) -> AllocatorScope:
        here = threading.get_ident()
        if here != self._thread:
            raise RuntimeError(
                "expected `with interop.use_torch_allocator():` in the thread that called "
                f"use_torch_allocator() (got thread {here}; it was called in thread "
                f"{self._thread}); call it in the thread that runs the block"
            )
        if self._plain:  # the block takes over the install made by the call
            self._plain = False
            self._blocks.append(self._previous)
        else:  # entered again
            self._blocks.append(self._get())
            self._set(self._malloc)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._blocks:
            self._set(self._blocks.pop())

    def __del__(self) -> None:
        # Runs wherever the last reference goes: the plain-call statement, or
        # the garbage collector in any thread, in the middle of any code. It
        # takes no lock and lets nothing out.
        try:
            if self.__dict__.get("_plain"):
                self._plain = False
                self._install_process_wide()
        except BaseException:  # a finalizer could only have it printed
            pass

    def _install_process_wide(self) -> None:
        if threading.get_ident() == self._thread and self._get() is self._malloc:
            self._set(self._previous)  # the thread follows the process-wide setting again
        # cupy.cuda.set_allocator refuses to run in a thread that has its own
        # setting (inside cupy.cuda.using_allocator): step out of it meanwhile.
        local = self._get()
        if local is not None:
            self._set(None)
        try:
            self._cp.cuda.set_allocator(self._malloc)
        finally:
            if local is not None:
                self._set(local)


def use_torch_allocator() -> Any:
    """Serve CuPy's device allocations from PyTorch's caching allocator.

    Usable as a plain call (every thread, for the rest of the process) or as
    a ``with`` block (this thread only, until the block exits, also on an
    exception; blocks nest and may overlap across threads)::

        interop.use_torch_allocator()
        with interop.use_torch_allocator(): ...

    Returns
    -------
    AllocatorScope
        From the call on, the calling thread's CuPy allocator, and no other
        thread's. Entered as a ``with`` block, it stays this thread's for the
        block. Discarded without being entered (a plain-call statement), it
        becomes every thread's, for the rest of the process. Enter it in the
        thread that made it (``RuntimeError`` otherwise).

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
    before the free has completed. During a CUDA graph capture no event is
    recorded or queried: such a block waits, unused, until a later
    allocation or free through the pool after the capture. interop's own
    temporaries (staging rows, a transfer's cast chunks) always come from
    CuPy's pool. When PyTorch's pool cannot
    serve an allocation, CuPy raises its own
    ``cupy.cuda.memory.OutOfMemoryError`` (chained to PyTorch's).

    Raises
    ------
    BackendUnavailableError
        PyTorch or CuPy is not installed.
    NoDeviceError
        No CUDA device is visible.
    """
    _backends.require_torch_cuda()
    cp = _backends.require_cupy_device()
    return AllocatorScope(cp, _process_allocator)


def _after_fork_in_child() -> None:
    # The parent's deferred frees belong to its CUDA context.
    global _frees
    _frees = DeferredFrees(_RecordedEvent, _release, capture_under_way)


_process.at_fork("deferred frees", _after_fork_in_child)
