"""How fast are interop.safetensors checkpoints? python -m benchmarks.ckpt [--quick] [--json P]"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import lab
from benchmarks.dask_save import alternate, tmpfs_directory
from benchmarks.targets import CKPT_LOAD, CKPT_SAVE, RING
from interop.bench.measure import GiB, Measured, Ratio, WrongResultError, measure
from interop.bench.rows import BenchContext, RowSpec, ring_bytes
from interop.info import install_command

TENSORS = 64
# The CPU rows repeat 3 times as often: both sides copy the same bytes in the kernel, so the
# ratio is near 1 and a noisy host's drift decides 5 repeats (0.78-1.13 on a shared 2-core one)
CPU_REPEATS = 3
ST_SAVE, ST_LOAD = "safetensors.torch.save_file", "safetensors.torch.load_file"


def package_unavailable() -> str | None:
    """Why the rows' anchor, the safetensors package, cannot be imported; None if it can."""
    try:
        importlib.import_module("safetensors.torch")
    except Exception as exc:  # not installed, or a broken install: the row cannot run
        return f"safetensors cannot be imported ({exc}); install it with: {install_command('test')}"
    return None


def _fields(
    got: dict[str, Measured], ours: str, size: str, rss: bool = True, **bound: float
) -> dict[str, Any]:
    """``ours``'s GB/s to each other call's and to ``bound``, and (``rss``) its RSS to the ring."""
    gbps = {label: m.gbps for label, m in got.items()}
    others = {k: v for k, v in gbps.items() if k != ours} | bound
    ratios = [Ratio.between(ours, "throughput", k, gbps[ours], v) for k, v in others.items()]
    extra, ring = got[ours].extra_host_bytes, ring_bytes()
    if rss:  # a host load's result is host memory: no bound
        ratios.append(Ratio.between(f"extra host RSS of {ours}", "memory", RING, extra, ring))
    fields: dict[str, Any] = {"size": size, "gbps": gbps[ours], "ratios": ratios}
    fields["anchors"] = {f"{k} GB/s": v for k, v in others.items()}
    fields["memory"] = {"extra_host_rss_bytes": extra, "ring_bytes": ring}
    return fields | {"samples": {k: m.record() for k, m in got.items()}}


def _tensors(th: Any, nbytes: int, device: str) -> dict[str, Any]:
    """:data:`TENSORS` float32 tensors of ``nbytes`` in all, each its own memory, random."""
    g = th.Generator(device=device).manual_seed(0)
    n = nbytes // 4 // TENSORS
    return {f"layer{i}.weight": th.rand(n, generator=g, device=device) for i in range(TENSORS)}


def _same(loaded: dict[str, Any], tensors: dict[str, Any], what: str) -> None:
    th = importlib.import_module("torch")
    if loaded.keys() != tensors.keys() or not all(
        th.equal(loaded[k].to(v.device), v) for k, v in tensors.items()
    ):
        raise WrongResultError(f"{what} gave tensors that differ from the saved ones")


def _libraries() -> tuple[Any, Any]:
    """``safetensors.torch`` and ``interop.safetensors``."""
    st, ist = "safetensors.torch", "interop.safetensors"
    return importlib.import_module(st), importlib.import_module(ist)


def _size(nbytes: int, where: str) -> str:
    return f"{nbytes / GiB:.2f} GiB in {TENSORS} float32 {where} tensors"


# ------------------------------------------------------------------ CPU rows


def _cpu_files(ctx: BenchContext) -> tuple[Path, dict[str, Any], int]:
    nbytes = ctx.sizes.gpu_bytes // (4 * TENSORS) * 4 * TENSORS
    directory = tmpfs_directory(nbytes) or ctx.workdir
    return directory, _tensors(importlib.import_module("torch"), nbytes, "cpu"), nbytes


def ckpt_save_cpu(ctx: BenchContext) -> dict[str, Any]:
    """interop's ``save_file`` against the package's, CPU tensors onto a tmpfs."""
    st, ist = _libraries()
    directory, tensors, nbytes = _cpu_files(ctx)
    ours = "interop.safetensors.save_file"
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        mine, theirs = Path(tmp) / "ours.safetensors", Path(tmp) / "theirs.safetensors"
        calls = {
            ours: lambda: ist.save_file(tensors, mine),
            ST_SAVE: lambda: st.save_file(tensors, theirs) or theirs,
        }

        def check(label: str, path: Path) -> None:
            _same(st.load_file(path), tensors, label)

        got = alternate(calls, nbytes, CPU_REPEATS * ctx.sizes.repeats, check, tidy=Path.unlink)
    return _fields(got, ours, _size(nbytes, "CPU")) | {"directory": str(directory)}


