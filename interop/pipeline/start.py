"""Where transfers enter the slot pipeline.

The public calls (:mod:`interop.transfer`), the ``.npy`` functions and
:mod:`interop.dask` describe their arrays once (:func:`interop.arrays.array_source`)
and start the pipeline here: :func:`device_to_host` and :func:`host_to_device`
run the slot schedule with a host step of the caller's (copy a slot into an
array or a file, fill a slot from an array or a file), and
:func:`device_to_device` queues one device copy ordered both ways between two
streams. The device that moves an array is found once, from its
:class:`~interop.arrays.Source` (:func:`backend_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import dtypes
from ..arrays import Source, bits, host_values
from ..config import config
from ..errors import CaptureError, InvalidTypeError
from .backend import Backend, DeviceData
from .future import Transfer
from .plan import Plan, plan_chunks, split_rows
from .progress import Progress
from .schedule import HostTask, SlotJob, run_slots

__all__ = [
    "HostStep",
    "backend_for",
    "device_to_device",
    "device_to_host",
    "drain_into",
    "fill_from",
    "host_to_device",
]

HostStep = Callable[[Plan], Callable[[int], Sequence[HostTask]]]


def backend_for(src: Source) -> Backend:
    """The device that moves the device array ``src`` describes: its CUDA
    device's backend, or the registered device's.

    Raises
    ------
    InvalidTypeError
        ``src`` is host data.
    NoDeviceError, BackendUnavailableError
        CUDA data without a usable device or CuPy.
    """
    if src.device is not None:
        return src.device
    if src.cuda is None:
        raise InvalidTypeError(
            f"expected device data (got {type(src.obj).__module__}.{type(src.obj).__qualname__})"
        )
    from .cuda import cuda_backend

    return cuda_backend(src.cuda)


def device_to_host(
    src: Source,
    chunk: int,
    host_step: HostStep,
    *,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None = None,
    into: np.ndarray | None = None,
    inline: bool = False,
    cast: np.dtype | None = None,
) -> Transfer:
    """Start the device-to-host slot pipeline for the device array ``src``.

    ``host_step(plan)(i)`` gives the pieces that copy chunk ``i`` out of its
    pinned slot (into ``out``, or into a file), run on ``threads`` host
    threads (default ``config.host_threads``); the copy is ordered after the
    work queued on the array's library's current stream at this call.
    ``into``, the host array the pieces write (if they write one), is written
    by the DMAs directly, without the ring and the pieces, where it is
    page-locked and C-contiguous. ``inline``: run on the calling thread
    before returning (for blocking calls; see :meth:`Transfer.start`).
    ``cast``: a floating dtype the chunks are cast to on the device first.

    Raises
    ------
    CaptureError
        A CUDA graph capture is under way (nothing was queued).
    """
    backend = backend_for(src)
    return _start("d2h", backend, backend.source(src.obj, cast), chunk, host_step,
                  result, progress, func, order, threads, into, inline)  # fmt: skip


def host_to_device(
    dst: Source,
    chunk: int,
    host_step: HostStep,
    *,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None = None,
    source: np.ndarray | None = None,
    inline: bool = False,
) -> Transfer:
    """Start the host-to-device slot pipeline into the device array ``dst``.

    ``host_step(plan)(i)`` gives the pieces that fill chunk ``i``'s pinned
    slot; the copy is ordered after the work queued on the array's library's
    current stream at this call, and the transfer completes when the data is
    on the device. ``source``, host memory holding exactly the bytes the
    pieces would fill the slots with, is read by the DMAs directly, without
    the ring and the pieces, where it is page-locked and C-contiguous.
    ``inline``: run on the calling thread before returning.

    Raises
    ------
    CaptureError
        A CUDA graph capture is under way (nothing was queued).
    """
    backend = backend_for(dst)
    return _start("h2d", backend, backend.target(dst.obj, func), chunk, host_step,
                  result, progress, func, order, threads, source, inline)  # fmt: skip


def _start(
    direction: str,
    backend: Backend,
    data: DeviceData,
    chunk: int,
    host_step: HostStep,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None,
    host: np.ndarray | None,
    inline: bool,
) -> Transfer:
    if backend.capture_under_way(data.stream):
        raise CaptureError(
            f"{func} expected to run outside CUDA graph capture (got a capture under way on the "
            "data's stream); it copies through pinned host memory and waits on the host, which "
            "a captured graph cannot hold. Call it before or after the captured region; nothing "
            "was queued and the capture stays valid"
        )
    plan = plan_chunks(data.shape, data.dtype.itemsize, chunk, config.num_buffers)
    transfer = Transfer(
        result, plan.sizes, Progress(progress, plan.nbytes, func), func=func, order=order
    )
    if not plan.nbytes:
        return transfer.start(lambda t: None, inline=True)  # zero-size: no ring, no stream
    tasks, pinned = host_step(plan), _pinned_addresses(backend, host, plan)
    job = SlotJob(
        direction,  # type: ignore[arg-type]
        backend,
        _ordered_stream(backend, data),  # last: nothing after it can fail and leak it
        plan,
        data,
        tasks,
        config.host_threads if threads is None else threads,
        pinned=pinned,
    )

    def engine(t: Transfer) -> None:
        if not inline:  # the transfer's own thread: run_slots' activate must restore nothing
            backend.use()
        run_slots(t, job)

    return transfer.start(engine, inline=inline)


def _ordered_stream(backend: Backend, data: DeviceData) -> Any:
    """A new copy stream that starts after the work queued so far on the data's
    own stream (an event recorded now, in the caller's thread: current streams
    are per thread). The record runs with the data's device current: a legacy
    default stream handle (0) means the current device's."""
    with backend.activate():
        stream = backend.stream()
        start = backend.event()
        start.record(data.stream)
        stream.wait(start)
    return stream


