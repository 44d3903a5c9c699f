"""How every row measures: sizes, timers, peak memory, checked first calls, and ratios."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _backends
from ..errors import BackendUnavailableError, NoDeviceError

GB, MiB, GiB = 1e9, 1 << 20, 1 << 30
#: What a ratio compares: time and memory, lower is better; throughput, higher is better.
QUANTITIES = ("time", "throughput", "memory")


class WrongResultError(AssertionError):
    """A benchmarked call returned wrong data; its row is an error, not a figure."""


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``value = ours / reference`` of one ``quantity`` (see :data:`QUANTITIES`), both
    measured in the same run, ``of`` what (``"to_numpy"``) ``to`` what (``"numpy.from_dlpack"``,
    or a memory bound in words); None where either side was not measured or is zero."""

    of: str
    quantity: str
    to: str
    value: float | None

    def __post_init__(self) -> None:
        if self.quantity not in QUANTITIES:
            raise ValueError(f"expected a quantity in {QUANTITIES} (got {self.quantity!r})")

    @classmethod
    def between(cls, of: str, quantity: str, to: str, ours: Any, reference: Any) -> Ratio:
        """The ratio ``ours / reference``; None when it is not a finite number."""
        value = ours / reference if ours is not None and reference else None
        return cls(of, quantity, to, value if value is not None and math.isfinite(value) else None)

    def record(self) -> dict[str, Any]:
        """The JSON form."""
        return dataclasses.asdict(self)


def gpu_unavailable() -> str | None:
    """Why the GPU rows cannot run here, or None when they can."""
    try:
        _backends.require_cupy_device()
        _backends.require_torch_cuda()
    except NoDeviceError as exc:
        return f"no CUDA device: {str(exc).split(';')[0]}"
    except BackendUnavailableError as exc:
        return f"no CUDA device usable: {exc}"
    return None


def host_unavailable() -> str | None:
    """Why the host rows cannot run here (PyTorch missing), or None when they can."""
    try:
        _backends.torch()
    except BackendUnavailableError as exc:
        return f"PyTorch is not installed: {exc}"
    return None


