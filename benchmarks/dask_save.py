"""The dask rows: ``interop.dask.save_npy`` against Dask's own ways of writing an array.

``dask_save_npy`` runs on a short-lived ``distributed.LocalCluster`` of worker
processes that the row starts and always closes: NumPy blocks made and
persisted on the workers, then, alternated, ``interop.dask.save_npy``,
``da.to_npy_stack`` and ``da.store`` into a ``.npy`` file made with
``numpy.lib.format.open_memmap``, each output removed before the next call.
Each call's peak RSS growth is read on every worker (``VmHWM`` reset with
``client.run`` before the call, read after).

``dask_save_npy_cupy`` (GPU) saves CuPy blocks on dask's threaded scheduler
against the usual recipe: ``numpy.save`` of each block's ``cupy.asnumpy``
copy.

Both need the ``dask`` extra; without it they are "not available", with the
reason. dask and distributed are imported only when a row runs. Lab rows:
they run under ``python -m benchmarks run``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.diagnostics import DeviceGrowth
from interop.bench.measure import (
    GiB,
    Measured,
    MiB,
    PeakRss,
    WrongResultError,
    status_bytes,
)
from interop.bench.results import Ratio
from interop.bench.rows import BenchContext, ring_bytes
from interop.config import config
from interop.info import install_command

__all__ = [
    "WORKERS",
    "MemmapOnWorker",
    "cluster_unavailable",
    "dask_save_npy",
    "dask_save_npy_cupy",
    "dask_unavailable",
    "local_cluster",
    "peak_rss",
    "reset_peak_rss",
    "threaded_saves",
]

#: Worker processes of the row's cluster (one thread each), and threads of the
#: threaded scheduler in the CuPy row.
WORKERS = 2
#: Blocks of every saved array: ``BLOCKS`` row blocks of whole rows.
BLOCKS = 16
#: Elements per row of the saved float32 arrays (4 KiB rows).
ROW = 1024

OURS = "interop.dask.save_npy"
STACK = "da.to_npy_stack"
MEMMAP = "da.store(open_memmap)"


# ------------------------------------------------------------------ availability


def dask_unavailable() -> str | None:
    """Why ``interop.dask.save_npy`` cannot run here (dask missing), or None when it can."""
    try:
        importlib.import_module("interop.dask")
    except ImportError as exc:  # BackendUnavailableError names the extra
        return str(exc)
    except Exception as exc:  # a broken dask install: the row cannot run, the bench goes on
        return f"interop.dask cannot be imported ({type(exc).__name__}: {exc})"
    return None


def cluster_unavailable() -> str | None:
    """Why the cluster row cannot run here (dask or distributed missing), or None."""
    reason = dask_unavailable()
    if reason is not None:
        return reason
    try:
        importlib.import_module("distributed")
    except Exception as exc:  # ImportError, or a broken install
        return f"distributed cannot be imported ({exc}); install it with: {install_command('dask')}"
    return None


# ------------------------------------------------------------------ run on the workers


def reset_peak_rss() -> int | None:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; return that.

    Run on each worker with ``client.run``. None where the kernel refuses the
    reset or has no ``/proc`` (the peak is then not measured).
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status_bytes("VmRSS")


def peak_rss() -> int | None:
    """This process's peak RSS (``VmHWM``) in bytes; None without ``/proc``."""
    return status_bytes("VmHWM")


class _WorkerPeakRss:
    """Peak RSS growth of every worker over a ``with`` block.

    Attributes
    ----------
    per_worker : dict of str to int or None
        Growth by worker address (None where it could not be measured, or the
        worker was replaced meanwhile).
    extra_bytes : int or None
        The largest growth of any worker; None if any is unmeasured.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._base: dict[str, int | None] = {}
        self.per_worker: dict[str, int | None] = {}
        self.extra_bytes: int | None = None

    def __enter__(self) -> _WorkerPeakRss:
        self._base = self._client.run(reset_peak_rss)
        return self

    def __exit__(self, *exc: object) -> None:
        peaks = self._client.run(peak_rss)
        for worker, base in self._base.items():
            peak = peaks.get(worker)
            self.per_worker[worker] = None if base is None or peak is None else peak - base
        grown = list(self.per_worker.values())
        if grown and all(g is not None for g in grown):
            self.extra_bytes = max(0, *(g for g in grown if g is not None))


class _ProcessMemory:
    """Peak RSS growth of this process and, optionally, device memory taken, over a block."""

    def __init__(self, growth: Callable[[], DeviceGrowth] | None) -> None:
        self._growth = growth
        self._stack = contextlib.ExitStack()
        self._rss = PeakRss()
        self._device: DeviceGrowth | None = None
        self.extra_bytes: int | None = None
        self.extra_device_bytes: int | None = None

    def __enter__(self) -> _ProcessMemory:
        self._stack.enter_context(self._rss)
        if self._growth is not None:
            self._device = self._stack.enter_context(self._growth())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.extra_bytes = self._rss.extra_bytes
        if self._device is not None:
            self.extra_device_bytes = self._device.extra_bytes


class MemmapOnWorker:
    """A ``da.store`` target: a ``.npy`` file mapped on the worker storing each block.

    A ``numpy.memmap`` made on the caller cannot be a target on a cluster of
    processes: it is pickled to the workers as a copy of its data, and the
    file is never written. So each block's store maps the file (made by
    ``numpy.lib.format.open_memmap`` on the caller) with
    ``open_memmap(path, mode="r+")``, assigns the block and unmaps it.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def __setitem__(self, index: Any, value: Any) -> None:
        mapped = np.lib.format.open_memmap(self.path, mode="r+")
        try:
            mapped[index] = value
        finally:
            del mapped  # unmapped: the pages stay in the file's page cache


