"""One memory pool for PyTorch and CuPy: ``interop.use_torch_allocator`` (docs/streams.md)."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from . import _backends, _process, streams
from .errors import InteropError

__all__ = ["StreamMismatchError", "use_torch_allocator"]


class StreamMismatchError(InteropError, RuntimeError):
    """CuPy allocated while its current stream differs from PyTorch's."""


class DeferredFrees:
    """Frees deferred while other streams may use a block (:meth:`free`: from destructors,
    anywhere, so it only queues and the lock is only tried)."""

    def __init__(
        self,
        record: Callable[[int, int], Any],
        delete: Callable[[int], None],
        capturing: Callable[[], bool] | None = None,
    ) -> None:
        self._record = record
        self._delete = delete
        self._capturing = capturing or (lambda: False)
        self.reset()

    def reset(self) -> None:
        """Forget every block (a forked child's are its parent's CUDA context's)."""
        # ptr -> (device, stream, tick); first: a free run meanwhile finds no parent's block
        self._live: dict[int, tuple[int, int, int]] = {}
        # guards the handling of _freed and all of _aside and _waiting (only ever tried)
        self._lock = threading.Lock()
        self._freed: collections.deque[int] = collections.deque()  # not yet looked at
        self._aside: list[tuple[int, int, list[int]]] = []  # ptr, device, streams: no event yet
        self._waiting: list[tuple[int, list[Any]]] = []  # ptr, events not yet seen complete

    def allocated(self, ptr: int, device: int, handle: int) -> None:
        self._live[ptr] = (device, handle, streams.stream_uses.now())  # one store: atomic

    def free(self, ptr: int) -> None:
        """Give ``ptr`` back now, or once the other streams it was used on reach this point."""
        self._freed.append(ptr)
        self._drain()

    def collect(self) -> None:
        """Hand on queued frees and give back every block whose events completed."""
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
        """One pass over the queue, the frees set aside and the waiting blocks (lock held)."""
        while self._freed:
            ptr = self._freed.popleft()
            entry = self._live.pop(ptr, None)
            if entry is None:
                # a parent's block in a forked child (a destructor: no exception)
                continue
            device, handle, tick = entry
            others = streams.stream_uses.since(tick, device)
            others.discard(handle)
            if others:
                self._aside.append((ptr, device, sorted(others)))
            else:
                self._delete(ptr)
        # a block whose event or delete fails is lost (never handed out early); the error raises
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
            self._event.record(streams.cupy_stream(handle, device))

    def query(self) -> bool:
        return bool(self._event.done)


# ptr -> the tensor of a block CuPy freed, kept until _frees gives it back (a parent's: forever)
_held: dict[int, Any] = {}


def _release(ptr: int) -> None:
    _held.pop(ptr, None)  # the last reference: PyTorch's pool has the block again


_frees = DeferredFrees(_RecordedEvent, _release, streams.capture_under_way)
_process.at_fork("deferred frees", _frees.reset)


class TorchBlock:
    """Owner of a :class:`TorchAllocator` block: its tensor, deferred (``deferred``: ptr) or not."""

    __slots__ = ("deferred", "maker", "tensor")

    def __init__(self, tensor: Any, deferred: int, maker: TorchAllocator | None) -> None:
        self.tensor, self.deferred, self.maker = tensor, deferred, maker

    def __del__(self) -> None:
        if self.deferred:
            _held[self.deferred] = self.tensor
            _frees.free(self.deferred)


class TorchAllocator:
    """A CuPy allocator of ``uint8`` tensors on PyTorch's current stream (``pinned``: the
    ``(device, stream ptr)`` of a ``torch_op`` call, whose frees are not deferred)."""

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
                f"expected an interop.torch_op to allocate on cuda:{self.pinned[0]}'s stream (got "
                f"{handle:#x} of cuda:{device}); do not switch CuPy's device or stream in it"
            )
        try:
            tensor = th.empty((size,), dtype=th.uint8, device=th.device("cuda", device))
        except th.cuda.OutOfMemoryError as exc:
            # CuPy's own error, which CuPy code and its users catch (PyTorch's is a RuntimeError)
            raise cp.cuda.memory.OutOfMemoryError(size, th.cuda.memory_allocated(device)) from exc
        ptr = tensor.data_ptr()
        # a torch_op call's blocks are used on its stream only: no deferred free
        deferred = ptr if self.pinned is None else 0
        if deferred:
            _frees.allocated(ptr, device, 0 if handle == streams.LEGACY_DEFAULT else handle)
        memory = cp.cuda.UnownedMemory(ptr, size, TorchBlock(tensor, deferred, self), device)
        return cp.cuda.MemoryPointer(memory, 0)


def _check_streams(device: int, cupy_handle: int) -> None:
    """Raise unless CuPy's current stream ``cupy_handle`` is PyTorch's on ``device``."""
    torch_handle = streams.torch_stream_handle(device)
    if cupy_handle == streams.PER_THREAD_DEFAULT and torch_handle != streams.PER_THREAD_DEFAULT:
        raise StreamMismatchError(
            "expected a CuPy stream PyTorch can allocate on (got the per-thread default stream: "
            "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1); use `with interop.stream(s):`, or unset it"
        )
    if not streams.same_stream(cupy_handle, torch_handle):
        raise StreamMismatchError(
            f"expected CuPy and PyTorch to share the current stream on cuda:{device} (got CuPy "
            f"{cupy_handle:#x}, PyTorch {torch_handle:#x}); use `with interop.stream(s):`"
        )


def torch_storage_of(memory: Any, maker: TorchAllocator | None = None) -> Any:
    """The tensor holding CuPy ``memory`` if a TorchAllocator (``maker``) made it, else None."""
    owner = getattr(memory, "_owner", None)
    if isinstance(owner, TorchBlock) and (maker is None or owner.maker is maker):
        return owner.tensor
    return None


def thread_setting(cp: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """CuPy's getter and setter of the calling thread's own allocator (CuPy >= 7)."""
    return cp.cuda.memory._get_thread_local_allocator, cp.cuda.memory._set_thread_local_allocator


_process_allocator = TorchAllocator()  # the one use_torch_allocator installs


class AllocatorScope:
    """``malloc`` as this thread's allocator: for the block, or process-wide once dropped."""

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

    def __exit__(self, *exc_info: object) -> None:
        if self._blocks:
            self._set(self._blocks.pop())

    def __del__(self) -> None:
        # runs in any thread: no lock, and nothing let out (a finalizer could only print it)
        with contextlib.suppress(BaseException):
            if self.__dict__.get("_plain"):
                self._plain = False
                self._install_process_wide()

    def _install_process_wide(self) -> None:
        if threading.get_ident() == self._thread and self._get() is self._malloc:
            self._set(self._previous)  # the thread follows the process-wide setting again
        # cupy.cuda.set_allocator refuses a thread with its own setting: step out of it.
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

    A plain call (every thread, for the rest of the process) or a ``with`` block
    (this thread, until the block exits; blocks nest).

    Returns
    -------
    AllocatorScope
        Enter it in the thread that made it (``RuntimeError`` otherwise).

    Notes
    -----
    Allocations are on PyTorch's current stream, which must be CuPy's (see
    :func:`interop.stream`); a block used on other streams waits for them when freed.

    Raises
    ------
    StreamMismatchError
        On allocation: CuPy's current stream is not PyTorch's.
    BackendUnavailableError, NoDeviceError
        PyTorch or CuPy is not installed, or no CUDA device is visible.
    """
    _backends.require_torch_cuda()
    cp = _backends.require_cupy_device()
    return AllocatorScope(cp, _process_allocator)
