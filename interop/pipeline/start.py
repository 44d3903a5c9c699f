"""Where copies enter the pipeline: :func:`start` runs a ``TransferRequest`` through the
slot schedule, the host engine, or one ordered device copy (:func:`device_to_device`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .. import _backends, dtypes
from ..arrays import Source, parse_device
from ..config import config
from ..errors import CaptureError, InvalidTypeError, InvalidValueError
from .backend import Backend, DeviceData
from .future import Transfer
from .hostcopy import CopyOut, host_engine
from .hybrid import hybrid_form
from .plan import Plan, plan_chunks
from .progress import Progress
from .request import TransferRequest
from .schedule import SlotJob, run_slots

__all__ = [
    "backend_for",
    "cuda_index",
    "device_to_device",
    "empty_device",
    "empty_result",
    "start",
]


def start(request: TransferRequest) -> Transfer:
    """Start the copy ``request`` describes, after the device array's current stream now.

    ``request.host`` is used by the DMAs directly where it is page-locked and
    C-contiguous. Raises CaptureError during a capture on the data's stream
    (nothing queued).
    """
    direction, func, stage = request.direction, request.func, request.stage
    if direction == "d2d":
        assert request.device is not None
        assert request.target is not None
        device_to_device(request.device, request.target)
        return _transfer(request, []).start(lambda t: None, inline=True)
    assert stage is not None
    if request.device is None:
        plan = plan_chunks(request.shape, request.itemsize, request.chunk, 1)
        run = host_engine(plan, stage, request.threads)
        return _transfer(request, plan.sizes).start(run, inline=request.inline)
    backend = backend_for(request.device)
    obj = request.device.obj
    data = backend.source(obj, request.cast) if direction == "d2h" else backend.target(obj, func)
    if backend.capture_under_way(data.stream):
        raise CaptureError(
            f"{func} expected to run outside CUDA graph capture (got a capture under way on the "
            "data's stream: it waits on the host); call it before or after the captured region"
        )
    plan = plan_chunks(data.shape, data.dtype.itemsize, request.chunk, config.num_buffers)
    transfer = _transfer(request, plan.sizes)
    if not plan.nbytes:
        return transfer.start(lambda t: None, inline=True)  # zero-size: no ring, no stream
    threads = request.threads
    pinned = _pinned_addresses(backend, request.host, plan)
    hybrid = touch = None
    if direction == "d2h" and pinned is None:
        hybrid = hybrid_form(backend, request.host, plan)
    if request.fresh and isinstance(stage, CopyOut):  # its ring chunks' pages, before the DMA
        touch = lambda i: [partial(stage.touch, plan, i, p) for p in stage.pieces(plan, i, threads)]  # noqa: E731
    job = SlotJob(
        direction,  # type: ignore[arg-type]
        backend,
        _ordered_stream(backend, data),  # last: nothing after it can fail and leak it
        plan,
        data,
        lambda i: [partial(stage.run, plan, i, p) for p in stage.pieces(plan, i, threads)],
        threads,
        pinned=pinned,
        hybrid=hybrid,
        touch=touch,
    )

    def engine(t: Transfer) -> None:
        if not request.inline:  # the transfer's thread: run_slots' activate must restore nothing
            backend.use()
        run_slots(t, job)

    return transfer.start(engine, inline=request.inline)


def _transfer(request: TransferRequest, sizes: list[int]) -> Transfer:
    """The :class:`Transfer` of ``request``, whose chunks have ``sizes``."""
    progress = Progress(request.progress, sum(sizes), request.func)
    return Transfer(request.result, sizes, progress, func=request.func, order=request.order)


def backend_for(src: Source) -> Backend:
    """The device that moves the device array ``src`` (InvalidTypeError for host data)."""
    if src.device is not None:
        return src.device
    if src.cuda is None:
        raise InvalidTypeError(
            f"expected device data (got {type(src.obj).__module__}.{type(src.obj).__qualname__})"
        )
    from .cuda import cuda_backend

    return cuda_backend(src.cuda)


def empty_result(backend: Backend, shape: tuple[int, ...], dtype: np.dtype, func: str) -> Any:
    """A new array of ``backend``'s for ``func``'s result, once no capture forbids it."""
    if backend.capture_forbids_allocation():
        raise CaptureError(
            f"{func} expected no CUDA graph capture under way when it allocates its result "
            "(got one: CuPy's pool grows with cudaMalloc); pass out= allocated before the "
            "capture, or use interop.use_torch_allocator()"
        )
    return backend.empty(shape, dtype)


def empty_device(
    shape: tuple[int, ...], dtype: np.dtype, device: Any = None, func: str = "copy_to_device"
) -> Any:
    """A new CuPy array on CUDA ``device`` (None: the current one), as :func:`empty_result`."""
    index = cuda_index(device)
    cp = _backends.require_cupy_device()
    dtypes.check_cupy_dtype(np.dtype(dtype))
    from .cuda import cuda_backend

    backend = cuda_backend(cp.cuda.runtime.getDevice() if index is None else index)
    return empty_result(backend, shape, dtype, func)


def cuda_index(device: Any) -> int | None:
    """The index of a CUDA ``device`` argument (None: the current device)."""
    target = parse_device(device)
    if target is not None and target[0] != "cuda":
        raise InvalidValueError(
            f"expected a CUDA device (got {device!r}); device memory lives on a GPU: "
            "use interop.copy_to_host for host destinations"
        )
    return None if target is None else target[1]


def _ordered_stream(backend: Backend, data: DeviceData) -> Any:
    """A new copy stream that starts after the work queued so far on the data's stream."""
    # in the caller's thread, with the data's device current (stream 0 is the current device's)
    with backend.activate():
        stream = backend.stream()
        start = backend.event()
        start.record(data.stream)
        stream.wait(start)
    return stream


def _pinned_addresses(
    backend: Backend, host: np.ndarray | None, plan: Plan
) -> Callable[[int], int] | None:
    """Chunk ``i``'s address in a page-locked C-contiguous ``host``; else None (the ring)."""
    if host is None or not host.flags.c_contiguous or host.nbytes != plan.nbytes:
        return None
    base = int(host.ctypes.data)
    if not backend.is_pinned(base, plan.nbytes):
        return None

    def address(i: int, host: np.ndarray = host) -> int:  # holds host alive for the DMAs
        return base + plan.starts[i]  # chunk i: bytes [starts[i], starts[i] + sizes[i])

    return address


def device_to_device(src: Source, dst: Source) -> None:
    """Queue ``dst[...] = src`` on ``dst``'s current stream, ordered both ways with ``src``'s.

    Raises InvalidTypeError for two kinds of device, CaptureError where a capture
    cannot hold the two streams' events (nothing queued).
    """
    # The copy waits for src's producer; then the producer's stream waits for the
    # copy, since its pool may hand src's block (dropped at once) to its next allocation.
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
                "copy_to_device expected the source's stream in the destination stream's "
                f"capture (got {got}); run the block under `with interop.stream(s):` with s "
                "the capturing stream (torch.cuda.current_stream() inside torch.cuda.graph)"
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
