"""``copy_to_host`` and ``copy_to_device`` (and their asynchronous forms): check
the arguments, build one :class:`~interop.pipeline.request.TransferRequest`, start it."""

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
        A CuPy array, a PyTorch tensor (CUDA or CPU) or a NumPy array (memmaps
        included), any strides; bfloat16/float8 come as their ``ml_dtypes`` dtype.
    out : numpy.ndarray, optional
        Writable, exactly ``x.shape`` and the matching dtype, any strides;
        default: a new array.
    dtype : numpy dtype, optional
        Cast a floating ``x`` to this floating dtype, chunk by chunk where it is.
    chunk_bytes : int, optional
        Chunk (staging buffer) size; default ``interop.config.chunk_bytes``.
    progress : bool or callable
        ``True``: a tqdm bar in bytes; a callable gets ``(bytes_done, bytes_total)``
        from the transfer's thread as chunks complete.

    Returns
    -------
    Transfer
        ``result()`` returns ``out``.

    Notes
    -----
    Always a copy. Ordered after the work queued on the producer's current
    stream (an event, not a device-wide sync); device data goes through a ring
    of pinned buffers on a dedicated stream (a page-locked, C-contiguous ``out``
    is written by the DMAs directly), host data is copied by host threads.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        ``x`` is not an array; ``out`` has the wrong type, shape or dtype, is
        read-only, overlaps ``x`` or has elements that share memory; a refused
        ``dtype``, ``chunk_bytes`` or ``progress``. Before anything is written.
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
    """Copy ``x`` into host memory in chunks: ``copy_to_host_async(...).result()``
    (see it for the parameters, copy semantics and stream order).

    Returns
    -------
    numpy.ndarray
        ``out`` itself when given, else a new array.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        As :func:`copy_to_host_async`, before anything is written.
    TransferError
        A chunk failed; the message says which byte range is complete.
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
    """A plain NumPy array or CPU tensor of at most one chunk, copied in one call; else None."""
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
    """``copy_to_host_async``; ``inline``: run the copy on this thread before returning."""
    check_options(chunk_bytes, progress)  # before anything is allocated
    src = array_source(x, "copy_to_host")
    cast = dtypes.check_cast(src.dtype, dtype, "copy_to_host")
    fresh = out is None
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
            fresh=fresh,
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

    See :func:`copy_to_device` for the parameters, copy semantics, stream order
    and errors (all but ``TransferError`` raised here).

    Returns
    -------
    Transfer
        ``result()`` returns ``out`` (or the new CuPy array) once the data is on the device.
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
    """``copy_to_device_async``; ``inline``: run the copy on this thread before returning."""
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
    options: dict[str, Any] = {"chunk_bytes": chunk_bytes, "progress": progress}
    if src.on_device:
        request = TransferRequest(
            "copy_to_device", "d2d", result, device=src, target=dst, **options
        )
    else:
        stage, host = CopyIn(src.obj, native), _host_bytes(src, native)
        request = TransferRequest(
            "copy_to_device", "h2d", result, stage, device=dst, host=host, inline=inline, **options
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
        tensors) or device data (CuPy arrays, CUDA tensors).
    out : cupy.ndarray or torch.Tensor, optional
        Exactly ``x.shape`` and ``x``'s dtype in native byte order, any strides.
    device : optional
        Without ``out``: the CUDA device of the new CuPy array (default: the current one).
    chunk_bytes, progress
        As for :func:`copy_to_host_async` (chunks complete on the device).

    Returns
    -------
    cupy.ndarray or torch.Tensor
        ``out`` itself when given, else a new CuPy array.

    Notes
    -----
    Always a copy. Host data: host threads fill a ring of pinned slots copied
    on a dedicated stream that first waits (an event) on the current stream of
    ``out``'s library; the call returns once the data is on the device. Device
    data: one copy queued on the current stream of ``out``'s library after an
    event on ``x``'s library's current stream; the call does not wait for it.

    Raises
    ------
    InvalidValueError, InvalidTypeError
        Wrong ``out`` (type, shape, dtype, elements that share memory) or
        ``device``; nothing is written.
    NoDeviceError, BackendUnavailableError
        No CUDA device, or CuPy missing.
    CaptureError
        Inside CUDA graph capture: host data, a new result without ``out``, or two
        streams one of which captures; raised before anything is queued.
    TransferError
        A chunk failed; the message says which byte range is complete.
    """
    transfer = _copy_to_device(x, out, device, chunk_bytes, progress, inline=True)
    del x, out
    return transfer.result()
