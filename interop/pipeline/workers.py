"""Host threads for transfers: one pool per process, grown to the most threads asked for.

At interpreter exit ``concurrent.futures`` refuses new work: pieces then run
on the calling thread, in the order they were submitted.
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
    """The process's pool of at least ``threads`` host threads (a larger one replaces it)."""
    global _pool, _size
    threads = max(1, int(threads))
    with _lock:
        if _pool is None or _size < threads:
            old, _pool, _size = _pool, ThreadPoolExecutor(threads, "interop-host"), threads
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def submit(pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(fn, *args)``, or at interpreter shutdown ``fn(*args)`` run here."""
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
    """Cancel the pieces not started and wait for the others (errors stay in the futures)."""
    futures = list(futures)
    for f in futures:
        f.cancel()
    wait_all(futures)


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist in the child; its lock may be held.
    global _lock, _pool, _size
    _lock, _pool, _size = threading.Lock(), None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)
