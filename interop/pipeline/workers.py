"""Host threads for a transfer's pieces, and what to do when none can be had.

At interpreter exit (in ``atexit`` handlers) ``concurrent.futures`` refuses new
work ("cannot schedule new futures after interpreter shutdown"). A copy made
there still works: its pieces run on the calling thread instead, one after
the other, in the order they were submitted.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["submit"]

T = TypeVar("T")


def submit(pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(fn, *args)``, or ``fn(*args)`` run here (its outcome in a
    finished future) when the interpreter is shutting down and no thread may
    start."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError as exc:
        if "interpreter shutdown" not in str(exc):
            raise
    done: Future[T] = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # a KeyboardInterrupt goes straight up, as on any thread
        done.set_exception(exc)
    return done