def _block_in_file(block: np.ndarray, path: str, block_info: Any = None) -> np.ndarray:
    """Whether ``block`` is at its place in the ``.npy`` file ``path`` (read on the worker)."""
    region = tuple(slice(lo, hi) for lo, hi in block_info[0]["array-location"])
    on_disk = np.load(path, mmap_mode="r")
    same = bool(np.array_equal(on_disk[region], block))
    del on_disk
    return np.full((1,) * block.ndim, same)


def _block_in_stack(block: np.ndarray, directory: str, block_info: Any = None) -> np.ndarray:
    """Whether ``block`` is the file ``da.to_npy_stack`` wrote for it."""
    index = block_info[0]["chunk-location"][0]
    on_disk = np.load(Path(directory) / f"{index}.npy", mmap_mode="r")
    same = bool(np.array_equal(on_disk, block))
    del on_disk
    return np.full((1,) * block.ndim, same)


# ------------------------------------------------------------------ the alternated saves


@dataclasses.dataclass
class _Save:
    """One way of saving the row's array.

    Attributes
    ----------
    label : str
    output : str
        The name of its output (a file or a directory) in the row's directory.
    write : callable
        Saves the array under the given path.
    check : callable
        Raises :class:`WrongResultError` if the output differs from the array.
    """

    label: str
    output: str
    write: Callable[[Path], object]
    check: Callable[[Path], None]


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _alternate(
    saves: list[_Save],
    directory: Path,
    nbytes: int,
    repeats: int,
    memory: Callable[[], Any],
    *,
    release: Callable[[], None] | None = None,
) -> dict[str, Measured]:
    """Time ``saves``, alternated, each output removed after its call.

    Each save runs once untimed (after ``release``), its output checked; then
    ``repeats`` timed rounds, save after save. Every call, timed or not, runs
    inside ``memory()`` (a context manager with ``extra_bytes`` and maybe
    ``extra_device_bytes`` after it); a save's memory is its largest over
    its calls, None if any call could not be measured.
    """
    got = {s.label: Measured([], nbytes, checked=True) for s in saves}
    host: dict[str, list[int | None]] = {s.label: [] for s in saves}
    device: dict[str, list[int | None]] = {s.label: [] for s in saves}
    for round_ in range(repeats + 1):
        for save in saves:
            path = directory / save.output
            if round_ == 0 and release is not None:
                release()
            with memory() as probe:
                start = time.perf_counter()
                save.write(path)
                seconds = time.perf_counter() - start
            if round_ == 0:
                save.check(path)
            else:
                got[save.label].seconds.append(seconds)
            host[save.label].append(probe.extra_bytes)
            device[save.label].append(getattr(probe, "extra_device_bytes", None))
            _remove(path)
    for label, measured in got.items():
        measured.extra_host_bytes = _largest(host[label])
        measured.extra_device_bytes = _largest(device[label])
    return got


def _largest(values: list[int | None]) -> int | None:
    if not values or any(v is None for v in values):
        return None
    return max(v for v in values if v is not None)


