"""How fast is interop.dask.save_npy? ``python -m benchmarks.dask_save [--quick] [--json PATH]``"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import lab
from benchmarks.targets import DASK as OURS
from interop.bench.measure import (
    GiB,
    Measured,
    MiB,
    PeakRss,
    Ratio,
    WrongResultError,
    format_bytes,
    status_bytes,
)
from interop.bench.rows import BenchContext, RowSpec, ring_bytes
from interop.config import config
from interop.info import install_command

#: Worker processes of the cluster (one thread each), and threads of the CuPy row.
WORKERS = 2
BLOCKS = 16
ROW = 1024  # float32 elements per row of the saved arrays: 4 KiB
STACK = "da.to_npy_stack"
MEMMAP = "da.store(open_memmap)"


def dask_unavailable() -> str | None:
    """Why ``interop.dask.save_npy`` cannot run here (dask missing), or None."""
    try:
        importlib.import_module("interop.dask")
    except ImportError as exc:  # BackendUnavailableError names the extra
        return str(exc)
    except Exception as exc:  # a broken dask install: the row cannot run, the run goes on
        return f"interop.dask cannot be imported ({type(exc).__name__}: {exc})"
    return None


def cluster_unavailable() -> str | None:
    """Why the cluster row cannot run here (dask or distributed missing), or None."""
    reason = dask_unavailable()
    if reason is None:
        try:
            importlib.import_module("distributed")
        except Exception as exc:  # ImportError, or a broken install
            how = install_command("dask")
            return f"distributed cannot be imported ({exc}); install it with: {how}"
    return reason


def tmpfs_directory(nbytes: int) -> Path | None:
    """``/dev/shm`` where it is a tmpfs with room for twice ``nbytes``, else None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        room = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    tmpfs = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts)
    return Path("/dev/shm") if tmpfs and room >= 2 * nbytes else None


def reset_peak_rss() -> int | None:
    """Reset this process's ``VmHWM`` to its RSS and return that; None where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status_bytes("VmRSS")


@contextlib.contextmanager
def _worker_rss(client: Any) -> Iterator[dict[str, int | None]]:
    """The largest peak RSS growth of any worker over the block (None if one is unknown)."""
    probe: dict[str, int | None] = {"host": None, "device": None}
    base = client.run(reset_peak_rss)
    yield probe
    peaks = client.run(status_bytes, "VmHWM")
    grown = [(b, peaks.get(worker)) for worker, b in base.items()]
    if grown and all(b is not None and peak is not None for b, peak in grown):
        probe["host"] = max(0, *(peak - b for b, peak in grown))


@contextlib.contextmanager
def _process_memory(growth: Callable[[], Any] | None) -> Iterator[dict[str, int | None]]:
    """This process's peak RSS growth over the block and, with ``growth``, device memory."""
    probe: dict[str, int | None] = {"host": None, "device": None}
    with PeakRss() as rss, growth() if growth else contextlib.nullcontext() as device:
        yield probe
    probe.update(host=rss.extra_bytes, device=device.extra_bytes if device else None)


class MemmapOnWorker:
    """A ``da.store`` target mapping the ``.npy`` file on each worker (a memmap would pickle)."""

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
    same = bool(np.array_equal(np.load(path, mmap_mode="r")[region], block))
    return np.full((1,) * block.ndim, same)


def _block_in_stack(block: np.ndarray, directory: str, block_info: Any = None) -> np.ndarray:
    """Whether ``block`` is the file ``da.to_npy_stack`` wrote for it."""
    path = Path(directory) / f"{block_info[0]['chunk-location'][0]}.npy"
    return np.full((1,) * block.ndim, bool(np.array_equal(np.load(path, mmap_mode="r"), block)))


#: One way of saving: (label, output name, ``write(path)``, ``check(path)`` raising if wrong).
Save = tuple[str, str, Callable[[Path], object], Callable[[Path], None]]


def alternate(
    calls: Mapping[str, Callable[[], Any]],
    nbytes: int,
    repeats: int,
    check: Callable[[str, Any], None],
    tidy: Callable[[Any], object] = lambda result: None,
    memory: Callable[[], Any] = lambda: _process_memory(None),
    release: Callable[[], None] | None = None,
) -> dict[str, Measured]:
    """``calls`` alternated: each once untimed (after ``release``) and ``check``-ed, then
    ``repeats`` timed rounds; ``tidy(result)`` after each; memory: the largest in ``memory()``."""
    got = {label: Measured([], nbytes, checked=True) for label in calls}
    probes: dict[str, list[dict[str, int | None]]] = {label: [] for label in calls}
    for round_ in range(repeats + 1):
        for label, call in calls.items():
            if round_ == 0 and release is not None:
                release()
            with memory() as probe:
                start = time.perf_counter()
                result = call()
                seconds = time.perf_counter() - start
            check(label, result) if round_ == 0 else got[label].seconds.append(seconds)
            probes[label].append(probe)
            tidy(result)
            del result  # before the next call: two results need not fit at once
    for label, measured in got.items():
        host, device = ([p[k] for p in probes[label]] for k in ("host", "device"))
        measured.extra_host_bytes = None if None in host else max(host)  # type: ignore[type-var]
        measured.extra_device_bytes = None if None in device else max(device)  # type: ignore[type-var]
    return got


