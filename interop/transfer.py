"""Chunked copies between host and device: ``copy_to_host``, ``copy_to_device``
and their asynchronous forms.

These are the public calls over :mod:`interop.pipeline`: they check their
arguments (before anything is written), describe the source and destination,
and start a :class:`~interop.pipeline.future.Transfer` that runs the slot
schedule (device data) or the host engine (host data). :func:`device_to_host`
and :func:`host_to_device` are the same pipelines with another host step (the
``.npy`` functions read and write files there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _backends, dtypes
from .arrays import (
    Source,
    array_source,
    bits,
    host_values,
    is_emulated_device_array,
    numpy_view_of_cpu_tensor,
    overlaps,
    parse_device,
    raw_host_memory,
)
from .config import chunk_bytes_or_default, config, host_copy_threads
from .errors import CaptureError, InvalidTypeError, InvalidValueError
from .pipeline.backend import Backend, DeviceData
from .pipeline.future import Transfer
from .pipeline.hostcopy import host_chunk_bytes, host_copy
from .pipeline.plan import Plan, c_order_chunks, nbytes_of, plan_chunks, split_rows
from .pipeline.progress import Progress, check_progress
from .pipeline.schedule import HostTask, SlotJob, run_slots

__all__ = [
    "Transfer",
    "copy_to_device",
    "copy_to_device_async",
    "copy_to_host",
    "copy_to_host_async",
]

HostStep = Callable[[Plan], Callable[[int], Sequence[HostTask]]]


# ----------------------------------------------------------------- the two pipelines


def backend_of(x: Any) -> Backend:
    """The backend that moves device array ``x`` (a CuPy array, a CUDA tensor,
    or an emulated device's array).

    Raises
    ------
    TypeError
        ``x`` is not device data.
    NoDeviceError, BackendUnavailableError
        CUDA data without a usable device or CuPy.
    """
    if is_emulated_device_array(x):
        return x.backend
    from .pipeline.cuda import cuda_backend

    if _backends.is_cupy_array(x):
        return cuda_backend(int(x.device.id))
    if _backends.is_torch_tensor(x) and x.device.type == "cuda":
        return cuda_backend(int(x.device.index))
    raise InvalidTypeError(
        f"expected device data (got {type(x).__module__}.{type(x).__qualname__})"
    )


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


def _start(
    direction: str,
    x: Any,
    data_of: Callable[[Backend], DeviceData],
    chunk: int,
    host_step: HostStep,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None,
    host: np.ndarray | None,
) -> Transfer:
    backend = backend_of(x)
    data = data_of(backend)
    if backend.capture_under_way(data.stream):
        raise CaptureError(
            f"{func} expected to run outside CUDA graph capture (got a capture under way on the "
            "data's stream); it copies through pinned host memory and waits on the host, which "
            "a captured graph cannot hold. Call it before or after the captured region; nothing "
            "was queued and the capture stays valid"
        )
    itemsize = data.dtype.itemsize
    plan = plan_chunks(data.shape, itemsize, chunk, config.num_buffers)
    transfer = Transfer(
        result, plan.sizes, Progress(progress, plan.nbytes, func), func=func, order=order
    )
    if not plan.nbytes:
        return transfer.start(lambda t: None)  # zero-size: no ring, no stream
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
    return transfer.start(lambda t: run_slots(t, job))


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


def device_to_host(
    x: Any,
    chunk: int,
    host_step: HostStep,
    *,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None = None,
    into: np.ndarray | None = None,
) -> Transfer:
    """Start the device-to-host slot pipeline for device data ``x``.

    ``host_step(plan)(i)`` gives the pieces that copy chunk ``i`` out of its
    pinned slot (into ``out``, or into a file), run on ``threads`` host
    threads (default ``config.host_threads``); the copy is ordered after the
    work queued on ``x``'s library's current stream at this call. ``into``,
    the host array the pieces write (if they write one), is written by the
    DMAs directly, without the ring and the pieces, where it is page-locked
    and C-contiguous.
    """
    return _start(
        "d2h",
        x,
        lambda b: b.source(x),
        chunk,
        host_step,
        result,
        progress,
        func,
        order,
        threads,
        into,
    )


def host_to_device(
    out: Any,
    chunk: int,
    host_step: HostStep,
    *,
    result: Any,
    progress: Any,
    func: str,
    order: str,
    threads: int | None = None,
    source: np.ndarray | None = None,
) -> Transfer:
    """Start the host-to-device slot pipeline into device array ``out``.

    ``host_step(plan)(i)`` gives the pieces that fill chunk ``i``'s pinned
    slot; the copy is ordered after the work queued on ``out``'s library's
    current stream at this call, and the transfer completes when the data is
    on the device. ``source``, host memory holding exactly the bytes the
    pieces would fill the slots with, is read by the DMAs directly, without
    the ring and the pieces, where it is page-locked and C-contiguous.
    """
    data_of: Callable[[Backend], DeviceData] = lambda b: b.target(out, func)  # noqa: E731
    return _start(
        "h2d", out, data_of, chunk, host_step, result, progress, func, order, threads, source
    )


def _into_array(out: np.ndarray, threads: int) -> HostStep:
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


def _from_host(src: Any, dtype: np.dtype, threads: int) -> HostStep:
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


def _host_bytes(src: Source, dtype: np.dtype) -> np.ndarray | None:
    """The host source's memory where it holds exactly the bytes the device
    gets (native byte order, no conjugate/negative bit to apply); else None."""
    obj = src.obj
    if isinstance(obj, np.ndarray):
        return obj if obj.dtype == dtype else None
    if obj.is_conj() or obj.is_neg():
        return None
    return numpy_view_of_cpu_tensor(obj)


# ----------------------------------------------------------------- checks


def _check_host_out(out: Any, src: Source) -> None:
    if not isinstance(out, np.ndarray):
        raise InvalidTypeError(
            "copy_to_host expected out to be a writable NumPy array (numpy.memmap included) "
            f"(got {type(out).__module__}.{type(out).__qualname__}); use interop.copy_to_device "
            "for device destinations"
        )
    if out.shape != tuple(src.shape):
        raise InvalidValueError(
            f"copy_to_host expected out of shape {tuple(src.shape)} (got {out.shape})"
        )
    if out.dtype != src.dtype:
        raise InvalidValueError(_dtype_mismatch("copy_to_host", src.dtype, out.dtype))
    if not out.flags.writeable:
        raise InvalidValueError("copy_to_host expected a writable out (got a read-only array)")
    if not src.on_device and overlaps(out, raw_host_memory(src.obj)):
        raise InvalidValueError(
            "copy_to_host expected out not to overlap the source (got overlapping "
            "memory); copy into a separate array"
        )


def _dtype_mismatch(func: str, want: np.dtype, got: np.dtype) -> str:
    if want.newbyteorder("=") == got.newbyteorder("="):
        hint = f"the byte order differs: allocate out with dtype {want.str!r}"
    elif dtypes.is_ml_dtype(want):
        hint = f"use the ml_dtypes dtype ml_dtypes.{want.name}"
    else:
        hint = f"allocate out with dtype {want}"
    return f"{func} expected out of dtype {want} (got {got}); {hint}"


def _device_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, func: str) -> None:
    """Check a device destination's type, shape and dtype (before anything is written)."""
    if _backends.is_cupy_array(out):
        got_shape, got = tuple(out.shape), np.dtype(out.dtype)
    elif _backends.is_torch_tensor(out) and out.device.type == "cuda":
        got_shape, got = tuple(out.shape), dtypes.numpy_dtype_of_torch(out.dtype)
    elif is_emulated_device_array(out):
        got_shape, got = tuple(out.shape), np.dtype(out.dtype)
    else:
        raise InvalidTypeError(
            f"{func} expected out to be a CuPy array or a CUDA torch tensor "
            f"(got {type(out).__module__}.{type(out).__qualname__})"
        )
    if got_shape != tuple(shape):
        raise InvalidValueError(f"{func} expected out of shape {tuple(shape)} (got {got_shape})")
    if got != dtype:
        raise InvalidValueError(_dtype_mismatch(func, dtype, got))


def empty_device(shape: tuple[int, ...], dtype: np.dtype, device: Any = None) -> Any:
    """A new uninitialised CuPy array on ``device`` (default: the current device).

    Raises
    ------
    ValueError
        ``device`` is not a CUDA device.
    BackendUnavailableError, NoDeviceError, UnsupportedDtypeError
    """
    target = parse_device(device)
    if target is not None and target[0] != "cuda":
        raise InvalidValueError(
            f"expected a CUDA device (got {device!r}); device memory lives on a GPU: "
            "use interop.copy_to_host for host destinations"
        )
    cp = _backends.require_cupy_device()
    dtypes.check_cupy_dtype(np.dtype(dtype))
    index = None if target is None else target[1]
    with cp.cuda.Device(cp.cuda.runtime.getDevice() if index is None else index):
        return cp.empty(shape, dtype=dtype)


# ----------------------------------------------------------------- copy_to_host


def copy_to_host_async(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Transfer:
    """Start a chunked copy of ``x`` into host memory; return a :class:`Transfer`.

    Parameters
    ----------
    x : array
        A CuPy array, a PyTorch tensor (CUDA or CPU) or a NumPy array
        (memmaps included), any strides. bfloat16/float8 tensors are copied
        bit for bit into the ``ml_dtypes`` dtype of the same name; tensors
        with the conjugate/negative bit give the values they represent.
    out : numpy.ndarray, optional
        Writable destination (``numpy.memmap`` included) with exactly
        ``x.shape`` and the matching dtype, any strides. Without it a new
        (pageable) array is allocated.
    chunk_bytes : int, optional
        Chunk (staging buffer) size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)`` from the transfer's thread, as
        chunks complete, in order.

    Returns
    -------
    Transfer
        ``result()`` returns ``out``.

    Notes
    -----
    Copy semantics: always a copy into ``out``. Device sources go through a
    ring of ``interop.config.num_buffers`` pinned buffers on a dedicated
    non-blocking stream that waits (an event, not a device-wide sync) on the
    producer's current stream of the data's device, so the copy sees all work
    queued before the call. Non-contiguous device chunks are packed on the
    device into ring-sized staging rows (no full-size temporary). An ``out``
    already in page-locked memory (``cupyx.empty_pinned``, a pinned tensor's
    ``.numpy()``, registered memory) and C-contiguous is written by the DMAs
    directly, with no ring and no host threads. Host
    sources are copied chunk by chunk by ``interop.config.host_threads``
    threads where that setting was set, else by all the CPUs (at most 8).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        ``x`` is not an array (or a nested, sparse or meta tensor), or ``out``
        has the wrong type, shape or dtype, is read-only or overlaps the
        source, or ``chunk_bytes``/``progress`` are refused. A ``TypeError``
        or ``ValueError``, raised here, before anything is written.
    UnsupportedDtypeError
        The dtype has no NumPy equivalent (``torch.complex32``).
    NoDeviceError, BackendUnavailableError
        Device data without a usable CUDA device or CuPy.
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    check_progress(progress)
    src = array_source(x, "copy_to_host")
    if out is None:
        out = np.empty(src.shape, src.dtype)
    else:
        _check_host_out(out, src)
    if src.on_device:
        threads = config.host_threads
        return device_to_host(
            src.obj,
            chunk,
            _into_array(out, threads),
            result=out,
            progress=progress,
            func="copy_to_host",
            order="the source's C order",
            into=out,
        )
    threads = host_copy_threads()
    nbytes = nbytes_of(src.shape, src.dtype.itemsize)
    if chunk_bytes is None:
        chunk = host_chunk_bytes(nbytes, chunk, threads)
    chunks = list(c_order_chunks(src.shape, src.dtype.itemsize, chunk))
    sizes = [nbytes_of(out[idx].shape, src.dtype.itemsize) for idx in chunks]
    transfer = Transfer(out, sizes, Progress(progress, nbytes, "copy_to_host"), func="copy_to_host")
    return transfer.start(host_copy(src.obj, out, chunks, threads))


def copy_to_host(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> np.ndarray:
    """Copy ``x`` into host memory in chunks; ``copy_to_host_async(...).result()``.

    See :func:`copy_to_host_async` for the parameters, copy semantics and
    stream order.

    Returns
    -------
    numpy.ndarray
        ``out`` itself when given, else a new array.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        Bad ``x`` or ``out`` (a ``TypeError`` or ``ValueError``, before
        anything is written).
    TransferError
        A chunk failed or the copy was cancelled; the message says which byte
        range is complete. The error keeps neither ``x`` nor ``out`` alive.
    KeyboardInterrupt
        Interrupted: the copy is cancelled and every resource released first.
    """
    transfer = copy_to_host_async(x, out, chunk_bytes=chunk_bytes, progress=progress)
    del x, out  # a held error's traceback must not keep them alive
    return transfer.result()


# ----------------------------------------------------------------- copy_to_device


def copy_to_device_async(
    x: Any,
    /,
    out: Any = None,
    *,
    device: Any = None,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Transfer:
    """Start a copy of ``x`` into device memory; return a :class:`Transfer`.

    The host threads and the copy stream work while the caller goes on;
    ``result()`` returns the destination once the data is on the device.
    See :func:`copy_to_device` for the parameters, copy semantics and stream
    order.

    Returns
    -------
    Transfer
        ``result()`` returns ``out`` (or the new CuPy array); ``cancel()``
        stops after the chunks in flight; ``bytes_done`` counts the bytes
        already on the device, in the source's C order.

    Raises
    ------
    TypeError, ValueError
        Bad ``x``, ``out`` or ``device``, before anything is written.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing.
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    check_progress(progress)
    src = array_source(x, "copy_to_device")
    native = src.dtype.newbyteorder("=")
    if out is not None:
        _device_out(out, src.shape, native, "copy_to_device")
        result = out
    elif src.on_device and is_emulated_device_array(src.obj):
        device = src.obj.backend  # the result goes on the current device, as for CUDA data
        result = device.peer(device.current_device()).empty(src.shape, native)
    else:
        result = empty_device(src.shape, native, device)
    if src.on_device:
        _device_to_device(src.obj, result)
        transfer = Transfer(
            result, [], Progress(progress, 0, "copy_to_device"), func="copy_to_device"
        )
        return transfer.start(lambda t: None)
    return host_to_device(
        result,
        chunk,
        _from_host(src.obj, native, config.host_threads),
        result=result,
        progress=progress,
        func="copy_to_device",
        order="the source's C order",
        source=_host_bytes(src, native),
    )


def copy_to_device(
    x: Any,
    /,
    out: Any = None,
    *,
    device: Any = None,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> Any:
    """Copy ``x`` into device memory; ``copy_to_device_async(...).result()``.

    Parameters
    ----------
    x : array
        Host data (NumPy arrays of any strides and byte order, memmaps
        included; CPU or pinned torch tensors) or device data (CuPy arrays,
        CUDA tensors).
    out : cupy.ndarray or torch.Tensor, optional
        Preallocated CuPy array or CUDA tensor with exactly ``x.shape`` and
        ``x``'s dtype in native byte order, any strides. Checked before
        anything is written.
    device : optional
        Without ``out``: the CUDA device of the new CuPy array (default: the
        current device).
    chunk_bytes : int, optional
        Staging chunk size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)`` as chunks complete on the
        device, in order.

    Returns
    -------
    cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new CuPy array.

    Notes
    -----
    Always a copy. Host data: the copies run on a dedicated non-blocking
    stream that first waits (an event, not a device-wide sync) on the current
    stream of ``out``'s library, so earlier work on ``out`` is respected;
    host threads fill a ring of ``num_buffers`` pinned slots while earlier
    slots are copied, and the call returns once the data is on the device, so
    the result can be used on any stream. Non-native byte order is converted
    while filling the slots. Extra pinned host memory is the ring; a
    non-contiguous ``out`` uses as much device memory again for unpacking.
    A source already in page-locked memory, C-contiguous, in native byte
    order and without a conjugate/negative bit is read by the DMAs directly,
    with no ring and no host threads.

    Device data: one device-side copy queued on the current stream of
    ``out``'s library, after an event on the current stream of ``x``'s
    library (no host synchronisation): the result is ready for work queued on
    that stream, and the call returns without waiting for the copy. A tensor
    with the conjugate/negative bit is first resolved into a temporary on
    ``x``'s library's stream, which then also waits for the copy. ``x`` on
    another device is first moved whole (the bytes it spans, in one peer DMA
    on ``out``'s stream) into a temporary of that size on ``out``'s device.

    Raises
    ------
    InvalidValueError, InvalidTypeError
        Wrong ``out`` (type, shape, dtype) or ``device`` (a ``ValueError`` or
        ``TypeError``); nothing is written.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing (:class:`~interop.CudaAfterForkError`
        in a process forked after its parent initialised CUDA).
    TransferError
        A chunk failed; the message says which byte range is complete. Every
        staging buffer and stream is released.
    """
    transfer = copy_to_device_async(
        x, out, device=device, chunk_bytes=chunk_bytes, progress=progress
    )
    del x, out
    return transfer.result()


def _device_to_device(x: Any, out: Any) -> None:
    """Queue ``out[...] = x`` on ``out``'s library's current stream, ordered both
    ways with ``x``'s library's current stream (both read in this thread).

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
        A CUDA graph capture is under way and the two streams differ (an
        event wait across the capture's boundary would invalidate it);
        nothing was queued.
    """
    producer, backend = backend_of(x), backend_of(out)
    if type(producer) is not type(backend):
        raise InvalidTypeError(
            f"copy_to_device expected x and out on the same kind of device (got {type(x).__name__} "
            f"and {type(out).__name__})"
        )
    source = producer.source(x)
    target = backend.target(out, "copy_to_device")
    whole = (Ellipsis,)
    if (
        not source.stream.same(target.stream)
        and backend.is_capturing(target.stream)
        and not producer.is_capturing(source.stream)
    ):
        # (a capturing source's stream is fine: the destination's stream joins
        # its capture through the first event and is joined back by the second)
        raise CaptureError(
            "copy_to_device expected the source's stream to be in the capture that the "
            "destination's stream is in (got a source stream outside it: waiting on it would "
            "break the capture); run the block under `with interop.stream(s):` with s the "
            "capturing stream (torch.cuda.current_stream() inside torch.cuda.graph). Nothing "
            "was queued"
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
