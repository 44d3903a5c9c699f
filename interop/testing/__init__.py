"""Testing aids for interop and for code that uses it, as ``numpy.testing`` is.

:class:`EmulatedDevice` is a GPU emulated on the CPU: a real engine (each
stream a worker thread executing queued copies in order, events completing
when reached, memory that really moves) that enforces CUDA's rules and
raises :class:`RuleViolation` where one is broken -- alignment, event order,
a caching pool that reuses a freed block at once on its stream, several
devices, graph capture. Its arrays are device data to ``copy_to_host``,
``copy_to_device``, ``save_npy`` and ``load_npy`` (registered through the
same device interface as CUDA's), so a machine without a GPU runs the same
transfer code paths. Importing this module imports neither torch nor CuPy.
"""

from __future__ import annotations

from ._capture import EmulatedGraph
from ._device import DeviceArray, EmulatedDevice, InvertedArray
from ._machine import EmulatedCaptureError, EmulatedDeviceError, RuleViolation
from ._streams import EmulatedStream

__all__ = [
    "DeviceArray",
    "EmulatedCaptureError",
    "EmulatedDevice",
    "EmulatedDeviceError",
    "EmulatedGraph",
    "EmulatedStream",
    "InvertedArray",
    "RuleViolation",
]
