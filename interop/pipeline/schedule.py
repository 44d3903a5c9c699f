"""The ring-of-slots schedule, written once for both directions.

Chunk ``i`` uses slot ``i % nslots``; each has a device step (queued by the
transfer's thread) and a host step (pieces on the host pool). docs/pipeline.md
draws the order of events and lists the rules kept on every path.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from . import trace
from .backend import Backend, DeviceData, Event, Staging, Stream, Timer
from .future import Transfer
from .hybrid import Hybrid
from .plan import Plan
from .ring import StagingRing, borrow_ring, note, return_ring
from .workers import host_pool, settle, submit

__all__ = ["HostTask", "SlotJob", "run_slots"]

HostTask = Callable[[np.ndarray], None]  # a piece of a chunk's host step, given the slot's bytes


@dataclass
class SlotJob:
    """Everything one run of the schedule needs."""

    direction: Literal["d2h", "h2d"]
    backend: Backend
    stream: Stream  # the copy stream, ordered after the data's in the caller's thread; owned
    plan: Plan
    data: DeviceData  # the source (d2h) or the destination (h2d)
    host_tasks: Callable[[int], Sequence[HostTask]]  # chunk i's pieces, given its slot's bytes
    threads: int
    # the direct form: chunk i's page-locked host address; one DMA each, no ring, no threads
    pinned: Callable[[int], int] | None = None
    # d2h, the hybrid form: part of out registered as the ring runs
    hybrid: Callable[[], Hybrid] | None = None
    # d2h into a new out: chunk i's page touches, one per piece, made before its DMA ends
    touch: Callable[[int], Sequence[Callable[[], None]]] | None = None


class _Errors:
    """The first error of a run; later ones become notes on it."""

    def __init__(self) -> None:
        self.first: BaseException | None = None

    def add(self, exc: BaseException, during: str = "") -> None:
        if self.first is None:
            self.first = exc
        elif exc is not self.first:
            note(self.first, f"{during or 'then'}: {type(exc).__name__}: {exc}")

    def attempt(self, during: str, step: Callable[[], Any]) -> None:
        try:
            step()
        except BaseException as exc:
            self.add(exc, during)


class _Run:
    def __init__(self, transfer: Transfer, job: SlotJob) -> None:
        self.transfer = transfer
        self.job = job
        self.plan = job.plan
        self.backend = job.backend
        self.stream = job.stream
        n = job.plan.nslots
        self.events: list[Event] = [job.backend.event() for _ in range(n)]
        self.pending: list[list[Future[None]]] = [[] for _ in range(n)]
        self.held: list[Any] = [None] * n  # device chunks kept alive until their DMA is done
        # each chunk's pieces run as at most `parts` tasks: several slots' chunks keep
        # every host thread busy, instead of each chunk ending at a barrier of all
        # (the pool has a thread more, for the hybrid's registrar)
        self.pool = None if job.pinned is not None else host_pool(job.threads)
        self.hybrid: Hybrid | None = None
        self.parts = max(1, -(-job.threads // max(1, n - 1)))
        self.ring: StagingRing | None = None
        self.staging: Staging | None = None
        # diagnosis only (interop.pipeline.trace): timing events around each device step
        self.trace = (
            trace.SlotTrace(job.direction, 0 if self.pool is None else job.threads)
            if trace.active()
            else None
        )
        self.timers: list[tuple[Timer, Timer]] = []

    # -- steps
    def submit(self, i: int, k: int, after: Event | None) -> None:
        """Submit the host pieces of chunk ``i`` (slot ``k``), each waiting ``after``."""
        ring, pool, backend = self.ring, self.pool, self.backend
        assert ring is not None
        assert pool is not None
        n = self.plan.sizes[i]
        pieces = self.trace.pieces if self.trace is not None else None

        def piece(tasks: list[HostTask], touches: list[Callable[[], None]]) -> None:
            submitted = trace.now()
            backend.use()  # a thread of the process's pool: it waits on this device's event
            for touch in touches:  # a new out's pages faulted in here, while the DMA runs
                touch()
            if after is not None:
                after.synchronize()
            waited = trace.now()
            with ring.host(k, n) as buf:
                for task in tasks:
                    task(buf)
            if pieces is not None:
                pieces.append((i, submitted, waited, trace.now()))

        tasks = list(self.job.host_tasks(i))
        touches = list(self.job.touch(i)) if self.job.touch is not None else []
        p = self.parts
        groups = [(tasks[g::p], touches[g::p]) for g in range(min(p, len(tasks)))]
        self.pending[k] = [submit(pool, piece, *group) for group in groups]

    def wait_host(self, k: int) -> None:
        """Wait for the host pieces in slot ``k``; re-raise the first failure."""
        futures, self.pending[k] = self.pending[k], []
        start = trace.now()
        for f in futures:
            f.result()
        if self.trace is not None:
            self.trace.issuer_wait_seconds += trace.now() - start

    def device_step(self, i: int, k: int, host: int | None = None) -> None:
        """Queue chunk ``i``'s DMA (slot ``k``, its pinned address, or ``host``), with pack
        or unpack; ``events[k]`` is recorded after it."""
        if host is None and self.job.pinned is not None:
            host = self.job.pinned(i)
        elif host is None:
            assert self.ring is not None
            host = self.ring.ptrs[k]
        backend, stream = self.backend, self.stream
        # a chunk made now (cast, resolved) comes from the library's own pool on its producer's
        # stream (a user's allocator would order it on another library's current stream)
        with backend.own_pool():
            chunk = self.job.data.chunk(self.plan.chunks[i])
        self.held[k] = chunk.view
        if chunk.produced_on is not None:
            ready = backend.event()
            ready.record(chunk.produced_on)
            stream.wait(ready)
        n = self.plan.sizes[i]
        contiguous = backend.is_contiguous(chunk.view)
        if not contiguous and self.staging is None:
            self.staging = backend.staging(self.plan.nslots, self.plan.slot_bytes)
            allocated = backend.event()  # the pool may hand out memory still in use there
            allocated.record(self.staging.stream)
            stream.wait(allocated)
        # traced runs: the device step alone, after every wait it was given
        timers = (backend.timer(), backend.timer()) if self.trace is not None else None
        if timers is not None:
            timers[0].record(stream)
        if contiguous:
            if self.job.direction == "d2h":
                backend.copy_to_host(host, chunk.view, n, stream)
            else:
                backend.copy_to_device(chunk.view, host, n, stream)
        else:
            assert self.staging is not None
            # ring and direct chunks share the n rows: pack and DMA are on the copy
            # stream, so a row's next pack follows its last DMA
            row = self.staging.view(k % self.plan.nslots, chunk.view)
            if self.job.direction == "d2h":
                backend.copy_on_device(row, chunk.view, stream)  # pack
                backend.copy_to_host(host, row, n, stream)
            else:
                backend.copy_to_device(row, host, n, stream)
                backend.copy_on_device(chunk.view, row, stream)  # unpack
        if timers is not None:
            timers[1].record(stream)  # before the event: the host sees both reached
            self.timers.append(timers)
        self.events[k].record(stream)

    # -- the two directions
    def device_to_host(self) -> None:
        """Each chunk through the next ring slot, or (hybrid) by DMA into ``out`` where the
        registrar registered its bytes: ``n`` of each in flight, events ``n`` to ``2n - 1``."""
        n, hybrid = self.plan.nslots, self.hybrid
        chunks = iter([(i, None) for i in range(len(self.plan.chunks))])
        take = hybrid.take if hybrid is not None else lambda _: next(chunks, None)
        if hybrid is not None:
            self.events += [self.backend.event() for _ in range(n)]
            self.held += [None] * n
        in_slot: list[int | None] = [None] * n  # the chunk each ring slot holds
        direct: collections.deque[tuple[int, int]] = collections.deque()  # (event, chunk)
        r = d = 0  # ring and direct chunks issued
        while True:
            k = r % n  # a direct chunk goes first while the ring's next slot is busy
            busy = in_slot[k] is not None and not all(f.done() for f in self.pending[k])
            item = take(busy and len(direct) < n)
            if item is None:
                break
            i, address = item
            self.transfer.check_cancel()
            if address is None:
                self.finish_slot(k, in_slot)
                self.device_step(i, k)
                self.submit(i, k, after=self.events[k])
                in_slot[k], r = i, r + 1
            else:
                if len(direct) == n:
                    self.finish_direct(*direct.popleft())
                self.device_step(i, n + d % n, address)
                direct.append((n + d % n, i))
                d += 1
        for j in range(n):  # oldest first
            self.finish_slot((r + j) % n, in_slot)
        while direct:
            self.finish_direct(*direct.popleft())

    def finish_slot(self, k: int, in_slot: list[int | None]) -> None:
        """Wait for ring slot ``k``'s host pieces: its chunk is complete, the slot free."""
        i, in_slot[k] = in_slot[k], None
        if i is not None:
            self.wait_host(k)
            self.held[k] = None
            self.transfer.chunk_done(i)

    def finish_direct(self, k: int, i: int) -> None:
        """Wait for direct chunk ``i``'s DMA (event ``k``): it is complete in ``out``."""
        assert self.hybrid is not None
        self.wait_event(k)
        self.transfer.chunk_done(i)
        self.hybrid.copied(i)

    def host_to_device(self) -> None:
        nslots, count = self.plan.nslots, len(self.plan.chunks)
        for i in range(min(nslots, count)):
            self.submit(i, i, after=None)
        for i in range(count):
            k = i % nslots
            self.transfer.check_cancel()
            self.wait_host(k)  # filled; for i >= nslots its fill waited for event[k]
            if i >= nslots:
                self.transfer.chunk_done(i - nslots)
            self.device_step(i, k)
            if i + nslots < count:
                self.submit(i + nslots, k, after=self.events[k])
        for i in range(max(0, count - nslots), count):
            self.events[i % nslots].synchronize()
            self.transfer.chunk_done(i)

    def direct(self) -> None:
        """Both directions with pinned host memory: DMAs only, ``nslots`` chunks in flight."""
        nslots, count = self.plan.nslots, len(self.plan.chunks)
        for i in range(count):
            k = i % nslots
            if i >= nslots:
                self.wait_event(k)
                self.transfer.chunk_done(i - nslots)
            self.transfer.check_cancel()
            self.device_step(i, k)
        for i in range(max(0, count - nslots), count):
            self.wait_event(i % nslots)
            self.transfer.chunk_done(i)

    def wait_event(self, k: int) -> None:
        """Wait until slot ``k``'s last device step is complete; release its chunk."""
        start = trace.now()
        self.events[k].synchronize()
        self.held[k] = None
        if self.trace is not None:
            self.trace.issuer_wait_seconds += trace.now() - start

    # -- release
    def release(self, errors: _Errors) -> None:
        pending = [f for futures in self.pending for f in futures]
        errors.attempt("stopping the host pieces", lambda: settle(pending))
        errors.attempt("synchronising the copy stream", self.stream.synchronize)
        if self.hybrid is not None:  # after the stream: no DMA into out is left
            errors.attempt("unregistering out", self.hybrid.close)
        self.held = []
        if self.staging is not None:
            errors.attempt("freeing the device staging", self.staging.free)
            self.staging = None
        if self.ring is not None:
            ring, self.ring = self.ring, None
            errors.attempt("returning the staging ring", lambda: return_ring(ring, errors.first))
        errors.attempt("closing the copy stream", self.stream.close)

    def publish_trace(self) -> None:
        """Read the timers and hand the trace on; a failure is recorded, never raised."""
        if self.trace is None:
            return
        self.trace.chunk_bytes = list(self.plan.sizes)
        try:
            self.trace.device_seconds = [end.seconds_since(start) for start, end in self.timers]
        except Exception as exc:
            self.trace.error = f"reading the timing events failed: {type(exc).__name__}: {exc}"
        trace.publish(self.trace)


def run_slots(transfer: Transfer, job: SlotJob) -> None:
    """Run ``job`` on the transfer's thread; raise its first error once all is released."""
    errors = _Errors()
    with job.backend.activate():
        run: _Run | None = None
        try:
            run = _Run(transfer, job)
            if run.trace is not None:
                run.trace.start = trace.now()
            if job.pinned is not None:
                run.direct()
            else:
                run.ring = borrow_ring(job.backend, job.plan.nslots, job.plan.slot_bytes)
                if job.direction == "d2h":
                    if job.hybrid is not None:
                        assert run.pool is not None
                        run.hybrid = job.hybrid()  # held before its registrar starts:
                        run.hybrid.start(run.pool)  # close() sees every registration
                    run.device_to_host()
                else:
                    run.host_to_device()
            if run.trace is not None:
                run.trace.end = trace.now()
        except BaseException as exc:
            errors.add(exc)
        finally:
            if run is not None:
                run.release(errors)
                if errors.first is None:
                    run.publish_trace()
            else:  # it may still hold the wait on the producer
                errors.attempt("synchronising the copy stream", job.stream.synchronize)
                errors.attempt("closing the copy stream", job.stream.close)
    if errors.first is not None:
        raise errors.first
