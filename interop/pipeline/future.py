"""``Transfer``: a chunked copy running on its own thread, as a small future.

Its engine reports chunks as they complete; the future keeps the in-order
prefix, drives progress, and re-raises the engine's error in the caller.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from .. import _process
from ..errors import (
    InvalidTypeError,
    InvalidValueError,
    TransferError,
    TransferTimeoutError,
    UsageError,
)
from .progress import Progress

__all__ = ["Cancelled", "Transfer"]


class Cancelled(Exception):
    """Raised inside an engine when :meth:`Transfer.cancel` was called."""


_running: weakref.WeakSet[Transfer] = weakref.WeakSet()
_running_lock = threading.Lock()


class Transfer:
    """A running chunked copy, returned by :func:`interop.copy_to_host_async`
    and :func:`interop.copy_to_device_async`.

    Attributes
    ----------
    nbytes : int
        Total bytes to copy.
    """

    def __init__(
        self,
        result: Any,
        sizes: list[int],
        progress: Progress,
        *,
        func: str,
        order: str = "the source's C order",
    ) -> None:
        self.nbytes = sum(sizes)
        self._result: Any = result
        self._sizes = sizes
        self._progress = progress
        self._func = func
        self._order = order
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._cancelled = threading.Event()
        self._complete = [False] * len(sizes)
        self._next = 0
        self._bytes_done = 0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # the process whose thread runs the engine
        self._runner: int | None = None  # that thread's ident, once it runs
        self._settled = False  # under _lock: the engine has ended; cancel() answers False

    # -- used by the engines, from the transfer's own thread only
    def chunk_done(self, i: int) -> None:
        """Mark chunk ``i`` complete; advance the in-order prefix and progress."""
        with self._lock:
            self._complete[i] = True
            advanced = 0
            while self._next < len(self._sizes) and self._complete[self._next]:
                advanced += self._sizes[self._next]
                self._next += 1
            self._bytes_done += advanced
        if advanced:  # outside the lock: a slow callback must not block bytes_done readers
            self._progress.add(advanced)

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` if :meth:`cancel` was called."""
        if self._cancelled.is_set():
            raise Cancelled

    def start(self, run: Callable[[Transfer], None], *, inline: bool = False) -> Transfer:
        """Run ``run(self)`` on the transfer's thread (``inline``: here, now); return ``self``.

        Inline serves the blocking calls, and works where no thread can start
        (an ``atexit`` handler); the error is raised by :meth:`result` either way.
        """

        def target() -> None:
            nonlocal run
            self._runner = threading.get_ident()
            try:
                if not self.nbytes:
                    self._progress.add(0)  # a callback still sees (0, 0): it ends at the total
                else:
                    run(self)
            except BaseException as exc:  # re-raised in the caller by result()
                self._error = _detached(exc)
            finally:
                # the engine's closures (source, device memory) go while the thread still
                # counts as running, never once finished (the interpreter may be finalising)
                run = _finished_engine
                with self._lock:
                    self._settled = True
                    if self._error is None and self._cancelled.is_set():
                        self._error = Cancelled()  # cancel() said True after the last chunk
                try:
                    self._progress.close()
                finally:
                    with _running_lock:
                        _running.discard(self)
                    self._finished.set()

        with _running_lock:
            _running.add(self)
        if inline:
            target()
            return self
        self._thread = threading.Thread(target=target, name=f"interop-{self._func}", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            with _running_lock:
                _running.discard(self)
            raise
        return self

    # -- public
    @property
    def bytes_done(self) -> int:
        """Bytes of the completed prefix (in the source's C order)."""
        with self._lock:
            return self._bytes_done

    def done(self) -> bool:
        """True once the transfer has finished, failed or been cancelled (or in a forked child)."""
        return self._finished.is_set() or self._pid != os.getpid()

    def cancel(self) -> bool:
        """Stop the transfer after the chunks in flight.

        Returns
        -------
        bool
            True: :meth:`result` raises a :class:`~interop.errors.TransferError`
            (even if every chunk was complete). False: it had already ended (or
            this is a forked child), and :meth:`result` gives its outcome.
        """
        with self._lock:
            if self._settled or self._pid != os.getpid():
                return False
            self._cancelled.set()
            return True

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the transfer and return its destination (``out``).

        Parameters
        ----------
        timeout : float or None
            Seconds to wait at most (negative: none); None or ``inf``: until it ends.

        Raises
        ------
        TransferTimeoutError
            Not finished within ``timeout`` (a ``TimeoutError``; the transfer goes on).
        TransferError
            A chunk failed, the transfer was cancelled, or it runs in the parent of
            this forked process; says which bytes are complete, holds no array.
        UsageError
            Called from the transfer's own progress callback (it would wait for itself).
        InvalidTypeError, InvalidValueError
            ``timeout`` is not None or a number, or is NaN.
        KeyboardInterrupt
            Interrupted while waiting: the transfer is cancelled and released first.
        """
        seconds = _seconds(timeout)
        if not self._finished.is_set():
            if self._pid != os.getpid():
                raise self._lost_at_fork()
            if self._runner == threading.get_ident():
                raise UsageError(
                    f"expected {self._func}'s result() to be called from another thread (got "
                    "a call from its own progress callback, which would wait for itself); "
                    "call result() where the transfer was started"
                )
        try:
            if not self._finished.wait(seconds):
                raise TransferTimeoutError(
                    f"{self._func} not finished after {timeout} s "
                    f"({self.bytes_done} of {self.nbytes} bytes done)"
                )
        except KeyboardInterrupt:
            self.cancel()
            self._finished.wait()
            self._join()
            raise
        self._join()
        if self._error is not None:
            self._result = None  # a held error must not keep the destination alive
            raise self._failure(self._error)
        return self._result

    def __repr__(self) -> str:
        if not self._finished.is_set():
            state = "cancelling" if self._cancelled.is_set() else "running"
            if self._pid != os.getpid():
                state = f"running in process {self._pid}"
        elif self._error is None:
            state = "done"
        else:
            state = "cancelled" if isinstance(self._error, Cancelled) else "failed"
        return f"<Transfer {self._func}: {self.bytes_done} of {self.nbytes} bytes, {state}>"

    def _join(self) -> None:
        # Finished: the thread is past its last statement; joining it means
        # it (and everything its frames referenced) is gone when result() ends.
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _lost_at_fork(self) -> TransferError:
        done = self._bytes_done  # not under _lock: a thread of the parent may have held it
        return TransferError(
            f"{self._func} was running in process {self._pid} when this process was forked "
            "from it, so here it never finishes: call result() in the process that started "
            f"it (bytes [0, {done}) of {self.nbytes} (in {self._order}) were complete)",
            bytes_done=done,
            nbytes=self.nbytes,
        )

    def _failure(self, exc: BaseException) -> BaseException:
        if isinstance(exc, TransferError | KeyboardInterrupt):
            return exc
        done = self.bytes_done
        if exc is self._progress.raised:
            return exc  # the caller's own callback's: as itself (with a note of the bytes done)
        if isinstance(exc, Cancelled):
            what = "was cancelled"
        else:
            what = f"failed ({type(exc).__name__}: {exc})"
        err = TransferError(
            f"{self._func} {what}; bytes [0, {done}) of {self.nbytes} (in {self._order}) "
            "are complete, the rest of the destination is unspecified",
            bytes_done=done,
            nbytes=self.nbytes,
        )
        err.__cause__ = None if isinstance(exc, Cancelled) else exc
        return err


def _seconds(timeout: object) -> float | None:
    """``result``'s ``timeout`` checked: seconds, or None to wait until the end."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidTypeError(
            f"expected timeout to be None or a number of seconds (got {timeout!r})"
        )
    seconds = float(timeout)
    if math.isnan(seconds):
        raise InvalidValueError(
            f"expected timeout to be a number of seconds (got {timeout!r}); pass None to wait "
            "until the transfer ends"
        )
    return None if seconds > threading.TIMEOUT_MAX else seconds  # inf: no end, as None


