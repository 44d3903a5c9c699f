"""Host threads for transfers: one pool per process, grown to the most threads asked for.

At interpreter exit ``concurrent.futures`` refuses new work: pieces then run
on the calling thread, in the order they were submitted.
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
