"""Chunked copies between host and device: ``copy_to_host``, ``copy_to_device``
and their asynchronous forms.

The public calls: they check their arguments (before anything is written),
describe the source and destination once, build one
:class:`~interop.pipeline.request.TransferRequest` and start it
(:func:`interop.pipeline.start.start`).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import dtypes
from .arrays import (
    Source,
    array_source,
    check_elements_apart,
    check_host_out,
    is_device_array,
    numpy_view_of_cpu_tensor,
)
from .config import chunk_bytes_or_default, host_copy_threads
from .errors import InvalidTypeError, InvalidValueError
from .pipeline.future import Transfer
from .pipeline.hostcopy import CopyIn, CopyOut, host_chunk_bytes
from .pipeline.plan import nbytes_of
from .pipeline.request import TransferRequest, check_options
from .pipeline.start import backend_for, cuda_index, empty_device, empty_result, start

__all__ = [
    "Transfer",
    "copy_to_device",
    "copy_to_device_async",
    "copy_to_host",
    "copy_to_host_async",
]


# ----------------------------------------------------------------- checks


def _host_bytes(src: Source, dtype: np.dtype) -> np.ndarray | None:
    """The host source's memory where it holds exactly the bytes the device gets."""
    obj = src.obj
    if isinstance(obj, np.ndarray):
        return obj if obj.dtype == dtype else None
    if obj.is_conj() or obj.is_neg():
        return None
    return numpy_view_of_cpu_tensor(obj)


def _device_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, func: str) -> Source:
    """A device ``out`` checked (type, shape, dtype, elements apart) and described."""
    if not is_device_array(out):
        raise InvalidTypeError(
            f"{func} expected out to be a CuPy array or a CUDA torch tensor "
            f"(got {type(out).__module__}.{type(out).__qualname__})"
        )
    dst = array_source(out, func)
    if dst.shape != tuple(shape):
        raise InvalidValueError(f"{func} expected out of shape {tuple(shape)} (got {dst.shape})")
    if dst.dtype != dtype:
        raise InvalidValueError(dtypes.mismatch_message(func, dtype, dst.dtype))
    check_elements_apart(out, func)
    return dst


# ----------------------------------------------------------------- copy_to_host


