"""What an array is to interop: is it one, where it lives, whether two overlap."""

from __future__ import annotations

import operator
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from . import _backends, dtypes

# the bit views, under the names the pipeline, npy and dask import from here
from .dtypes import bits as bits
from .dtypes import host_values as host_values
from .dtypes import numpy_view_of_cpu_tensor as numpy_view_of_cpu_tensor
from .errors import InvalidTypeError, InvalidValueError

if TYPE_CHECKING:
    import torch

__all__: list[str] = []

Target = tuple[Literal["cpu", "cuda"], "int | None"]

# array types of devices other than CUDA -> the Backend (pipeline.backend) moving one
_device_types: dict[type, Callable[[Any], Any]] = {}


def register_device_type(cls: type, backend_of: Callable[[Any], Any]) -> None:
    """Make ``cls`` arrays (``shape``, NumPy ``dtype``) device data, moved by ``backend_of(x)``."""
    _device_types[cls] = backend_of  # how the emulated device of interop.testing plugs in


def describe(x: object) -> str:
    """``module.Type: repr`` of ``x``, the repr cut to 60 characters."""
    text = repr(x)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(x).__module__}.{type(x).__qualname__}: {text}"


def not_an_array(func: str, x: object) -> InvalidTypeError:
    return InvalidTypeError(
        f"{func} expected a NumPy array (or scalar), a PyTorch tensor, a CuPy array, or an "
        f"object with __dlpack__ or __cuda_array_interface__ (got {describe(x)})"
    )


def is_array(x: object) -> bool:
    """True for anything interop can take as an array (never imports a library)."""
    return (
        isinstance(x, (np.ndarray, np.generic, *_backends.array_types()))
        or type(x) in _device_types
        or hasattr(x, "__dlpack__")
        or hasattr(x, "__cuda_array_interface__")
    )


def is_device_array(x: object) -> bool:
    """True for a CuPy array, a CUDA tensor or an array of a registered device."""
    if _backends.is_cupy_array(x) or type(x) in _device_types:
        return True
    return _backends.is_torch_tensor(x) and x.device.type == "cuda"  # type: ignore[attr-defined]


