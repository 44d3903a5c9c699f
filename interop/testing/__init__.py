"""Testing aids for interop and for code that uses it, as ``numpy.testing`` is.

:class:`EmulatedDevice` is a GPU emulated on the CPU, the slot schedule's
second backend (like kvikio's compatibility mode). It is a real engine, not a
mock: each stream is a worker thread executing its queued work in order,
events complete when their stream reaches them, "device" memory is host
memory, and data really moves. What it adds is CUDA's rules, checked on every
call, so a schedule bug fails loudly on a CPU instead of corrupting data on a
GPU: a broken rule raises :class:`RuleViolation` where it happens and is kept
in :attr:`EmulatedDevice.violations`. Its arrays are device data to
``copy_to_host``, ``copy_to_device``, ``save_npy`` and ``load_npy``
(registered through the same device interface as CUDA's), so a machine
without a GPU runs the same transfer code paths. Importing this module
imports neither torch nor CuPy.

The rules, by the module that keeps them:

* ``_memory``: no memory is used on a stream before that stream is ordered
  after the last conflicting use on another (its allocation counts as a use),
  nor after it was freed; device memory comes from a caching pool with
  PyTorch's and CuPy's rule (a freed block is handed out again at once on the
  stream it was allocated on, so work left queued on another stream without
  an event or ``record_stream`` is a use-after-free, caught at the reuse and
  again when that work runs); in a capture the pool grows only for PyTorch's
  allocations on the capturing stream; staging rows start on 256 bytes.
* ``_machine``: a DMA reaches one live page-locked buffer or one registered
  range, never across two; ``host_register`` locks whole pages (none twice,
  none during a capture); a host thread touches a staging slot only after it
  saw the slot's device copies complete, and no device copy is queued on a
  slot it uses; in a forked child every call fails; CUDA's contexts are made on
  each thread's current device; injected faults (sticky in device work).
* ``_streams``: device work is queued only while its device is current; an
  event is recorded only on a stream of its own device and waited on only
  after it was recorded; a stream is closed only after the host saw its work
  complete.
* ``_capture``: a capturing stream's work is recorded, not run; what CUDA's
  global capture mode forbids (synchronising, querying events, pinned
  allocation...) fails and invalidates the capture; streams that joined a
  capture are joined back before it ends.
* ``_device``: typed device accesses are naturally aligned; a DMA copies a
  C-contiguous device array of exactly the bytes asked; each library has its
  own current stream, and under ``torch_allocator`` CuPy allocates only where
  PyTorch's current stream is its own.
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