def copy_to_host_async(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    dtype: Any = None,
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
        Writable destination (``numpy.memmap`` included), exactly ``x.shape``
        and the matching dtype (``dtype`` where given), any strides; default:
        a new (pageable) array.
    dtype : numpy dtype, optional
        Cast on the way to this floating dtype (float16, float32, float64, or
        an ``ml_dtypes`` one such as bfloat16), for a floating ``x``; each
        chunk is cast where it is (device data into a chunk-sized temporary
        on the producer's stream), never the whole array, unlike
        ``t.float().cpu()``. Default: a bit-for-bit copy.
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
    Always a copy. Device sources go through a ring of
    ``interop.config.num_buffers`` pinned buffers on a dedicated stream that
    waits (an event, not a device-wide sync) on the producer's current stream
    of the data's device, so the copy sees all work queued before the call;
    non-contiguous chunks are packed on the device into ring-sized staging
    rows. An ``out`` in page-locked memory (``cupyx.empty_pinned``, a pinned
    tensor's ``.numpy()``, registered memory) and C-contiguous is written by
    the DMAs directly. Host sources are copied chunk by chunk by
    ``interop.config.host_threads`` threads where that was set, else by all
    the CPUs (at most 8).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        ``x`` is not an array (or a nested, sparse or meta tensor); ``out``
        has the wrong type, shape or dtype, is read-only, overlaps the source
        or has elements that may share memory (a stride of 0, an
        ``as_strided`` view); ``dtype`` (not floating to floating),
        ``chunk_bytes`` or ``progress`` is refused. A ``TypeError`` or
        ``ValueError``, before anything is written.
    UnsupportedDtypeError
        The dtype has no NumPy equivalent (``torch.complex32``).
    NoDeviceError, BackendUnavailableError
        Device data without a usable CUDA device or CuPy.
    """
    return _copy_to_host(x, out, dtype, chunk_bytes, progress, inline=False)


def copy_to_host(
    x: Any,
    /,
    out: np.ndarray | None = None,
    *,
    dtype: Any = None,
    chunk_bytes: int | None = None,
    progress: Any = False,
) -> np.ndarray:
    """Copy ``x`` into host memory in chunks; ``copy_to_host_async(...).result()``
    (its parameters, copy semantics and stream order).

    Returns
    -------
    numpy.ndarray
        ``out`` itself when given, else a new array.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        As :func:`copy_to_host_async`, before anything is written.
    TransferError
        A chunk failed or the copy was cancelled; the message says which byte
        range is complete. The error keeps neither ``x`` nor ``out`` alive.
    KeyboardInterrupt
        Interrupted: the copy is cancelled and every resource released first.
    """
    if out is None and dtype is None and chunk_bytes is None and progress is False:
        fresh = _small_host_copy(x)
        if fresh is not None:
            return fresh
    transfer = _copy_to_host(x, out, dtype, chunk_bytes, progress, inline=True)
    del x, out  # a held error's traceback must not keep them alive
    return transfer.result()


HOST_SMALL_BYTES = 32 << 20  # at most one chunk of the default size: one copy, no engine


def _small_host_copy(x: Any) -> np.ndarray | None:
    """A plain host array (an exact NumPy array, not a memmap; a plain CPU
    tensor) of at most one chunk copied in one call, without the engine's
    bookkeeping; None for anything else."""
    if type(x) is np.ndarray:
        return x.copy() if x.nbytes <= HOST_SMALL_BYTES else None
    th = sys.modules.get("torch")  # no tensor exists before torch is imported
    if th is None or type(x) is not th.Tensor:
        return None
    try:  # refuses a tensor that needs the general rules: grad, conj/neg bit, bfloat16, device
        view = x.numpy()
    except (TypeError, RuntimeError):
        return None
    if view.nbytes > HOST_SMALL_BYTES:
        return None  # several chunks: the threaded engine
    # NumPy's copy, on this thread: PyTorch's copy_ splits it over its intra-op
    # threads, which wait for each other, and one of them descheduled on a busy
    # machine cost 6-8 ms a 1 MiB copy (0.01x t.numpy().copy(); 0.27 ms with one)
    return view.copy()


def _copy_to_host(
    x: Any,
    out: np.ndarray | None,
    dtype: Any,
    chunk_bytes: int | None,
    progress: Any,
    *,
    inline: bool,
) -> Transfer:
    """``copy_to_host_async``; ``inline``: the copy runs on the calling thread
    before this returns (``copy_to_host``, which waits for it anyway)."""
    check_options(chunk_bytes, progress)  # before anything is allocated
    src = array_source(x, "copy_to_host")
    cast = dtypes.check_cast(src.dtype, dtype, "copy_to_host")
    if out is None:
        out = np.empty(src.shape, src.dtype if cast is None else cast)
    else:
        check_host_out(out, src, "copy_to_host", cast)
    if src.on_device:
        request = TransferRequest(
            "copy_to_host",
            "d2h",
            out,
            CopyOut(out),
            device=src,
            chunk_bytes=chunk_bytes,
            progress=progress,
            host=out,
            cast=cast,
            inline=inline,
        )
    else:
        threads = host_copy_threads()
        if chunk_bytes is None:
            nbytes = nbytes_of(src.shape, out.dtype.itemsize)  # progress counts out's bytes
            chunk_bytes = host_chunk_bytes(nbytes, chunk_bytes_or_default(None), threads)
        request = TransferRequest(
            "copy_to_host",
            "h2h",
            out,
            CopyOut(out, src.obj, cast=cast is not None),
            shape=src.shape,
            itemsize=out.dtype.itemsize,
            chunk_bytes=chunk_bytes,
            progress=progress,
            threads=threads,
            inline=inline,
        )
    return start(request)


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

    The host threads and the copy stream work while the caller goes on. See
    :func:`copy_to_device` for the parameters, copy semantics, stream order
    and errors (all but ``TransferError`` raised here).

    Returns
    -------
    Transfer
        ``result()`` returns ``out`` (or the new CuPy array) once the data is
        on the device; ``bytes_done`` counts the bytes already there, in the
        source's C order.
    """
    return _copy_to_device(x, out, device, chunk_bytes, progress, inline=False)


def _copy_to_device(
    x: Any,
    out: Any,
    device: Any,
    chunk_bytes: int | None,
    progress: Any,
    *,
    inline: bool,
) -> Transfer:
    """``copy_to_device_async``; ``inline``: the copy runs on the calling thread
    before this returns (``copy_to_device``, which waits for it anyway)."""
    check_options(chunk_bytes, progress)  # before anything is allocated
    src = array_source(x, "copy_to_device")
    native = src.dtype.newbyteorder("=")
    if out is not None:
        dst = _device_out(out, src.shape, native, "copy_to_device")
        result = out
    else:
        if src.on_device:  # on the current (or the given) device of the source's kind
            backend = backend_for(src).peer(cuda_index(device))
            result = empty_result(backend, src.shape, native, "copy_to_device")
        else:
            result = empty_device(src.shape, native, device)
        dst = array_source(result, "copy_to_device")
    if src.on_device:
        request = TransferRequest(
            "copy_to_device",
            "d2d",
            result,
            device=src,
            target=dst,
            chunk_bytes=chunk_bytes,
            progress=progress,
        )
    else:
        request = TransferRequest(
            "copy_to_device",
            "h2d",
            result,
            CopyIn(src.obj, native),
            device=dst,
            chunk_bytes=chunk_bytes,
            progress=progress,
            host=_host_bytes(src, native),
            inline=inline,
        )
    return start(request)


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
        Host data (NumPy arrays of any strides and byte order, memmaps, CPU
        or pinned tensors) or device data (CuPy arrays, CUDA tensors).
    out : cupy.ndarray or torch.Tensor, optional
        Exactly ``x.shape`` and ``x``'s dtype in native byte order, any
        strides; checked before anything is written.
    device : optional
        Without ``out``: the CUDA device of the new CuPy array (default: the
        current one).
    chunk_bytes, progress
        As for :func:`copy_to_host_async` (chunks complete on the device).

    Returns
    -------
    cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new CuPy array.

    Notes
    -----
    Always a copy. Host data: host threads fill a ring of ``num_buffers``
    pinned slots (converting non-native byte order) while earlier slots are
    copied on a dedicated stream that first waits (an event, not a
    device-wide sync) on the current stream of ``out``'s library; the call
    returns once the data is on the device, so the result can be used on any
    stream. Extra pinned memory is the ring; a non-contiguous ``out`` uses as
    much device memory again for unpacking. A page-locked, C-contiguous,
    native-order source without a conjugate/negative bit is read by the DMAs
    directly.

    Device data: one copy queued on the current stream of ``out``'s library,
    after an event on ``x``'s library's current stream, which then waits for
    the copy too (no host synchronisation; the call does not wait for the
    copy). A conjugate/negative-bit tensor is first resolved into a
    temporary on ``x``'s stream; ``x`` on another device is first moved
    whole (one peer DMA of the bytes it spans) to ``out``'s device.

    Raises
    ------
    InvalidValueError, InvalidTypeError
        Wrong ``out`` (type, shape, dtype, elements that may share memory)
        or ``device`` (a ``ValueError`` or ``TypeError``); nothing is written.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing (:class:`~interop.CudaAfterForkError`
        in a process forked after its parent initialised CUDA).
    CaptureError
        Inside CUDA graph capture: host data (it goes through pinned host
        memory); a new result without ``out`` (CuPy's pool would grow with
        ``cudaMalloc``; not under :func:`interop.use_torch_allocator`); device
        data between two streams one of which captures, unless ``x``'s
        captures and ``out``'s can join it (not the legacy default stream).
        Raised before anything is allocated or queued: the capture stays valid.
    TransferError
        A chunk failed; the message says which byte range is complete. Every
        staging buffer and stream is released.
    """
    transfer = _copy_to_device(x, out, device, chunk_bytes, progress, inline=True)
    del x, out
    return transfer.result()
