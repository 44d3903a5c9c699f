"""The measurement machinery: timers, peak memory, and checked first calls.

Within a row the measured calls are interleaved (ours, anchor, ours, anchor,
...) so that drift on a noisy machine hits all of them alike, and each figure
is the median of several repeats. The first call of each is not timed: it
warms up, its result is checked against a reference, and it is the call whose
extra memory is measured (after the caches were emptied, so a staging ring
the call allocates is counted).
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import gc
import pstats
import statistics
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

from .sizes import GB

__all__ = [
    "Case",
    "DeviceGrowth",
    "Measured",
    "PeakRss",
    "WrongResultError",
    "collect_garbage",
    "expect_equal",
    "measure",
    "measure_per_call",
    "profile_per_call",
    "status_bytes",
]


class WrongResultError(AssertionError):
    """A benchmarked call returned wrong data; its row is an error, not a figure."""


def status_bytes(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``"VmRSS"``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakRss:
    """Peak growth of this process's resident memory over a ``with`` block.

    On Linux the kernel's peak (``VmHWM``) is reset at entry through
    ``/proc/self/clear_refs``; where that is refused, a thread samples
    ``VmRSS`` every millisecond instead (it can miss a short peak). Off Linux
    :attr:`extra_bytes` stays None.

    Attributes
    ----------
    extra_bytes : int or None
        Peak resident bytes minus resident bytes at entry (at least 0).
    method : str
        ``"VmHWM"``, ``"sampled VmRSS"`` or ``"unavailable"``.
    """

    def __init__(self) -> None:
        self.extra_bytes: int | None = None
        self.method = "unavailable"
        self._base: int | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.method = "VmHWM"
        except OSError:
            self.method = "sampled VmRSS"
        self._base = status_bytes("VmRSS")
        if self._base is None:
            self.method = "unavailable"
        elif self.method == "sampled VmRSS":
            self._peak = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, status_bytes("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, status_bytes("VmRSS") or 0)
        else:
            peak = status_bytes("VmHWM") or 0
        self.extra_bytes = max(0, peak - self._base)


class DeviceGrowth:
    """Peak device memory taken from CuPy's pool and PyTorch's allocator in a block.

    CuPy's pool only grows while nothing frees its blocks, so its growth is
    the peak held; PyTorch reports its peak directly. Memory taken past both
    (a raw ``cudaMalloc``) is not seen.

    Parameters
    ----------
    cp, th : module
        ``cupy`` and ``torch``, both seeing a CUDA device.
    """

    def __init__(self, cp: Any, th: Any) -> None:
        self._cp, self._th = cp, th
        self.extra_bytes: int | None = None

    def __enter__(self) -> DeviceGrowth:
        self._pool_before = self._cp.get_default_memory_pool().total_bytes()
        self._th.cuda.reset_peak_memory_stats()
        self._torch_before = self._th.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        pool = self._cp.get_default_memory_pool().total_bytes() - self._pool_before
        torch_peak = self._th.cuda.max_memory_allocated() - self._torch_before
        self.extra_bytes = max(0, pool) + max(0, torch_peak)


@dataclasses.dataclass
class Case:
    """One measured call of a row.

    Attributes
    ----------
    fn : callable
        The call; its return value goes to ``check``.
    nbytes : int
        Bytes moved per call (0 for per-call latency cases).
    check : callable, optional
        Called once with the first call's result; raises
        :class:`WrongResultError` if it is wrong.
    prepare : callable, optional
        Called once, untimed, before the first call (e.g. to poison ``out``
        so that the check sees what this call wrote).
    settle : callable, optional
        Called untimed after every call: waits for work the call left running
        in the background, so that it does not overlap (and slow) the next
        case's timed call.
    """

    fn: Callable[[], Any]
    nbytes: int = 0
    check: Callable[[Any], None] | None = None
    prepare: Callable[[], None] | None = None
    settle: Callable[[], None] | None = None


@dataclasses.dataclass
class Measured:
    """Timings and memory of one :class:`Case`.

    Attributes
    ----------
    seconds : list of float
        Every timed repeat, in seconds.
    nbytes : int
        Bytes moved per call.
    calls : int
        Calls per timed repeat.
    extra_host_bytes, extra_device_bytes : int or None
        Peak extra memory of the first call, where measured.
    checked : bool
        The first call's result was checked against a reference.
    """

    seconds: list[float]
    nbytes: int = 0
    calls: int = 1
    extra_host_bytes: int | None = None
    extra_device_bytes: int | None = None
    checked: bool = False

    @property
    def median_s(self) -> float:
        """Median seconds of one timed repeat."""
        return statistics.median(self.seconds)

    @property
    def gbps(self) -> float:
        """Bytes per second of the median repeat, in GB/s (1e9)."""
        return self.nbytes / self.median_s / GB

    @property
    def us(self) -> float:
        """Microseconds per call of the median repeat."""
        return self.median_s / self.calls * 1e6

    def record(self) -> dict[str, Any]:
        """The JSON form: every repeat, and the memory where it was measured."""
        out: dict[str, Any] = {"seconds": self.seconds, "calls": self.calls}
        if self.nbytes:
            out["bytes"] = self.nbytes
        if self.extra_host_bytes is not None:
            out["extra_host_rss_bytes"] = self.extra_host_bytes
        if self.extra_device_bytes is not None:
            out["extra_device_bytes"] = self.extra_device_bytes
        if self.checked:
            out["result_checked"] = True
        return out


def measure(
    cases: dict[str, Case],
    repeats: int,
    *,
    sync: Callable[[], None] | None = None,
    release: Callable[[], None] | None = None,
    device_growth: Callable[[], DeviceGrowth] | None = None,
) -> dict[str, Measured]:
    """Time byte-moving calls, interleaved, after a measured first call and a warm-up.

    Each case's first call runs after ``release`` (so what it allocates,
    staging rings and pools included, is counted): its peak extra host RSS
    and device memory are measured and its result is checked. With
    ``release``, every case then runs once more untimed, so that the caches
    emptied for later cases' first calls are full again (without it the
    first calls were the warm-up). Then ``repeats`` timed rounds run, case
    after case in each round.

    Parameters
    ----------
    cases : dict of str to Case
        The calls of one row, by label.
    repeats : int
        Timed calls per case; case after case within each repeat.
    sync : callable, optional
        Waits for the device after each call (inside the timed region).
    release : callable, optional
        Empties allocator and staging caches before each first call (not
        before the timed calls).
    device_growth : callable, optional
        Makes the context manager that measures device memory.

    Returns
    -------
    dict of str to Measured
        By label, in the order of ``cases``.

    Raises
    ------
    WrongResultError
        A first call's result failed its check.
    """
    results: dict[str, Measured] = {}
    for label, case in cases.items():
        if case.prepare is not None:
            case.prepare()
        if release is not None:
            release()
        growth = device_growth() if device_growth is not None else None
        with PeakRss() as rss, growth if growth is not None else contextlib.nullcontext():
            value = case.fn()
            if sync is not None:
                sync()
        if case.settle is not None:
            case.settle()
        if case.check is not None:
            case.check(value)
        del value
        results[label] = Measured(
            [],
            case.nbytes,
            extra_host_bytes=rss.extra_bytes,
            extra_device_bytes=growth.extra_bytes if growth is not None else None,
            checked=case.check is not None,
        )
    if release is not None:  # warm again: later first calls emptied the caches
        for case in cases.values():
            case.fn()
            if sync is not None:
                sync()
            if case.settle is not None:
                case.settle()
    for _ in range(repeats):
        for label, case in cases.items():
            start = time.perf_counter()
            case.fn()
            if sync is not None:
                sync()
            results[label].seconds.append(time.perf_counter() - start)
            if case.settle is not None:
                case.settle()
    return results


def measure_per_call(
    cases: dict[str, Callable[[], Any]], calls: int, repeats: int
) -> dict[str, Measured]:
    """Per-call latency, timeit-style: ``calls`` calls per repeat, interleaved.

    Each case first runs a tenth of ``calls`` untimed (warm-up); garbage
    collection is off while timing, as in :mod:`timeit`.

    Returns
    -------
    dict of str to Measured
        By label; :attr:`Measured.us` is the median time of one call.
    """
    timers = {label: timeit.Timer(fn) for label, fn in cases.items()}
    for timer in timers.values():
        timer.timeit(number=max(1, calls // 10))
    results = {label: Measured([], calls=calls) for label in cases}
    for _ in range(repeats):
        for label, timer in timers.items():
            results[label].seconds.append(timer.timeit(number=calls))
    return results


def profile_per_call(fn: Callable[[], Any], calls: int, top: int = 10) -> list[dict[str, Any]]:
    """Where one call's time goes: ``calls`` calls under :mod:`cProfile`.

    A tenth of ``calls`` runs first, unprofiled (warm-up); garbage
    collection is off while profiling, as in :mod:`timeit`. The profiler's
    own overhead inflates every figure (a short Python function the most),
    so the figures rank the costs of a call; they are not its time.

    Returns
    -------
    list of dict
        The ``top`` functions by their own time (``tottime``), largest first:
        ``function`` (``file:line(name)``, the file's last two parts),
        ``own_us`` and ``cumulative_us`` per call of ``fn``, and ``calls``,
        how many times ``fn`` called it, per call.
    """
    for _ in range(max(1, calls // 10)):  # warm-up: imports and caches are not the call's
        fn()

    def run() -> None:  # each result is dropped inside the profile (its free is the call's)
        for _ in range(calls):
            fn()

    profiler = cProfile.Profile()
    collecting = gc.isenabled()
    gc.disable()  # as timeit: a collection would be charged to whatever function it interrupts
    try:
        profiler.runcall(run)
    finally:
        if collecting:
            gc.enable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.items():
        if path == __file__ or "_lsprof.Profiler" in name:
            continue  # the loop that made the calls, and the profiler stopping
        where = "/".join(path.replace("\\", "/").split("/")[-2:]) if path != "~" else ""
        rows.append(
            {
                "function": f"{where}:{line}({name})" if where else name,
                "own_us": tottime / calls * 1e6,
                "cumulative_us": cumtime / calls * 1e6,
                "calls": ncalls / calls,
            }
        )
    rows.sort(key=lambda r: r["own_us"], reverse=True)
    return rows[:top]


def expect_equal(reference: Any, what: str) -> Callable[[Any], None]:
    """A :class:`Case` check: the result equals ``reference``, else :class:`WrongResultError`."""

    def check(result: Any) -> None:
        if not np.array_equal(np.asarray(result), reference):
            raise WrongResultError(f"{what} returned data that differs from the source")

    return check


def collect_garbage() -> None:
    """The ``release`` of host-only rows: collect garbage so that freed arrays are gone."""
    gc.collect()