def parse_device(device: object) -> Target | None:
    """``device`` as ``("cpu", None)`` or ``("cuda", index or None)``, or the error."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidTypeError(f"expected a device (got {device!r})")
    if isinstance(device, int):
        if device < 0:
            raise InvalidValueError(f"expected a CUDA device index >= 0 (got {device!r})")
        return ("cuda", device)
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cpu" and not index:
            return ("cpu", None)
        if kind == "cuda" and (not index or index.isdigit()):
            return ("cuda", int(index) if index else None)
        raise InvalidValueError(f"expected 'cpu', 'cuda' or 'cuda:N' (got {device!r})")
    module = type(device).__module__
    dev: Any = device
    if module.startswith("torch") and hasattr(dev, "type"):
        return parse_device("cpu" if dev.type == "cpu" else str(dev))  # 'cuda:N', 'meta'...
    if module.startswith("cupy") and hasattr(dev, "id"):
        return ("cuda", int(dev.id))
    raise InvalidTypeError(
        "expected a device: 'cpu', 'cuda', 'cuda:N', an int, a torch.device or a "
        f"cupy.cuda.Device (got {describe(device)})"
    )


def target_str(target: Target) -> str:
    """``'cpu'``, ``'cuda'`` or ``'cuda:N'``."""
    kind, index = target
    return kind if index is None else f"{kind}:{index}"


def check_tensor(t: torch.Tensor, func: str, *, data: bool = True) -> None:
    """Refuse tensors that are not strided CPU or CUDA memory (``data``: of their own)."""
    th = _backends.torch()
    if t.is_nested:  # strided layout too, but its sizes and strides are per component
        raise InvalidTypeError(
            f"{func} expected a dense (strided) tensor (got a nested tensor, layout "
            f"{t.layout}); pass torch.nested.to_padded_tensor(t, 0.0), or each of t.unbind()"
        )
    if t.is_cpu and t.layout is th.strided:
        pass  # the common case
    elif t.layout is not th.strided:
        raise InvalidTypeError(
            f"{func} expected a dense (strided) tensor (got layout {t.layout}); "
            "call t.to_dense() first"
        )
    elif t.device.type == "meta":
        raise InvalidValueError(
            f"{func} expected a CPU or CUDA tensor (got a meta tensor, which has no data); "
            "make one with data first, e.g. torch.empty_like(t, device='cpu')"
        )
    elif not t.is_cuda:
        raise InvalidValueError(
            f"{func} expected a CPU or CUDA tensor (got device {str(t.device)!r}); use t.cpu()"
        )
    if data and not th._C._has_storage(t):  # a functorch wrapper: its data is the transform's
        raise InvalidValueError(
            f"{func} expected a tensor with data (got one inside a torch.func transform); "
            f"call {func} outside the transform"
        )
    if data and type(t) is not th.Tensor and t.untyped_storage().device.type == "meta":
        raise InvalidValueError(
            f"{func} expected a tensor with data (got a FakeTensor, from tracing); call it "
            "outside the traced code, or wrap the code with interop.torch_op"
        )


def raw_host_memory(x: Any) -> np.ndarray:
    """The bytes a host array reads (a tensor's whatever its dtype), zero-copy."""
    if isinstance(x, np.ndarray):
        return x
    th, size = _backends.torch(), x.element_size()
    strides = (*(s * size for s in x.stride()), 1)
    raw = th.empty(0, dtype=th.uint8).set_(
        x.untyped_storage(), x.storage_offset() * size, (*x.shape, size), strides
    )
    return raw.numpy()


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """True if two host arrays may write into each other's elements."""
    if not a.size or not b.size or not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True


def check_elements_apart(out: Any, func: str, where: str = "") -> None:
    """Refuse an ``out`` (any array kind) two of whose elements may share memory."""
    if _backends.is_torch_tensor(out):
        itemsize = out.element_size()
        strides = tuple(s * itemsize for s in out.stride())
    else:
        itemsize, strides = np.dtype(out.dtype).itemsize, tuple(out.strides)
    shape = tuple(out.shape)
    if 0 in shape:
        return
    # apart for certain: sorted by stride, each axis steps past the axes inside it
    extent = itemsize
    for stride, n in sorted((abs(s), n) for s, n in zip(strides, shape, strict=True) if n > 1):
        if stride < extent:
            raise InvalidValueError(
                f"{func} expected an out{where} whose elements are apart (got shape {shape} "
                f"with strides {strides}, whose elements may share memory); pass a new array"
            )
        extent += stride * (n - 1)


# DLPack device types (dlpack.h) interop reads -> on the host: CPU, CUDA, pinned, managed
_DL_ON_HOST = {1: True, 2: False, 3: True, 13: False}


def dlpack_device(x: Any, func: str) -> tuple[bool, int]:
    """``(on the host, device index)`` of a DLPack producer, or InvalidValueError."""
    try:
        kind, index = x.__dlpack_device__()
        kind, index = operator.index(kind), operator.index(index)
    except Exception as exc:
        raise InvalidValueError(
            f"{func} expected __dlpack_device__() to return (device type, device index) ints "
            f"(got {type(exc).__name__}: {exc} from {describe(x)}); convert it first"
        ) from exc
    on_host = _DL_ON_HOST.get(kind)
    if on_host is None:
        raise InvalidValueError(f"{func} expected CPU or CUDA data (got DLPack device {kind!r})")
    return on_host, index


def import_foreign(
    x: Any,
    func: str,
    require: Callable[[], Any] | None = None,
    context: Callable[[int], AbstractContextManager[Any]] | None = None,
) -> Any:
    """NumPy or CuPy sharing a foreign producer's memory (CUDA data inside ``context``)."""
    dlpack = hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")
    if not dlpack and not hasattr(x, "__cuda_array_interface__"):
        raise not_an_array(func, x)
    if require is not None:
        require()  # BackendUnavailableError or NoDeviceError before any work
    on_host, index = dlpack_device(x, func) if dlpack else (False, None)
    cp = None if on_host else _backends.require_cupy_device()
    # CUDA DLPack data in ``context``, entered outside the try: its errors are not the producer's
    with context(index) if context and cp and index is not None else nullcontext():
        try:
            if cp is None:
                return np.from_dlpack(x)
            if index is None:
                return cp.asarray(x)  # __cuda_array_interface__: zero-copy
            with cp.cuda.Device(index):
                return cp.from_dlpack(x)  # on CuPy's current stream there
        except Exception as exc:
            raise InvalidValueError(
                f"{func} expected an object whose DLPack export holds its data (got "
                f"{describe(x)}, whose export failed: {type(exc).__name__}: {exc}); convert "
                "it with its own library first (e.g. numpy.asarray(x))"
            ) from exc


class Source(NamedTuple):
    """An array as the transfer functions see it, described once per call."""

    obj: Any  # what chunk views are taken of: ndarray, detached tensor, CuPy or device array
    shape: tuple[int, ...]
    dtype: np.dtype  # the NumPy (or ml_dtypes) dtype of its values
    on_device: bool
    cuda: int | None = None  # the CUDA device index of a CuPy array or CUDA tensor
    device: Any = None  # the Backend of an array of a registered device type


def array_source(x: Any, func: str) -> Source:
    """Describe ``x`` without moving data (a foreign object imported zero-copy)."""
    if isinstance(x, np.generic):  # a NumPy scalar: a 0-d array, as numpy.asarray gives
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        return Source(x, x.shape, x.dtype, False)
    tensor, cupy_array = _backends.array_types()
    backend_of = _device_types.get(type(x))
    if backend_of is not None:
        return Source(x, tuple(x.shape), np.dtype(x.dtype), True, None, backend_of(x))
    if not isinstance(x, (tensor, cupy_array)):
        x = import_foreign(x, func)  # a NumPy or CuPy array now
        if isinstance(x, np.ndarray):
            return Source(x, x.shape, x.dtype, False)
    if isinstance(x, cupy_array):
        return Source(x, tuple(x.shape), np.dtype(x.dtype), True, int(x.device.id))
    check_tensor(x, func, data=False)
    cuda = x.device.index if x.device.type == "cuda" else None
    dtype = dtypes.numpy_dtype_of_torch(x.dtype)
    return Source(x.detach(), tuple(x.shape), dtype, cuda is not None, cuda)


def check_host_out(out: Any, src: Source, func: str, cast: np.dtype | None = None) -> None:
    """Refuse a host ``out`` for ``src`` but a writable, separate array of its shape and dtype."""
    if not isinstance(out, np.ndarray):
        raise InvalidTypeError(
            f"{func} expected out to be a writable NumPy array (numpy.memmap included) (got "
            f"{type(out).__module__}.{type(out).__qualname__}); use copy_to_device for devices"
        )
    if out.shape != src.shape:
        raise InvalidValueError(f"{func} expected out of shape {src.shape} (got {out.shape})")
    if not out.flags.writeable:
        raise InvalidValueError(f"{func} expected a writable out (got a read-only array)")
    check_elements_apart(out, func)
    if not src.on_device and overlaps(out, raw_host_memory(src.obj)):
        raise InvalidValueError(f"{func} expected out not to overlap the source (got an overlap)")
    want = src.dtype if cast is None else cast
    if out.dtype != want:
        raise InvalidValueError(dtypes.mismatch_message(func, want, out.dtype, cast is None))
