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

from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_all
from typing import Any, TypeVar

from .. import _process

__all__ = ["host_pool", "settle", "submit"]

T = TypeVar("T")

# The process's pool of host threads, with at least ``threads`` of them (owned by
# interop._process, which resets it in a forked child).
host_pool = _process.host_pool.at_least


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