@dataclasses.dataclass(frozen=True)
class BenchSizes:
    """Repeats, calls per repeat of per-call rows, each kind of row's bytes, and the
    ``scale`` (``INTEROP_BENCH_SCALE``) that multiplied them."""

    repeats: int
    calls: int
    host_bytes: int
    rss_bytes: int
    gpu_bytes: int
    scale: float = 1.0

    @classmethod
    def choose(cls, quick: bool, scale: float = 1.0) -> BenchSizes:
        """A full or ``quick`` run's sizes times ``scale``; ValueError for a bad ``scale``."""
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"expected a positive scale (got {scale!r})")
        # repeats, calls, then the bytes in MiB of host_copy, save_npy_rss and the GPU rows
        repeats, calls, *mib = (3, 2000, 64, 64, 256) if quick else (5, 20000, 256, 768, 1024)
        host, rss, gpu = (max(MiB, int(n * MiB * scale) // 4096 * 4096) for n in mib)
        return cls(repeats, max(100, int(calls * scale)), host, rss, gpu, float(scale))


def scale_from_env() -> float:
    """``INTEROP_BENCH_SCALE`` as a float (1.0 when unset); ValueError unless positive."""
    raw = os.environ.get("INTEROP_BENCH_SCALE", "").strip()
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"expected INTEROP_BENCH_SCALE to be a positive number (got {raw!r}); "
            "unset it or use e.g. 0.25"
        )
    return value


def status_bytes(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``"VmRSS"``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            line = next((line for line in f if line.startswith(key + ":")), None)
    except OSError:
        return None
    return int(line.split()[1]) * 1024 if line else None


class PeakRss:
    """Peak growth of this process's RSS over a ``with`` block (``extra_bytes``), by ``method``
    ``"VmHWM"`` (the kernel's peak, reset through ``/proc/self/clear_refs``), or where that is
    refused ``"sampled VmRSS"`` every millisecond, or off Linux ``"unavailable"`` (None)."""

    extra_bytes: int | None = None
    method = "unavailable"

    def __enter__(self) -> PeakRss:
        self._stop, self._thread = threading.Event(), None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.method = "VmHWM"
        except OSError:
            self.method = "sampled VmRSS"
        self._base = self._peak = status_bytes("VmRSS") or 0
        if not self._base:
            self.method = "unavailable"
        elif self.method == "sampled VmRSS":
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, status_bytes("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        if not self._base:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, status_bytes("VmRSS") or 0)
        else:
            peak = status_bytes("VmHWM") or 0
        self.extra_bytes = max(0, peak - self._base)


@dataclasses.dataclass
class Case:
    """A measured call ``fn`` moving ``nbytes``: ``check`` raises :class:`WrongResultError` for
    a wrong first result, ``prepare`` runs untimed before that call (to poison ``out``),
    ``settle`` untimed after every call (to wait for work it left in the background)."""

    fn: Callable[[], Any]
    nbytes: int = 0
    check: Callable[[Any], None] | None = None
    prepare: Callable[[], object] = lambda: None
    settle: Callable[[], object] = lambda: None


@dataclasses.dataclass
class Measured:
    """Timings (every repeat's seconds) and the first call's memory of one :class:`Case`."""

    seconds: list[float]
    nbytes: int = 0
    calls: int = 1
    extra_host_bytes: int | None = None
    extra_device_bytes: int | None = None
    checked: bool = False

    @property
    def gbps(self) -> float:
        """GB/s (1e9) of the median repeat."""
        return self.nbytes / statistics.median(self.seconds) / GB

    @property
    def us(self) -> float:
        """Microseconds per call of the median repeat."""
        return statistics.median(self.seconds) / self.calls * 1e6

    def record(self) -> dict[str, Any]:
        """The JSON form: every repeat, and the memory where it was measured."""
        out = {
            "seconds": self.seconds,
            "calls": self.calls,
            "bytes": self.nbytes or None,
            "extra_host_rss_bytes": self.extra_host_bytes,
            "extra_device_bytes": self.extra_device_bytes,
            "result_checked": self.checked or None,
        }
        return {key: value for key, value in out.items() if value is not None}


def measure(
    cases: dict[str, Case],
    repeats: int,
    *,
    sync: Callable[[], object] | None = None,
    release: Callable[[], object] | None = None,
) -> dict[str, Measured]:
    """Time ``cases`` interleaved (so drift hits all alike), ``repeats`` rounds. Each case's
    first call is untimed, after ``release`` (emptying the caches, so what it allocates
    counts): its extra host RSS is measured and its result checked. With ``release``, one
    untimed round warms up again. ``sync`` waits for the device inside the timed region."""
    results: dict[str, Measured] = {}
    sync = sync or (lambda: None)
    for label, case in cases.items():
        case.prepare()
        if release is not None:
            release()
        with PeakRss() as rss:
            value = case.fn()
            sync()
        case.settle()
        if case.check is not None:
            case.check(value)
        del value
        results[label] = Measured([], case.nbytes, 1, rss.extra_bytes, None, case.check is not None)
    for timed in [False] * (release is not None) + [True] * repeats:  # warm again, then timed
        for label, case in cases.items():
            start = time.perf_counter()
            case.fn()
            sync()
            if timed:
                results[label].seconds.append(time.perf_counter() - start)
            case.settle()
    return results


def expect_equal(reference: Any, what: str) -> Callable[[Any], None]:
    """A :class:`Case` check: the result equals ``reference``, else :class:`WrongResultError`."""

    def check(result: Any) -> None:
        if not np.array_equal(np.asarray(result), reference):
            raise WrongResultError(f"{what} returned data that differs from the source")

    return check
