"""Host threads for transfers: one pool per process, and what to do when no
thread can be had.

The pool grows to the most threads a transfer has asked for (``host_threads``)
and is shared by every transfer of the process, so a transfer starts no thread
of its own; a forked child starts with none. At interpreter exit (in
``atexit`` handlers) ``concurrent.futures`` refuses new work ("cannot schedule
new futures after interpreter shutdown"): a copy made there still works, its
pieces run on the calling thread, one after the other, in the order they were
submitted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any, TypeVar

__all__ = ["host_pool", "settle", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_size = 0


def host_pool(threads: int) -> Executor:
    """The process's pool of host threads, with at least ``threads`` of them.

    A larger request replaces the pool by a larger one; the old one finishes
    the work it has and its threads end.
    """
    global _pool, _size
    threads = max(1, int(threads))
    with _lock:
        if _pool is None or _size < threads:
            old, _pool, _size = _pool, ThreadPoolExecutor(threads, "interop-host"), threads
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def submit(pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(fn, *args)``, or ``fn(*args)`` run here (its outcome in a
    finished future) when the interpreter is shutting down and no thread may
    start."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
    done: Future[T] = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # a KeyboardInterrupt goes straight up, as on any thread
        done.set_exception(exc)
    return done


def settle(futures: Iterable[Future[Any]]) -> None:
    """Cancel the pieces not started and wait for the others to end (their
    errors are the caller's to read from the futures)."""
    futures = list(futures)
    for f in futures:
        f.cancel()
    wait_all(futures)


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist in the child; its lock may be held.
    global _lock, _pool, _size
    _lock, _pool, _size = threading.Lock(), None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)