def _shape(nbytes: int) -> tuple[tuple[int, int], int]:
    """The float32 array of about ``nbytes``: (rows, ROW) in whole 4 KiB rows; rows per block."""
    rows = max(BLOCKS, nbytes // (4 * ROW))
    return (rows, ROW), -(-rows // BLOCKS)


def _size(nbytes: int, block_bytes: int) -> str:
    total = f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.1f} MiB"
    return f"{total} float32 in {BLOCKS} blocks of {block_bytes / MiB:.2f} MiB"


def _memory_ratios(got: dict[str, Measured], who: str, bound: int, bound_words: str) -> list[Ratio]:
    """Each save's extra RSS over ``bound`` (interop's is the one judged)."""
    ratios = []
    for label, measured in got.items():
        ratios.append(
            Ratio.between(
                f"peak extra RSS {who} of {label}",
                "memory",
                bound_words,
                measured.extra_host_bytes,
                bound,
            )
        )
    return ratios


# ------------------------------------------------------------------ dask_save_npy


def local_cluster(env: dict[str, str]) -> Any:
    """The row's ``distributed.LocalCluster``: :data:`WORKERS` one-thread processes, no dashboard.

    The scheduler's HTTP server, which starts without a dashboard too, listens
    on a free local port instead of 8787, which another cluster on the same
    machine may hold (distributed then warns, an error where warnings are).
    """
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=WORKERS,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        env=env,
    )


def dask_save_npy(ctx: BenchContext) -> dict[str, Any]:
    """``interop.dask.save_npy`` against ``da.to_npy_stack`` and ``da.store`` into a memmap.

    On a ``distributed.LocalCluster`` of :data:`WORKERS` worker processes (one
    thread each, interop's settings passed in their environment), started
    here and closed on every path. The array (``ctx.sizes.dask_bytes``
    float32, :data:`BLOCKS` blocks of whole rows) is made and persisted on
    the workers before anything is timed.
    """
    import dask.array as da
    from distributed import Client, wait

    save_npy = importlib.import_module("interop.dask").save_npy
    shape, block_rows = _shape(ctx.sizes.dask_bytes)
    nbytes = shape[0] * shape[1] * 4
    block_bytes = block_rows * shape[1] * 4
    ring = ring_bytes()
    bound = block_bytes + 2 * ring
    env = {f"INTEROP_{k.upper()}": str(v) for k, v in config.as_dict().items()}
    with (
        tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp,
        local_cluster(env) as cluster,
        Client(cluster, set_as_default=False) as client,
        client.as_current(),
    ):
        rng = da.random.default_rng(0)
        x = client.persist(rng.random(shape, dtype=np.float32, chunks=(block_rows, shape[1])))
        wait(x)
        flags = {
            "chunks": tuple((1,) * n for n in x.numblocks),
            "dtype": bool,
            "meta": np.empty((0, 0), bool),
        }

        def check(label: str, matches: Callable[..., np.ndarray]) -> Callable[[Path], None]:
            def checked(path: Path) -> None:
                if not bool(x.map_blocks(matches, str(path), **flags).all().compute()):
                    raise WrongResultError(f"{label} wrote data that differs from the array")

            return checked

        def memmap(path: Path) -> None:
            mapped = np.lib.format.open_memmap(path, mode="w+", dtype=x.dtype, shape=x.shape)
            del mapped  # the header written and the file sized, as save_npy does
            target: Any = MemmapOnWorker(str(path))  # has __setitem__, all store needs
            da.store(x, target, lock=False)  # blocks are disjoint: no lock

        saves = [
            _Save(OURS, "interop.npy", lambda p: save_npy(x, p), check(OURS, _block_in_file)),
            _Save(STACK, "stack", lambda p: da.to_npy_stack(p, x), check(STACK, _block_in_stack)),
            _Save(MEMMAP, "memmap.npy", memmap, check(MEMMAP, _block_in_file)),
        ]
        got = _alternate(
            saves, Path(tmp), nbytes, ctx.sizes.repeats, lambda: _WorkerPeakRss(client)
        )
        workers = len(client.scheduler_info()["workers"])
    ours = got[OURS]
    bound_words = "the bound one block + 2 x num_buffers x chunk_bytes"
    return {
        "size": _size(nbytes, block_bytes),
        "gbps": ours.gbps,
        "anchors": {f"{label} GB/s": got[label].gbps for label in (STACK, MEMMAP)},
        "ratios": [
            Ratio.between(OURS, "throughput", MEMMAP, ours.gbps, got[MEMMAP].gbps),
            Ratio.between(OURS, "throughput", STACK, ours.gbps, got[STACK].gbps),
            *_memory_ratios(got, "per worker", bound, bound_words),
        ],
        "memory": {
            "extra_host_rss_bytes": ours.extra_host_bytes,
            f"{STACK} extra_host_rss_bytes": got[STACK].extra_host_bytes,
            f"{MEMMAP} extra_host_rss_bytes": got[MEMMAP].extra_host_bytes,
            "block_bytes": block_bytes,
            "ring_bytes": ring,
            "bound_bytes": bound,
            "rss_method": "VmHWM of each worker process, the largest growth of any worker",
        },
        "cluster": {"workers": workers, "threads_per_worker": 1, "processes": True},
        "directory": str(ctx.workdir),
        "samples": {label: m.record() for label, m in got.items()},
    }


