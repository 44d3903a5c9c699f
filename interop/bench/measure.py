"""How every row measures: sizes, timed cases with checked first calls, peak RSS, ratios."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _backends
from ..errors import BackendUnavailableError, NoDeviceError

GB, MiB, GiB = 1e9, 1 << 20, 1 << 30
#: What a ratio compares: time and memory, lower is better; throughput, higher is better.
QUANTITIES = ("time", "throughput", "memory")


class WrongResultError(AssertionError):
    """A benchmarked call returned wrong data; its row is an error, not a figure."""


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``value``: ``of`` over ``to`` (a call, or a bound in words) in a ``quantity``."""

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
        value = ours / reference if ours is not None and reference else math.nan
        return cls(of, quantity, to, value if math.isfinite(value) else None)

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gpu_unavailable(driver: str = "/proc/driver/nvidia/gpus") -> str | None:
    """Why the GPU rows cannot run here, or None when they can (``driver``: a GPU per entry)."""
    try:
        _backends.require_cupy_device()
        _backends.require_torch_cuda()
    except NoDeviceError as exc:
        return f"no CUDA device: {str(exc).split(';')[0].split('got none: ')[-1].rstrip(')')}"
    except BackendUnavailableError as exc:  # CuPy or torch missing: worth installing with a GPU
        gpu = any(Path(driver).glob("*"))
        return f"no CUDA device usable: {exc}" if gpu else "no CUDA device: the driver lists no GPU"
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
    """Repeats, calls per repeat, bytes of each kind of row, the ``scale`` that multiplied them."""

    repeats: int
    calls: int
    host_bytes: int
    rss_bytes: int
    gpu_bytes: int
    scale: float = 1.0

    @classmethod
    def choose(cls, quick: bool, scale: float | str = 1.0) -> BenchSizes:
        """A full or ``quick`` run's sizes times ``scale``; ValueError unless a positive number."""
        try:
            factor = float(scale)
        except (TypeError, ValueError):
            factor = math.nan
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(
                f"expected INTEROP_BENCH_SCALE to be a positive number (got {scale!r}); "
                "unset it or use e.g. 0.25"
            )
        # repeats, calls, then the MiB of host_copy, save_npy_rss and the GPU rows
        repeats, calls, *mib = (3, 2000, 64, 64, 256) if quick else (5, 20000, 256, 768, 1024)
        host, rss, gpu = (max(MiB, int(n * MiB * factor) // 4096 * 4096) for n in mib)
        return cls(repeats, max(100, int(calls * factor)), host, rss, gpu, factor)


def scale_from_env() -> str:
    """``INTEROP_BENCH_SCALE`` as given (``"1"`` when unset), for :meth:`BenchSizes.choose`."""
    return os.environ.get("INTEROP_BENCH_SCALE", "").strip() or "1"


def format_bytes(n: float) -> str:
    """``n`` bytes in MiB (GiB from 1 GiB), e.g. ``"128 MiB"``, ``"1.00 GiB"``."""
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if 0 < n < 10 * MiB else f"{n / MiB:.0f} MiB"


def status_bytes(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``"VmRSS"``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            line = next((line for line in f if line.startswith(key + ":")), None)
    except OSError:
        return None
    return int(line.split()[1]) * 1024 if line else None


class PeakRss:
    """Peak growth of this process's RSS over a ``with`` block, ``extra_bytes``, by ``method``:
    the kernel's peak ``"VmHWM"`` (reset through ``/proc/self/clear_refs``), where that is
    refused ``"sampled VmRSS"`` every millisecond, off Linux ``"unavailable"`` (None)."""

    extra_bytes: int | None = None
    method = "unavailable"

    def __enter__(self) -> PeakRss:
        self._stop, self._thread = threading.Event(), None
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM = the current RSS
            self.method = "VmHWM"
        except OSError:
            self.method = "sampled VmRSS"
            self._thread = threading.Thread(target=self._sample, daemon=True)
        self._base = self._peak = status_bytes("VmRSS") or 0
        if not self._base:
            self.method, self._thread = "unavailable", None
        elif self._thread is not None:
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, status_bytes("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._base:
            peak = status_bytes("VmHWM") if self._thread is None else status_bytes("VmRSS")
            self.extra_bytes = max(0, max(self._peak, peak or 0) - self._base)


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
    """Every repeat's seconds and the first call's memory of one :class:`Case`."""

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
    """Time ``cases`` interleaved (drift hits all alike), ``repeats`` rounds. Each case's first
    call is untimed, after ``release`` (emptying the caches, so what it allocates counts): its
    extra host RSS measured, its result checked; with ``release`` one more untimed round warms
    up again. ``sync`` waits for the device inside the timed region."""
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
    """A check: the result equals ``reference`` (same library), else :class:`WrongResultError`."""

    def check(result: Any) -> None:
        if result.shape != reference.shape or not bool((result == reference).all()):
            raise WrongResultError(f"{what} returned data that differs from the source")

    return check