def _saved(saves: Sequence[Save], directory: Path, nbytes: int, repeats: int, **kw: Any) -> Any:
    """:func:`alternate` of ``saves`` into ``directory``, every output removed after its call."""
    paths = {label: directory / output for label, output, _, _ in saves}
    calls = {label: lambda w=write, p=paths[label]: (w(p), p)[1] for label, _, write, _ in saves}
    checks = {label: check for label, _, _, check in saves}

    def tidy(path: Path) -> None:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    return alternate(calls, nbytes, repeats, lambda label, p: checks[label](p), tidy, **kw)


def _judged_and_disk(
    ctx: BenchContext, saves: Sequence[Save], nbytes: int, memory: Callable[[], Any], **kw: Any
) -> tuple[dict[str, Measured], dict[str, Any]]:
    """``saves`` alternated on a tmpfs, then interop's alone in ``ctx.workdir``; and where."""
    tmpfs = tmpfs_directory(nbytes)
    where: dict[str, Any] = {"directory": str(tmpfs or ctx.workdir)}
    where["disk_directory"] = str(ctx.workdir)
    with tempfile.TemporaryDirectory(dir=tmpfs or ctx.workdir) as tmp:
        got = _saved(saves, Path(tmp), nbytes, ctx.sizes.repeats, memory=memory, **kw)
    if tmpfs is None:
        return got, where | {"tmpfs": "not used: /dev/shm is not a tmpfs with room for the array"}
    disk: Save = (f"{OURS} on disk", *saves[0][1:])
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        got |= _saved([disk], Path(tmp), nbytes, ctx.sizes.repeats, memory=memory, **kw)
    return got, where


def _fields(
    got: dict[str, Measured], anchors: list[str], size: str, who: str, bound: int, words: str
) -> dict[str, Any]:
    """The row's figure, anchors, ratios (throughput, and RSS to ``bound``), memory, samples."""
    ours = got[OURS].gbps
    others = [label for label in got if label != OURS]
    ratios = [Ratio.between(OURS, "throughput", a, ours, got[a].gbps) for a in anchors]
    disk = f"{OURS} on disk"
    if disk in got:
        ratios.append(Ratio.between(disk, "throughput", OURS, got[disk].gbps, ours))
    bounded = f"the bound {words}"
    for k in [label for label in got if label in (OURS, *anchors)]:
        rss = got[k].extra_host_bytes
        ratios.append(Ratio.between(f"peak extra RSS {who} of {k}", "memory", bounded, rss, bound))
    memory = {"extra_host_rss_bytes": got[OURS].extra_host_bytes}
    memory |= {f"{label} extra_host_rss_bytes": got[label].extra_host_bytes for label in others}
    memory |= {"ring_bytes": ring_bytes(), "bound_bytes": bound}
    fields = {"size": size, "gbps": ours, "anchors": {f"{k} GB/s": got[k].gbps for k in others}}
    samples = {label: m.record() for label, m in got.items()}
    return fields | {"ratios": ratios, "memory": memory, "samples": samples}


def _size(nbytes: int, block_bytes: int) -> str:
    total = format_bytes(nbytes) if nbytes >= GiB else f"{nbytes / MiB:.1f} MiB"
    return f"{total} float32 in {BLOCKS} blocks of {block_bytes / MiB:.2f} MiB"


def local_cluster(env: dict[str, str]) -> Any:
    """:data:`WORKERS` one-thread worker processes; the dashboard on a free port, not 8787."""
    from distributed import LocalCluster

    scheduler = {"dashboard_address": "127.0.0.1:0"}
    kw = {"n_workers": WORKERS, "threads_per_worker": 1, "processes": True, "env": env}
    return LocalCluster(dashboard_address=None, scheduler_kwargs=scheduler, **kw)