def _pinned_addresses(
    backend: Backend, host: np.ndarray | None, plan: Plan
) -> Callable[[int], int] | None:
    """Chunk ``i``'s address in ``host`` when the DMAs can use it directly: a
    C-contiguous array (chunk ``i`` is then its bytes ``[starts[i], starts[i] +
    sizes[i])``) in page-locked memory. None: go through the staging ring."""
    if host is None or not host.flags.c_contiguous or host.nbytes != plan.nbytes:
        return None
    if not backend.is_pinned(int(host.ctypes.data), plan.nbytes):
        return None
    return _ChunkAddresses(host, plan.starts)


class _ChunkAddresses:
    """Chunk ``i``'s address in a C-contiguous host array; holds the array, so
    its memory stays alive while the DMAs use it."""

    def __init__(self, host: np.ndarray, starts: list[int]) -> None:
        self.host = host
        self.base = int(host.ctypes.data)
        self.starts = starts

    def __call__(self, i: int) -> int:
        return self.base + self.starts[i]


# ----------------------------------------------------------------- host steps


def drain_into(out: np.ndarray, threads: int) -> HostStep:
    """Drain each slot into ``out``'s chunk, split across host threads."""
    view_dtype = dtypes.int_view_of_numpy(out.dtype)

    def step(plan: Plan) -> Callable[[int], Sequence[HostTask]]:
        def tasks(i: int) -> list[HostTask]:
            dst = bits(out[plan.chunks[i]])
            shape = plan.shapes[i]

            def piece(p: tuple) -> HostTask:
                return lambda buf: np.copyto(dst[p], buf.view(view_dtype).reshape(shape)[p])

            return [piece(p) for p in split_rows(shape, plan.sizes[i], threads)]

        return tasks

    return step


