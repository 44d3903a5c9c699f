"""Host stages between slots and host arrays (:class:`CopyOut`, :class:`CopyIn`), and
the host-to-host engine (no staging; a thread pool, one chunk per task)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np

from .. import dtypes
from ..arrays import bits, host_values
from .backend import HostStage
from .future import Transfer
from .hybrid import PAGE
from .plan import Plan, split_rows
from .workers import host_pool, settle, submit

__all__ = ["HOST_CHUNK_MAX", "CopyIn", "CopyOut", "host_chunk_bytes", "host_engine", "run_chunk"]

HOST_CHUNK_MAX = 256 << 20


def host_chunk_bytes(nbytes: int, chunk: int, threads: int) -> int:
    """A host-to-host copy's chunk: one per thread, at least ``chunk``, at most 256 MiB."""
    # No staging buffer: the chunk only sets the progress/cancel granularity and
    # the parallelism. On 2 cores, 256 MiB in 32 MiB pieces was 1.5x slower than
    # one numpy.copyto (libc's large-copy strategy works per call); a piece per
    # thread beat it.
    per_thread = -(-nbytes // max(1, threads))
    return max(chunk, min(per_thread, HOST_CHUNK_MAX))


class CopyOut:
    """Copy each chunk into host ``out`` from its slot, or (host to host) from ``source``:
    values converted to ``out``'s dtype where ``cast``, else bit for bit."""

    def __init__(self, out: np.ndarray, source: Any = None, *, cast: bool = False) -> None:
        self.out, self.source, self.cast = out, source, cast
        self.view = dtypes.int_view_of_numpy(out.dtype)

    def pieces(self, plan: Plan, i: int, threads: int) -> list[tuple]:
        return split_rows(plan.shapes[i], plan.sizes[i], threads)

    def touch(self, plan: Plan, i: int, piece: tuple) -> None:
        """Fault in the pages of a new C-contiguous ``out`` that ``piece`` of chunk ``i`` fills."""
        self.out[plan.chunks[i]][piece].reshape(-1).view(np.uint8)[::PAGE] = 0

    def run(self, plan: Plan, i: int, piece: tuple, buf: np.ndarray | None) -> None:
        dst = self.out[plan.chunks[i]][piece]
        if buf is not None:
            np.copyto(bits(dst), buf.view(self.view).reshape(plan.shapes[i])[piece])
        elif self.cast:
            np.copyto(dst, host_values(self.source[plan.chunks[i]][piece]), casting="unsafe")
        else:
            np.copyto(bits(dst), bits(host_values(self.source[plan.chunks[i]][piece])))


class CopyIn:
    """Fill each slot from host ``source``'s chunk (bits applied, byte order to ``dtype``)."""

    def __init__(self, source: Any, dtype: np.dtype) -> None:
        self.source = source
        self.view = dtypes.int_view_of_numpy(dtype)

    def pieces(self, plan: Plan, i: int, threads: int) -> list[tuple]:
        return split_rows(plan.shapes[i], plan.sizes[i], threads)

    def run(self, plan: Plan, i: int, piece: tuple, buf: np.ndarray | None) -> None:
        assert buf is not None  # a slot: CopyIn is the host end of host-to-device copies
        part = bits(host_values(self.source[plan.chunks[i]][piece]))
        np.copyto(buf.view(self.view).reshape(plan.shapes[i])[piece], part)


def run_chunk(stage: HostStage, plan: Plan, i: int) -> None:
    """Host to host: ``stage`` moves chunk ``i`` whole, on the calling thread."""
    for piece in stage.pieces(plan, i, 1):
        stage.run(plan, i, piece, None)


def host_engine(plan: Plan, stage: HostStage, threads: int) -> Callable[[Transfer], None]:
    """A host-to-host engine: ``stage`` moves each chunk whole, ``threads`` at once, in order."""

    copy = partial(run_chunk, stage, plan)

    def run(transfer: Transfer) -> None:
        count = len(plan.chunks)
        if count == 1 or threads <= 1:  # nothing to overlap: no thread to start
            for i in range(count):
                transfer.check_cancel()
                copy(i)
                transfer.chunk_done(i)
            return
        window = threads * 2
        pool = host_pool(threads)
        pending: dict[int, Future[None]] = {}
        try:
            for i in range(count):
                transfer.check_cancel()
                pending[i] = submit(pool, copy, i)
                if len(pending) >= window:
                    first = min(pending)
                    pending.pop(first).result()
                    transfer.chunk_done(first)
            for i in sorted(pending):
                transfer.check_cancel()
                pending.pop(i).result()
                transfer.chunk_done(i)
        finally:
            settle(pending.values())  # none left running when the transfer ends

    return run
