"""The slot pipeline: chunked copies between host and device memory.

``plan``      which chunks, how large the staging slots are
``progress``  the progress bar or callback, in completed bytes
``future``    :class:`Transfer`, the future a running copy is
``ring``      host staging rings (pinned memory) and their cache
``backend``   the small device interface the schedule talks to
``schedule``  the ring-of-slots schedule, once for both directions
``cuda``      the CUDA backend (CuPy runtime calls)
``host``      the host backend: a CPU stream that enforces CUDA's rules
``hostcopy``  the host engine: host-to-host copies on a thread pool
"""

from __future__ import annotations

from typing import Any

from .. import _backends
from ..arrays import is_emulated_device_array
from .backend import Backend

__all__ = ["backend_of"]


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
    from .cuda import cuda_backend

    if _backends.is_cupy_array(x):
        return cuda_backend(int(x.device.id))
    if _backends.is_torch_tensor(x) and x.device.type == "cuda":
        return cuda_backend(int(x.device.index))
    raise TypeError(f"expected device data (got {type(x).__module__}.{type(x).__qualname__})")