def fill_from(src: Any, dtype: np.dtype, threads: int) -> HostStep:
    """Fill each slot from the host source's chunk (bits applied, byte order
    converted to ``dtype``), split across host threads."""
    view_dtype = dtypes.int_view_of_numpy(dtype)

    def step(plan: Plan) -> Callable[[int], Sequence[HostTask]]:
        def tasks(i: int) -> list[HostTask]:
            part = src[plan.chunks[i]]
            shape = plan.shapes[i]

            def piece(p: tuple) -> HostTask:
                return lambda buf: np.copyto(
                    buf.view(view_dtype).reshape(shape)[p], bits(host_values(part[p]))
                )

            return [piece(p) for p in split_rows(shape, plan.sizes[i], threads)]

        return tasks

    return step


# ----------------------------------------------------------------- device to device


def device_to_device(src: Source, dst: Source) -> None:
    """Queue ``dst[...] = src`` on ``dst``'s library's current stream, ordered
    both ways with ``src``'s library's current stream (both read in this thread).

    The consumer's stream first waits for an event on the producer's stream,
    so the copy reads ``x`` after the work that made it. Then the producer's
    stream waits for the copy: both libraries' pools hand a freed block
    straight back out to the next allocation on the stream it belongs to, so
    without this a caller who drops ``x`` (or the temporary made for a tensor
    with the conjugate/negative bit) as soon as this returns could have its
    memory overwritten by new work on that stream before the copy read it.
    This is the two-way barrier of PyTorch's own cross-device copy. Where both
    libraries use one stream of one device nothing is waited on: stream order
    covers both directions.

    Raises
    ------
    InvalidTypeError
        ``x`` and ``out`` are on different kinds of device.
    CaptureError
        A CUDA graph capture is under way and the two streams differ, unless
        the source's stream captures and the destination's can join it (an
        event wait across the capture's boundary, or the legacy default
        stream waiting on the capture, would invalidate it); nothing was queued.
    """
    producer, backend = backend_for(src), backend_for(dst)
    if type(producer) is not type(backend):
        raise InvalidTypeError(
            "copy_to_device expected x and out on the same kind of device (got "
            f"{type(src.obj).__name__} and {type(dst.obj).__name__})"
        )
    source = producer.source(src.obj)
    target = backend.target(dst.obj, "copy_to_device")
    whole = (Ellipsis,)
    if not source.stream.same(target.stream):
        # A capturing source's stream is fine: the destination's stream joins its
        # capture through the first event and is joined back by the second. The
        # legacy default stream can join no capture, nor be ordered before one.
        captures = producer.is_capturing(source.stream)
        if backend.is_capturing(target.stream) and not captures:
            got = "a source stream outside it: waiting on it would break the capture"
        elif captures and (source.stream.legacy or target.stream.legacy):
            got = "the legacy default stream, which cannot join a capture"
        else:
            got = ""
        if got:
            raise CaptureError(
                "copy_to_device expected the source's stream to be in the capture that the "
                f"destination's stream is in or can join (got {got}); run the block under "
                "`with interop.stream(s):` with s the capturing stream "
                "(torch.cuda.current_stream() inside torch.cuda.graph). Nothing was queued"
            )
    # Events are made, recorded and waited on with their device current (a
    # legacy default stream handle, 0, names the current device's).
    with producer.activate():
        chunk = source.chunk(whole)  # may queue a resolved temporary on its stream
        owners = [source.stream]
        if chunk.produced_on is not None and not chunk.produced_on.same(source.stream):
            owners.append(chunk.produced_on)
        one_stream = all(owner.same(target.stream) for owner in owners)
        if not one_stream:
            ready = producer.event()
            ready.record(owners[-1])
    with backend.activate():
        if one_stream:
            backend.copy_on_device(target.chunk(whole).view, chunk.view, target.stream)
            return
        target.stream.wait(ready)
        backend.copy_on_device(target.chunk(whole).view, chunk.view, target.stream)
        done = backend.event()
        done.record(target.stream)
    with producer.activate():
        for owner in owners:
            owner.wait(done)