def _touched(loaded: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """The loaded tensors and a sum of each: every element read."""
    return loaded, [float(t.sum()) for t in loaded.values()]


def ckpt_load_cpu(ctx: BenchContext) -> dict[str, Any]:
    """interop's ``load_file`` against the package's, from a tmpfs, every tensor touched."""
    st, ist = _libraries()
    directory, tensors, nbytes = _cpu_files(ctx)
    ours = "interop.safetensors.load_file + touch"
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = st.save_file(tensors, Path(tmp) / "a.safetensors") or Path(tmp) / "a.safetensors"
        calls = {
            ours: lambda: _touched(ist.load_file(path)),
            f"{ST_LOAD} + touch": lambda: _touched(st.load_file(path)),
        }

        def check(label: str, result: Any) -> None:
            _same(result[0], tensors, label)

        got = alternate(calls, nbytes, CPU_REPEATS * ctx.sizes.repeats, check)
    return _fields(got, ours, _size(nbytes, "CPU"), rss=False) | {"directory": str(directory)}


# ------------------------------------------------------------------ GPU rows


def _gpu_tensors(ctx: BenchContext) -> tuple[Any, dict[str, Any], int]:
    g = ctx.gpu()
    tensors = _tensors(g.th, 8 * g.nbytes, "cuda")
    g.sync()
    return g, tensors, sum(t.nbytes for t in tensors.values())


def _plain(path: Path, host: np.ndarray, nbytes: int, write: bool) -> None:
    """Write (read) ``nbytes`` to (from) ``path`` from (into) ``host``, in its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY)
    try:
        for offset in range(0, nbytes, host.nbytes):
            view = memoryview(host)[: min(host.nbytes, nbytes - offset)]
            os.pwrite(fd, view, offset) if write else os.preadv(fd, [view], offset)
    finally:
        os.close(fd)


def ckpt_save(ctx: BenchContext) -> dict[str, Any]:
    """CUDA tensors saved by interop and by the package, to ``INTEROP_BENCH_DIR``."""
    st, ist = _libraries()
    g, tensors, nbytes = _gpu_tensors(ctx)
    link = measure({"d2h_limit": g.limit_case(True)}, ctx.sizes.repeats, sync=g.sync)
    host = np.array(g.ref).view(np.uint8)  # pageable, the GPU rows' bytes
    ours, disk = "interop.safetensors.save_file", "sequential file write"
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        mine, theirs, plain = (Path(tmp) / n for n in ("ours", "theirs", "plain"))
        calls = {
            ours: lambda: ist.save_file(tensors, mine),
            ST_SAVE: lambda: st.save_file(tensors, theirs) or theirs,
            disk: lambda: _plain(plain, host, nbytes, True) or plain,
        }

        def check(label: str, path: Path) -> None:
            if label != disk:
                _same(st.load_file(path), tensors, label)

        got = alternate(calls, nbytes, ctx.sizes.repeats, check, tidy=Path.unlink)
    bound = min(got[disk].gbps, link["d2h_limit"].gbps)
    fields = _fields(got, ours, _size(nbytes, "CUDA"), **{CKPT_SAVE: bound})
    fields["anchors"]["d2h_limit GB/s"] = link["d2h_limit"].gbps
    return fields | {"directory": str(ctx.workdir)}


def ckpt_load(ctx: BenchContext) -> dict[str, Any]:
    """A file of CUDA tensors loaded onto the GPU by interop and by the package."""
    st, ist = _libraries()
    g, tensors, nbytes = _gpu_tensors(ctx)
    link = measure({"h2d_limit": g.limit_case(False)}, ctx.sizes.repeats, sync=g.sync)
    host = np.array(g.ref).view(np.uint8)
    ours, disk = "interop.safetensors.load_file(device='cuda')", "sequential file read"
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        path = ist.save_file(tensors, Path(tmp) / "a.safetensors")

        def synced(result: Any) -> Any:
            g.sync()
            return result

        calls = {
            ours: lambda: synced(ist.load_file(path, device="cuda")),
            f"{ST_LOAD}(device='cuda')": lambda: synced(st.load_file(path, device="cuda")),
            disk: lambda: _plain(path, host, nbytes, False),
        }

        def check(label: str, loaded: Any) -> None:
            if label != disk:
                _same(loaded, tensors, label)

        got = alternate(calls, nbytes, ctx.sizes.repeats, check)
    bound = min(got[disk].gbps, link["h2d_limit"].gbps)
    fields = _fields(got, ours, _size(nbytes, "CUDA"), **{CKPT_LOAD: bound})
    fields["anchors"]["h2d_limit GB/s"] = link["h2d_limit"].gbps
    return fields | {"directory": str(ctx.workdir)}


ROWS = (
    RowSpec("ckpt_save_cpu", "interop.safetensors.save_file of CPU tensors, tmpfs", False,
            ckpt_save_cpu, unavailable=package_unavailable),
    RowSpec("ckpt_load_cpu", "interop.safetensors.load_file of CPU tensors + touch, tmpfs",
            False, ckpt_load_cpu, unavailable=package_unavailable),
    RowSpec("ckpt_save", "interop.safetensors.save_file of CUDA tensors", True, ckpt_save,
            unavailable=package_unavailable),
    RowSpec("ckpt_load", "interop.safetensors.load_file(device='cuda')", True, ckpt_load,
            unavailable=package_unavailable),
)  # fmt: skip

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