def dask_save_npy(ctx: BenchContext) -> dict[str, Any]:
    """The cluster row; interop's settings reach the workers in their environment."""
    import dask.array as da
    from distributed import Client, wait

    save_npy = importlib.import_module("interop.dask").save_npy
    rows = max(BLOCKS, ctx.sizes.rss_bytes // 2 // (4 * ROW))
    block_rows = -(-rows // BLOCKS)
    nbytes, block_bytes = rows * ROW * 4, block_rows * ROW * 4
    env = {f"INTEROP_{k.upper()}": str(v) for k, v in config.as_dict().items()}
    with (
        local_cluster(env) as cluster,
        Client(cluster, set_as_default=False) as client,
        client.as_current(),
    ):
        rng = da.random.default_rng(0)
        x = client.persist(rng.random((rows, ROW), dtype=np.float32, chunks=(block_rows, ROW)))
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
            da.store(x, MemmapOnWorker(str(path)), lock=False)  # type: ignore[arg-type]

        saves = [
            (OURS, "interop.npy", lambda p: save_npy(x, p), check(OURS, _block_in_file)),
            (STACK, "stack", lambda p: da.to_npy_stack(p, x), check(STACK, _block_in_stack)),
            (MEMMAP, "memmap.npy", memmap, check(MEMMAP, _block_in_file)),
        ]
        got, where = _judged_and_disk(ctx, saves, nbytes, lambda: _worker_rss(client))
        workers = len(client.scheduler_info()["workers"])
    bound = block_bytes + 2 * ring_bytes()
    fields = _fields(
        got, [MEMMAP, STACK], _size(nbytes, block_bytes), "per worker", bound,
        "one block + 2 x num_buffers x chunk_bytes",
    )  # fmt: skip
    fields["memory"] |= {"block_bytes": block_bytes, "rss_method": "VmHWM of each worker process"}
    cluster_facts = {"workers": workers, "threads_per_worker": 1, "processes": True}
    return fields | where | {"cluster": cluster_facts}


def dask_save_npy_cupy(ctx: BenchContext) -> dict[str, Any]:
    """CuPy blocks of the run's GPU array saved on 2 threads, against ``recipe``, checked."""
    import dask
    import dask.array as da

    save_npy = importlib.import_module("interop.dask").save_npy
    g = ctx.gpu()
    rows = g.x.size // ROW
    x, reference = (a[: rows * ROW].reshape(rows, ROW) for a in (g.x, g.ref))
    recipe, block_rows = "cupy.asnumpy+numpy.save per block", -(-rows // BLOCKS)
    darr = da.from_array(
        x, chunks=(block_rows, ROW), asarray=False, name=f"bench-{uuid.uuid4().hex}"
    )
    host_blocks = darr.map_blocks(g.cp.asnumpy, dtype=darr.dtype, meta=np.empty((0, 0), darr.dtype))

    def file_matches(path: Path) -> None:
        if not np.array_equal(np.load(path, mmap_mode="r"), reference):
            raise WrongResultError(f"{OURS} wrote a file that differs from the array")

    def stack_matches(path: Path) -> None:
        for i in range(darr.numblocks[0]):
            part = reference[i * block_rows : (i + 1) * block_rows]
            if not np.array_equal(np.load(path / f"{i}.npy", mmap_mode="r"), part):
                raise WrongResultError(f"{recipe} wrote block {i} differing from the array")

    saves = [
        (OURS, "interop.npy", lambda p: save_npy(darr, p), file_matches),
        (recipe, "stack", lambda p: da.to_npy_stack(p, host_blocks), stack_matches),
    ]
    growth = functools.partial(lab.DeviceGrowth, g.cp, g.th)
    memory = functools.partial(_process_memory, growth)
    with dask.config.set(scheduler="threads", num_workers=WORKERS):
        got, where = _judged_and_disk(ctx, saves, int(x.nbytes), memory, release=g.release)
    block_bytes = block_rows * ROW * x.itemsize
    words = f"{WORKERS} threads x 2 x num_buffers x chunk_bytes"
    size, bound = _size(int(x.nbytes), block_bytes), WORKERS * 2 * ring_bytes()
    fields = _fields(got, [recipe], size, "of the process", bound, words)
    fields["memory"] |= {
        "block_bytes": block_bytes,
        "extra_device_bytes": got[OURS].extra_device_bytes,
    }
    return fields | where | {"scheduler": {"name": "threads", "num_workers": WORKERS}}


ROWS = (
    RowSpec(
        "dask_save_npy",
        "interop.dask.save_npy of NumPy blocks persisted on a distributed.LocalCluster of "
        "2 worker processes (1 thread each)",
        False,
        dask_save_npy,
        unavailable=cluster_unavailable,
    ),
    RowSpec(
        "dask_save_npy_cupy",
        "interop.dask.save_npy of CuPy blocks on the threaded scheduler (2 threads)",
        True,
        dask_save_npy_cupy,
        unavailable=dask_unavailable,
    ),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
