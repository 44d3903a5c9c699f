"""``python -m interop info``: what interop sees on this machine."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import Any

import numpy as np

from . import _backends
from .errors import BackendUnavailableError

__all__ = ["collect_info", "format_info", "install_command"]

install_command = _backends.install_command


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_info() -> dict[str, Any]:
    try:
        th = _backends.torch()
    except BackendUnavailableError as exc:
        return {"available": False, "error": str(exc)}
    info: dict[str, Any] = {
        "available": True,
        "version": th.__version__,
        "cuda_build": th.version.cuda,
        "cuda_available": bool(th.cuda.is_available()),
    }
    if info["cuda_available"]:
        info["devices"] = [th.cuda.get_device_name(i) for i in range(th.cuda.device_count())]
    return info


def _cupy_info() -> dict[str, Any]:
    try:
        cp = _backends.cupy()
    except BackendUnavailableError as exc:
        return {"available": False, "error": str(exc)}
    info: dict[str, Any] = {
        "available": True,
        "version": cp.__version__,
        "bfloat16": _backends.cupy_supports_bfloat16(),
    }
    rt = cp.cuda.runtime
    for key, version in (("runtime", rt.runtimeGetVersion), ("driver", rt.driverGetVersion)):
        try:
            v = version()
            info[key] = f"{v // 1000}.{(v % 1000) // 10}" if v else "none"
        except Exception as exc:  # CUDARuntimeError, missing libcudart
            info[key] = f"unavailable ({exc})"
    info["devices"] = []
    for i in range(_backends.cupy_device_count()):
        props = rt.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gib = round(props["totalGlobalMem"] / 2**30, 1)
        capability = f"{props['major']}.{props['minor']}"
        info["devices"].append(
            dict(index=i, name=name, memory_gib=gib, compute_capability=capability)
        )
    return info


def collect_info() -> dict[str, Any]:
    """Versions, CUDA driver/runtime and devices (what is missing is reported, never raised)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "interop": _version(_backends.DISTRIBUTION) or "source tree",
        "numpy": np.__version__,
        "ml_dtypes": _version("ml_dtypes"),
        "torch": _torch_info(),
        "cupy": _cupy_info(),
    }


def format_info(info: dict[str, Any]) -> str:
    """Human-readable lines for :func:`collect_info`'s result."""
    lines = [
        f"python     {info['python']} ({info['platform']})",
        f"interop    {info['interop']}",
        f"numpy      {info['numpy']}",
        f"ml_dtypes  {info['ml_dtypes']}",
    ]
    th = info["torch"]
    if th["available"]:
        build = f"CUDA {th['cuda_build']}" if th["cuda_build"] else "CPU-only build"
        lines.append(f"torch      {th['version']} ({build}; CUDA usable: {th['cuda_available']})")
    else:
        lines.append(f"torch      not installed: {_backends.install_command('torch')}")
    cp = info["cupy"]
    if cp["available"]:
        bf16 = "yes" if cp["bfloat16"] else "no, needs CuPy >= 14"
        lines.append(f"cupy       {cp['version']} (bfloat16 exchange: {bf16})")
        lines.append(f"CUDA       driver {cp['driver']}, runtime {cp['runtime']}")
        for d in cp["devices"]:
            lines.append(
                f"device {d['index']}   {d['name']}, {d['memory_gib']} GiB, "
                f"compute capability {d['compute_capability']}"
            )
        if not cp["devices"]:
            lines.append("devices    no CUDA device")
    else:
        lines.append(
            f"cupy       not installed: {_backends.install_command('cuda12')} "
            f"or {_backends.install_command('cuda13')}"
        )
        lines.append("devices    no CUDA device visible to CuPy")
    return "\n".join(lines)
