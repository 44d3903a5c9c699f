"""python -m interop info."""

from __future__ import annotations

import json
import subprocess
import sys

from interop import _backends
from tests.helpers import child_env, run_python


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "interop", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_info_lists_versions_and_devices():
    import numpy as np

    proc = _run("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"numpy      {np.__version__}" in out
    for key in ("python", "ml_dtypes", "torch", "cupy", "CUDA"):
        assert key in out
    if "device 0" not in out:
        assert "no CUDA device" in out


def test_info_json_parses():
    proc = _run("info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"python", "numpy", "ml_dtypes", "torch", "cupy"}
    assert isinstance(data["cupy"]["available"], bool)
    if data["cupy"]["available"]:
        assert isinstance(data["cupy"]["bfloat16"], bool)
        assert isinstance(data["cupy"]["devices"], list)


def test_info_without_torch_and_cupy():
    proc = run_python(
        """
        import sys
        sys.modules["torch"] = None
        sys.modules["cupy"] = None
        from interop.__main__ import main
        main(["info"])
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert f"torch      not installed: {_backends.install_command('torch')}\n" in proc.stdout
    cupy = f"{_backends.install_command('cuda12')} or {_backends.install_command('cuda13')}"
    assert f"cupy       not installed: {cupy}\n" in proc.stdout
    assert "no CUDA device" in proc.stdout
