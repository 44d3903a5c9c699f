"""One CUDA stream for PyTorch and CuPy: ``interop.stream`` and stream helpers."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _backends, _process
from ._process import stream_uses
from .errors import InvalidTypeError, InvalidValueError

__all__ = ["stream"]

# cudaStreamLegacy, which PyTorch and CuPy call 0 (PyTorch refuses 1 as an external stream)
LEGACY_DEFAULT = 1
# cudaStreamPerThread: CuPy's default stream with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
PER_THREAD_DEFAULT = 2


def cupy_consumer_handle(s: Any) -> int:
    """The handle CuPy's ``from_dlpack`` names for stream ``s`` (null: the default one)."""
    handle = int(s.ptr)
    if handle:
        return handle
    from cupy_backends.cuda.stream import get_default_stream_ptr  # CuPy >= 8

    return int(get_default_stream_ptr())


def same_stream(a: int, b: int) -> bool:
    """True if two raw handles name the same stream (0 and 1 are both legacy)."""
    return (0 if a == LEGACY_DEFAULT else a) == (0 if b == LEGACY_DEFAULT else b)


class _StreamHandle:
    """A raw handle presented through the ``__cuda_stream__`` protocol."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self._handle)


def resolve_stream(s: Any) -> tuple[int, int | None]:
    """``(handle, device index or None)`` of a stream-like, or the error."""
    if isinstance(s, bool) or s is None:
        raise _not_a_stream(s)
    if isinstance(s, int):
        if s < 0:
            raise InvalidValueError(f"expected a stream handle >= 0 (got {s!r})")
        return s, None
    module = type(s).__module__
    if module.startswith("torch") and hasattr(s, "cuda_stream") and hasattr(s, "device"):
        return int(s.cuda_stream), s.device.index
    if module.startswith("cupy") and hasattr(s, "ptr") and hasattr(s, "device_id"):
        device = int(s.device_id)
        return int(s.ptr), device if device >= 0 else None
    protocol = getattr(s, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        pair = isinstance(value, tuple) and len(value) == 2
        if not (pair and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise InvalidTypeError(
                f"expected __cuda_stream__() to return (version, handle) ints (got {value!r})"
            )
        return resolve_stream(value[1])[0], None
    raise _not_a_stream(s)


def _not_a_stream(s: Any) -> InvalidTypeError:
    return InvalidTypeError(
        "expected a torch.cuda.Stream, a cupy.cuda.Stream, an object with __cuda_stream__ "
        f"or a raw stream handle (int) (got {type(s).__module__}.{type(s).__qualname__}: {s!r})"
    )


def capturing(query: Callable[[], Any]) -> bool:
    """``query()``'s "does this stream capture?"; a refused query counts as yes."""
    try:
        return bool(query())
    except RuntimeError:
        return True


def capture_under_way() -> bool:
    """True while a capture interop can see is under way (docs/streams.md says which)."""
    th, cp = sys.modules.get("torch"), sys.modules.get("cupy")
    initialized = th is not None and th.cuda.is_initialized()  # no capture of PyTorch's before
    if initialized and capturing(th.cuda.is_current_stream_capturing):  # type: ignore[union-attr]
        return True
    if cp is None:
        return False
    if capturing(cp.cuda.get_current_stream().is_capturing):
        return True
    query = cp.cuda.runtime.streamIsCapturing
    return any(capturing(functools.partial(query, h)) for _, h in list(stream_uses.active))


_cupy_streams: dict[tuple[int, int], Any] = {}  # (device, handle) -> CuPy stream object
_cupy_streams_lock = threading.Lock()  # serialises the stores into _cupy_streams
_process.at_fork("cupy streams", _cupy_streams.clear)  # the parent's, of its CUDA context


def cupy_stream(handle: int, device: int) -> Any:
    """A CuPy stream object for a raw handle (cached: making one costs microseconds)."""
    key = (device, handle)
    found = _cupy_streams.get(key)
    if found is not None:
        return found
    cp = _backends.cupy()
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if handle == 0:
        found = cp.cuda.Stream.null
    elif from_external is not None:
        found = from_external(_StreamHandle(handle))
    else:
        found = cp.cuda.ExternalStream(handle, device)
    with _cupy_streams_lock:
        if len(_cupy_streams) > 256:  # streams come and go: keep the cache small
            _cupy_streams.clear()
        _cupy_streams[key] = found
    return found


def torch_stream(handle: int, device: int) -> Any:
    """A PyTorch stream object for a raw handle (0 and 1: the default stream)."""
    th = _backends.torch()
    if handle in (0, LEGACY_DEFAULT):
        return th.cuda.default_stream(device)
    return th.cuda.ExternalStream(handle, device=th.device("cuda", device))


def torch_stream_handle(index: int) -> int:
    """The handle of PyTorch's current stream on device ``index`` (raw: no Stream object)."""
    th = _backends.torch()
    raw = getattr(th._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(index))
    return int(th.cuda.current_stream(index).cuda_stream)


@contextlib.contextmanager
def stream(s: Any) -> Iterator[Any]:
    """Make ``s`` the current stream of both PyTorch and CuPy inside the block.

    Parameters
    ----------
    s : stream-like
        A PyTorch or CuPy stream, a ``__cuda_stream__`` object, or a raw handle (int).

    Yields
    ------
    s

    Notes
    -----
    Its device is both libraries' current device in the block; nothing is
    synchronised; the previous streams and devices come back on exit.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        ``s`` is not a stream-like, or a negative handle; checked first.
    BackendUnavailableError, NoDeviceError
        PyTorch or CuPy is not installed, or no CUDA device is visible.
    """
    handle, device = resolve_stream(s)
    th = _backends.require_torch_cuda()
    cp = _backends.require_cupy_device()
    if device is None:
        device = int(cp.cuda.runtime.getDevice())
    module = type(s).__module__
    is_torch = module.startswith("torch") and hasattr(s, "cuda_stream")
    torch_side = s if is_torch else torch_stream(handle, device)
    cupy_side = (
        s if module.startswith("cupy") and hasattr(s, "ptr") else cupy_stream(handle, device)
    )
    key = (int(device), 0 if handle == LEGACY_DEFAULT else int(handle))
    with contextlib.ExitStack() as stack:
        stack.enter_context(cp.cuda.Device(device))
        stack.enter_context(th.cuda.device(device))
        stack.enter_context(th.cuda.stream(torch_side))
        stack.enter_context(cupy_side)
        stream_uses.enter(key)
        stack.callback(stream_uses.leave, key)
        yield s


class Unsynchronised:
    """A CUDA tensor exported over DLPack with ``stream=-1``: the caller ordered the streams."""

    def __init__(self, t: Any) -> None:
        self._t = t

    def __dlpack__(self, **kwargs: Any) -> Any:
        kwargs["stream"] = -1
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()
