"""Host-to-device streaming: ``copy_to_device``.

``cupy.asarray(host)`` stages a full-size pinned copy of the source (and rounds
pinned allocations up to a power of two). ``copy_to_device`` instead moves the
data through a ring of ``num_buffers`` pinned slots of ``chunk_bytes``: host
threads pack the next chunks of the (any-strided, possibly memory-mapped)
source into free slots while earlier slots are copied to the device on a
dedicated non-blocking stream. Extra pinned memory is the ring, never the
array.

The pipeline, per chunk ``i`` in C order (slot ``k = i % num_buffers``)::

    host thread:  wait event[k] (slot free) -> np.copyto(slot k, source chunk i)
    issuer:       wait fill i -> memcpyAsync(out chunk i <- slot k, copy stream)
                  [-> device-side scatter if out chunk i is not contiguous]
                  -> record event[k] -> schedule fill i + num_buffers

Fill ``i + num_buffers`` is submitted only after event ``k`` was recorded, so
a host thread never waits on an event that was not yet recorded.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _backends, dtypes
from .config import chunk_bytes_or_default, config
from .errors import TransferError
from .transfer import PinnedRing, Progress, array_source, c_order_chunks, pinned_ring

__all__ = ["copy_to_device"]

_H2D = 1  # cudaMemcpyHostToDevice


def _device_index(device: Any) -> int | None:
    from .exchange import _parse_device

    target = _parse_device(device)
    if target is None:
        return None
    if target[0] != "cuda":
        raise ValueError(
            f"expected a CUDA device (got {device!r}); copy_to_device writes device memory: "
            "use interop.copy_to_host for host destinations"
        )
    return target[1]


def empty_device(shape: tuple[int, ...], dtype: np.dtype, device: Any = None) -> Any:
    """A new uninitialised CuPy array on ``device`` (default: the current device).

    Raises
    ------
    BackendUnavailableError, NoDeviceError, UnsupportedDtypeError
    """
    cp = _backends.require_cupy_device()
    dtypes.check_cupy_dtype(np.dtype(dtype))
    index = _device_index(device)
    with cp.cuda.Device(cp.cuda.runtime.getDevice() if index is None else index):
        return cp.empty(shape, dtype=dtype)


def _cupy_bits(out: Any, func: str) -> tuple[Any, np.dtype]:
    """A CuPy view of a CuPy array or CUDA tensor ``out`` with a dtype CuPy holds
    (bfloat16/float8 as same-sized integers), and ``out``'s NumPy dtype."""
    cp = _backends.cupy()
    if _backends.is_cupy_array(out):
        return out, np.dtype(out.dtype)
    if _backends.is_torch_tensor(out) and out.device.type == "cuda":
        if out.is_conj() or out.is_neg():
            raise ValueError(
                f"{func} expected an out without the conjugate/negative bit "
                "(writes through such a view would be transformed); resolve it first"
            )
        np_dtype = dtypes.numpy_dtype_of_torch(out.dtype)
        ml = dtypes.ml_view_of_torch(out.dtype)
        t = out.detach() if ml is None else out.detach().view(ml[1])
        with cp.cuda.Device(out.device.index):
            return cp.from_dlpack(t), np_dtype
    raise TypeError(
        f"{func} expected out to be a CuPy array or a CUDA torch tensor "
        f"(got {type(out).__module__}.{type(out).__qualname__})"
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
    """Copy ``x`` to device memory through a ring of pinned staging buffers.

    Parameters
    ----------
    x : array
        Host data (NumPy arrays of any strides, memmaps included; CPU or
        pinned torch tensors) or device data (CuPy arrays, CUDA tensors).
    out : cupy.ndarray or torch.Tensor, optional
        Preallocated CuPy array or CUDA tensor with exactly ``x.shape`` and
        dtype, any strides. Checked before anything is written.
    device : optional
        Without ``out``: the CUDA device of the new CuPy array (default: the
        current device).
    chunk_bytes : int, optional
        Staging chunk size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)``.

    Returns
    -------
    cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new CuPy array.

    Notes
    -----
    Always a copy. Stream order: the copies run on a dedicated non-blocking
    stream that first waits (an event, not a device-wide sync) on the current
    stream of ``out``'s library, so earlier work on ``out`` is respected; the
    call returns once the data is on the device, so the result can be used on
    any stream. Extra pinned host memory is ``num_buffers * chunk_bytes``; a
    non-contiguous ``out`` uses as much device memory again for packing.

    Raises
    ------
    ValueError, TypeError
        Wrong ``out`` (type, shape, dtype) or ``device``; nothing is written.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing.
    TransferError
        A chunk failed; the message says which byte range is complete. Every
        staging buffer and stream is released.
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    src, shape, dtype, on_device = array_source(x, "copy_to_device")
    _backends.require_cupy_device()
    if on_device:
        return _device_to_device(src, out, device)

    result = empty_device(shape, dtype, device) if out is None else out
    dst, out_dtype = _cupy_bits(result, "copy_to_device")
    if tuple(dst.shape) != tuple(shape) or out_dtype != dtype:
        raise ValueError(
            f"copy_to_device expected out with shape {tuple(shape)} and dtype {dtype} "
            f"(got shape {tuple(dst.shape)} and dtype {out_dtype})"
        )
    bits = dtypes.int_view_of_numpy(dtype)
    itemsize = dtype.itemsize
    from .exchange import to_numpy

    def pack(idx: tuple, start: int, slot: np.ndarray) -> int:
        part = to_numpy(src[idx])  # per chunk: conjugate/negative bits applied here
        n = part.size * itemsize
        np.copyto(slot[:n].view(bits).reshape(part.shape), part.view(bits))
        return n

    h2d_pipeline(result, dst, itemsize, pack, chunk, progress, "copy_to_device")
    return result


def h2d_pipeline(
    result: Any,
    dst: Any,
    itemsize: int,
    fill: Callable[[tuple, int, np.ndarray], int],
    chunk: int,
    progress: Any,
    func: str,
) -> None:
    """Stream host data into the CuPy view ``dst`` of ``result`` through the
    pinned ring.

    ``fill(idx, start, slot)`` writes the bytes of chunk ``dst[idx]`` (C
    order; ``start`` is its byte offset in that order) into the pinned
    ``slot`` and returns their count; it runs on host threads.
    Used by :func:`copy_to_device` (packing a host array) and
    :func:`interop.load_npy` (reading a file straight into the slots).
    Returns when the data is on the device.
    """
    cp = _backends.cupy()
    shape = tuple(dst.shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    if nbytes == 0:
        return
    chunk = max(chunk, itemsize)
    chunks = list(c_order_chunks(shape, itemsize, chunk))
    sizes = [dst[idx].size * itemsize for idx in chunks]
    starts = np.cumsum([0, *sizes[:-1]]).tolist()
    slot_bytes = max(sizes)  # a small array never pins a full chunk
    nslots = min(config.num_buffers, len(chunks))
    bar = Progress(progress, nbytes, func)
    done = 0

    def fill_slot(i: int, slot: np.ndarray, wait: Any) -> int:
        if wait is not None:
            wait.synchronize()  # the DMA that last read this slot has finished
        return fill(chunks[i], int(starts[i]), slot)

    index = int(dst.device.id)
    with cp.cuda.Device(index):
        producer = _consumer_stream(result, index)
        stream = cp.cuda.Stream(non_blocking=True)
        start = cp.cuda.Event(disable_timing=True)
        start.record(producer)
        stream.wait_event(start)
        events = [cp.cuda.Event(disable_timing=True) for _ in range(nslots)]
        staging = None
        fills: dict[int, concurrent.futures.Future[int]] = {}
        pool = concurrent.futures.ThreadPoolExecutor(max(1, config.host_threads))
        ring: PinnedRing | None = None
        rings = contextlib.ExitStack()
        error: BaseException | None = None
        try:
            ring = rings.enter_context(pinned_ring(nslots, slot_bytes))
            for i in range(nslots):
                fills[i] = pool.submit(fill_slot, i, ring.arrays[i], None)
            for i, idx in enumerate(chunks):
                k = i % nslots
                n = fills.pop(i).result()
                part = dst[idx]
                if part.flags.c_contiguous:
                    cp.cuda.runtime.memcpyAsync(part.data.ptr, ring.ptrs[k], n, _H2D, stream.ptr)
                else:
                    if staging is None:
                        staging = cp.empty((nslots, slot_bytes), dtype=cp.uint8)
                    cp.cuda.runtime.memcpyAsync(
                        staging[k].data.ptr, ring.ptrs[k], n, _H2D, stream.ptr
                    )
                    with stream:
                        part[...] = staging[k, :n].view(part.dtype).reshape(part.shape)
                events[k].record(stream)
                if i + nslots < len(chunks):
                    fills[i + nslots] = pool.submit(
                        fill_slot, i + nslots, ring.arrays[k], events[k]
                    )
                done += n
                bar.add(n)
        except BaseException as exc:
            error = exc
        finally:
            # Order matters: no host thread may touch a slot, and no DMA may
            # read one, once the ring is freed.
            for f in fills.values():
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            try:
                stream.synchronize()
                synced = True
            except Exception as exc:  # a sticky CUDA error
                error = error or exc
                synced = False
            if error is None:
                rings.close()  # the ring goes back to the cache
            else:
                rings.__exit__(type(error), error, error.__traceback__)  # freed
            bar.close()
        if error is not None:
            if isinstance(error, KeyboardInterrupt):
                raise error
            complete = done if synced else 0
            raise TransferError(
                f"{func} failed ({type(error).__name__}: {error}); bytes "
                f"[0, {complete}) of {nbytes} (C order) are complete, the rest of out is "
                "unspecified",
                bytes_done=complete,
                nbytes=nbytes,
            ) from error


def _consumer_stream(out: Any, index: int) -> Any:
    """The current stream of ``out``'s library on device ``index``, as a CuPy stream."""
    cp = _backends.cupy()
    if _backends.is_torch_tensor(out):
        from .streams import cupy_stream, torch_stream_handle

        return cupy_stream(torch_stream_handle(index), index)
    return cp.cuda.get_current_stream()


def _device_to_device(x: Any, out: Any, device: Any) -> Any:
    """Device source: a device-side copy on the destination's current stream."""
    from .exchange import to_cupy

    src = to_cupy(x)
    if out is None:
        index = _device_index(device)
        result = empty_device(src.shape, np.dtype(src.dtype), index)
    else:
        result = out
    dst, out_dtype = _cupy_bits(result, "copy_to_device")
    if tuple(dst.shape) != tuple(src.shape) or out_dtype != np.dtype(src.dtype):
        raise ValueError(
            f"copy_to_device expected out with shape {tuple(src.shape)} and dtype "
            f"{np.dtype(src.dtype)} (got shape {tuple(dst.shape)} and dtype {out_dtype})"
        )
    cp = _backends.cupy()
    with cp.cuda.Device(int(dst.device.id)), _consumer_stream(result, int(dst.device.id)):
        dst[...] = src.view(dst.dtype) if src.dtype != dst.dtype else src
    return result
