"""What a results file records: the run's header (device, versions, commit, date); the writer."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from .. import _backends
from ..config import config
from ..errors import BackendUnavailableError, NoDeviceError
from .sizes import BenchSizes

__all__ = [
    "SCHEMA",
    "gpu_unavailable",
    "host_unavailable",
    "run_header",
    "write_json",
]

#: Version of the JSON layout; 2: ``ratios`` is a list of objects with their direction.
SCHEMA = 2


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


def _device_name() -> str:
    if gpu_unavailable() is not None:
        return "no CUDA device"
    cp = _backends.cupy()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def run_header(kind: str, sizes: BenchSizes, quick: bool) -> dict[str, Any]:
    """The top level of a results file, before its rows.

    Parameters
    ----------
    kind : str
        ``"bench"`` or ``"sweep"``.
    sizes : BenchSizes
    quick : bool
        A smoke run (``--quick``): nothing is judged.

    Returns
    -------
    dict
        ``schema``, ``kind``, ``quick``, ``device``, ``date`` (UTC, ISO 8601),
        ``commit`` (the ``INTEROP_COMMIT`` environment variable where set,
        else ``git rev-parse HEAD``, else ``"unknown"``),
        ``commit_source`` (``"git"``, ``"INTEROP_COMMIT"`` or None),
        ``commit_dirty`` (None without git or with ``INTEROP_COMMIT``),
        ``config``, ``sizes``,
        ``cpu_count``, ``versions``.
    """
    from ..info import collect_info

    started = datetime.datetime.now(datetime.timezone.utc)
    # INTEROP_COMMIT, where set, names the commit the caller copied the tree from (a remote
    # runner). It wins over git: such a copy may carry a .git of another commit (one runner's
    # copy had a .git at an older commit under a newer tree, so git called it dirty).
    named = os.environ.get("INTEROP_COMMIT", "").strip() or None
    commit: str | None
    dirty: str | None
    commit_source: str | None
    if named is not None:
        commit, dirty, commit_source = named, None, "INTEROP_COMMIT"
    else:
        commit = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        commit_source = "git" if commit is not None else None
    return {
        "schema": SCHEMA,
        "kind": kind,
        "quick": quick,
        "device": _device_name(),
        "date": started.isoformat(timespec="seconds"),
        "commit": commit or "unknown",
        "commit_source": commit_source,
        "commit_dirty": None if dirty is None else bool(dirty),
        "config": config.as_dict(),
        "sizes": dataclasses.asdict(sizes),
        "cpu_count": os.cpu_count(),
        "versions": collect_info(),
    }


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by None, for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``results`` as indented JSON to ``path`` (parents created); return the path.

    Non-finite floats are written as ``null``, so the file is strict JSON and
    a stray NaN cannot lose a run's results. The file is written under a
    temporary name and renamed, so a reader (or a run killed mid-write)
    never sees half a file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(results), indent=2, allow_nan=False, default=str)
    partial = target.with_name(f".{target.name}.writing")
    partial.write_text(text + "\n")
    os.replace(partial, target)
    return target