def _finished_engine(transfer: Transfer) -> None:
    raise RuntimeError("this transfer has already run")


def _detached(exc: BaseException) -> BaseException:
    """``exc`` with its worker frames cleared (they hold the engine's streams, memory and
    source while the caller keeps the error), its traceback kept as a note."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    add_note = getattr(exc, "add_note", None)
    if add_note is not None and text:
        add_note("where the transfer ran:\n" + text)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def cancel_running() -> None:
    """Cancel every running transfer and join its thread (``atexit``: before finalising)."""
    with _running_lock:
        running = list(_running)
    for transfer in running:
        transfer.cancel()
    for transfer in running:
        transfer._finished.wait()
        transfer._join()
    for thread in threading.enumerate():  # finished, but still unwinding
        name = thread.name
        if (
            name.startswith("interop-")
            and not name.startswith("interop-host")  # the pool's: idle, ended by concurrent.futures
            and thread is not threading.current_thread()
        ):
            thread.join()


def _after_fork_in_child() -> None:
    # The transfer threads of the parent do not exist in the child: a lock one
    # of them held would never be released.
    global _running_lock
    _running_lock = threading.Lock()
    for transfer in list(_running):
        transfer._lock = threading.Lock()
    _running.clear()


atexit.register(cancel_running)
_process.at_fork("transfers", _after_fork_in_child)
