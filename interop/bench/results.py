"""What a results file records: ratios, the run's header (device, versions, commit, date,
machine), and the JSON writer."""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from .. import _backends
from ..config import config
from ..errors import BackendUnavailableError, NoDeviceError
from .measure import BenchSizes

#: Version of the JSON layout (3: ``machine`` and ``judged``; ``target`` and ``met`` only
#: where a run judged them; 2: ``ratios`` a list of objects with their direction).
SCHEMA = 3

#: What a ratio compares: time and memory, lower is better; throughput, higher is better.
QUANTITIES = ("time", "throughput", "memory")


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


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _field(text: str | None, key: str) -> str | None:
    """The value of the first ``key: value`` line of ``text`` (``/proc/cpuinfo``)."""
    match = re.search(rf"^{re.escape(key)}\s*:\s*(.+)$", text or "", re.MULTILINE)
    return match[1].strip() if match else None


def _l3_bytes() -> int | None:
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        size = _read(f"{index}/size")
        if _read(f"{index}/level") == "3" and size and size[:-1].isdigit():
            return int(size[:-1]) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
    return None


def _gpu_numa_node() -> int | None:
    if gpu_unavailable() is not None:
        return None
    try:
        cp = _backends.cupy()
        bus = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice()).lower()
        node = _read(f"/sys/bus/pci/devices/{bus}/numa_node")
        return int(node) if node is not None else None
    except Exception:  # an old driver, no sysfs: the fact is unknown, not an error
        return None


def machine() -> dict[str, Any]:
    """The machine a run measured, from ``/proc``, ``/sys`` and :func:`platform.libc_ver`; a
    fact that cannot be read is None (``gpu_numa_node``: -1 where the kernel does not know)."""
    cpuinfo = _read("/proc/cpuinfo")
    memory = _field(_read("/proc/meminfo"), "MemTotal")
    thp = re.search(r"\[(\w+)\]", _read("/sys/kernel/mm/transparent_hugepage/enabled") or "")
    nodes = glob.glob("/sys/devices/system/node/node[0-9]*")
    libc, version = platform.libc_ver()
    return {
        "cpu_model": _field(cpuinfo, "model name") or _field(cpuinfo, "Model") or None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numa_nodes": len(nodes) or None,
        "gpu_numa_node": _gpu_numa_node(),
        "l3_bytes": _l3_bytes(),
        "transparent_hugepages": thp[1] if thp else None,
        "glibc": version if libc == "glibc" and version else None,
        "memory_bytes": int(memory.split()[0]) * 1024 if memory else None,
    }


def _git(*args: str) -> str | None:
    cmd = ["git", "-C", str(Path(__file__).resolve().parent), *args]
    try:
        return subprocess.check_output(
            cmd, stderr=subprocess.DEVNULL, text=True, timeout=10
        ).strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run_header(kind: str, sizes: BenchSizes, quick: bool, judged: bool = False) -> dict[str, Any]:
    """A results file's header: ``kind`` ``"bench"`` or ``"sweep"``, ``quick`` a smoke run,
    ``judged`` whether targets were judged."""
    from ..info import collect_info

    started = datetime.datetime.now(datetime.timezone.utc)
    device = "no CUDA device"
    if gpu_unavailable() is None:
        runtime = _backends.cupy().cuda.runtime
        device = runtime.getDeviceProperties(runtime.getDevice())["name"]
    # INTEROP_COMMIT names the commit a copy of the tree came from (a remote runner); it wins
    # over git, as such a copy may carry a .git of another commit.
    named = os.environ.get("INTEROP_COMMIT", "").strip() or None
    commit, dirty, source = named, None, "INTEROP_COMMIT" if named else None
    if named is None:
        commit = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        source = "git" if commit is not None else None
    return {
        "schema": SCHEMA,
        "kind": kind,
        "quick": quick,
        "judged": judged,
        "device": device.decode() if isinstance(device, bytes) else str(device),
        "date": started.isoformat(timespec="seconds"),
        "commit": commit or "unknown",
        "commit_source": source,
        "commit_dirty": None if dirty is None else bool(dirty),
        "config": config.as_dict(),
        "sizes": dataclasses.asdict(sizes),
        "cpu_count": os.cpu_count(),
        "machine": machine(),
        "versions": collect_info(),
    }


def json_path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why results cannot be written to ``path`` (a directory, or under a file or a directory
    this process may not write in; missing directories are created), or None."""
    target = Path(path)
    if target.is_dir():
        return f"expected a file path for the results (got {str(path)!r}, a directory)"
    parent = next((p for p in target.parents if p.exists()), target.parents[-1])
    if not parent.is_dir():
        return (
            f"expected the results' path to be in a directory (got {str(path)!r}, but "
            f"{str(parent)!r} is a file); choose another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write the results under {str(parent)!r} (permission denied)"
    return None


def write_json(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``results`` as strict JSON (NaN and inf as ``null``) to ``path``, parents
    created, under a temporary name then renamed: a reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    loose = json.dumps(results, default=str)  # NaN, Infinity: tokens that are read as None
    text = json.dumps(json.loads(loose, parse_constant=lambda _: None), indent=2, allow_nan=False)
    partial = target.with_name(f".{target.name}.writing")
    partial.write_text(text + "\n")
    os.replace(partial, target)
    return target