# ------------------------------------------------------------------ dask_save_npy_cupy


def threaded_saves(
    ctx: BenchContext,
    x: Any,
    reference: np.ndarray,
    to_host: Callable[[Any], np.ndarray],
    recipe: str,
    *,
    release: Callable[[], None] | None = None,
    growth: Callable[[], DeviceGrowth] | None = None,
) -> dict[str, Any]:
    """``interop.dask.save_npy`` of ``x``'s blocks on the threaded scheduler, against
    ``numpy.save`` of each block's ``to_host`` copy (``da.to_npy_stack`` of the
    blocks mapped through ``to_host``).

    Parameters
    ----------
    ctx : BenchContext
    x : array
        A 2-D C-contiguous array (CuPy on a GPU runner), cut into
        :data:`BLOCKS` blocks of whole rows, each block a view of ``x``.
    reference : numpy.ndarray
        ``x``'s values on the host, to check the files against.
    to_host : callable
        The recipe's copy of a block to a NumPy array (``cupy.asnumpy``).
    recipe : str
        The recipe's label.
    release, growth : callable, optional
        Empty caches before each save's first call; measure device memory.

    Returns
    -------
    dict
        The row's fields; the memory bound is :data:`WORKERS` threads x 2 x
        the ring.
    """
    import dask
    import dask.array as da

    save_npy = importlib.import_module("interop.dask").save_npy
    rows = x.shape[0]
    block_rows = -(-rows // BLOCKS)
    nbytes = int(x.nbytes)
    block_bytes = block_rows * x.shape[1] * x.itemsize
    ring = ring_bytes()
    bound = WORKERS * 2 * ring
    darr = da.from_array(
        x, chunks=(block_rows, x.shape[1]), asarray=False, name=f"bench-{uuid.uuid4().hex}"
    )
    host_blocks = darr.map_blocks(to_host, dtype=darr.dtype, meta=np.empty((0, 0), darr.dtype))

    def file_matches(path: Path) -> None:
        if not np.array_equal(np.load(path, mmap_mode="r"), reference):
            raise WrongResultError(f"{OURS} wrote a file that differs from the array")

    def stack_matches(path: Path) -> None:
        for i in range(darr.numblocks[0]):
            part = reference[i * block_rows : (i + 1) * block_rows]
            if not np.array_equal(np.load(path / f"{i}.npy", mmap_mode="r"), part):
                raise WrongResultError(f"{recipe} wrote block {i} differing from the array")

    saves = [
        _Save(OURS, "interop.npy", lambda p: save_npy(darr, p), file_matches),
        _Save(recipe, "stack", lambda p: da.to_npy_stack(p, host_blocks), stack_matches),
    ]
    with (
        dask.config.set(scheduler="threads", num_workers=WORKERS),
        tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp,
    ):
        got = _alternate(
            saves,
            Path(tmp),
            nbytes,
            ctx.sizes.repeats,
            lambda: _ProcessMemory(growth),
            release=release,
        )
    ours = got[OURS]
    bound_words = f"the bound {WORKERS} threads x 2 x num_buffers x chunk_bytes"
    return {
        "size": _size(nbytes, block_bytes),
        "gbps": ours.gbps,
        "anchors": {f"{recipe} GB/s": got[recipe].gbps},
        "ratios": [
            Ratio.between(OURS, "throughput", recipe, ours.gbps, got[recipe].gbps),
            *_memory_ratios(got, "of the process", bound, bound_words),
        ],
        "memory": {
            "extra_host_rss_bytes": ours.extra_host_bytes,
            "extra_device_bytes": ours.extra_device_bytes,
            f"{recipe} extra_host_rss_bytes": got[recipe].extra_host_bytes,
            "block_bytes": block_bytes,
            "ring_bytes": ring,
            "bound_bytes": bound,
        },
        "scheduler": {"name": "threads", "num_workers": WORKERS},
        "directory": str(ctx.workdir),
        "samples": {label: m.record() for label, m in got.items()},
    }


def dask_save_npy_cupy(ctx: BenchContext) -> dict[str, Any]:
    """CuPy blocks on the threaded scheduler: ``interop.dask.save_npy`` against
    ``cupy.asnumpy`` + ``numpy.save`` per block, on the run's shared GPU array."""
    g = ctx.gpu()
    rows = g.x.size // ROW
    x = g.x[: rows * ROW].reshape(rows, ROW)
    reference = g.ref[: rows * ROW].reshape(rows, ROW)
    return threaded_saves(
        ctx,
        x,
        reference,
        g.cp.asnumpy,
        "cupy.asnumpy+numpy.save per block",
        release=g.release,
        growth=lambda: DeviceGrowth(g.cp, g.th),
    )
