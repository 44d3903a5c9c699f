"""A small tmpfs for tests of what a full disk does (not fixtures: a helper).

:func:`run_on_tmpfs` runs Python code in a fresh interpreter with
``sys.argv[1]`` naming the root of a tmpfs of a given size, mounted for that
run only. As root (with the right to mount, as on the development machine)
the tmpfs is mounted directly and unmounted afterwards; otherwise the child
runs in a new user and mount namespace (``unshare -rm``), where any user may
mount a tmpfs. Where neither works (a container without either right) the
test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

import pytest

from tests.helpers import child_env


def _try(argv: list[str]) -> bool:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@contextlib.contextmanager
def _directory() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="interop-tmpfs-")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


@functools.cache
def _how() -> str | None:
    """``"mount"``, ``"unshare"`` or None: how this machine lets a test mount a tmpfs."""
    if sys.platform != "linux":
        return None
    with _directory() as probe:
        if os.geteuid() == 0 and shutil.which("mount") and shutil.which("umount"):  # noqa: SIM102
            if _try(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe]):
                _try(["umount", probe])
                return "mount"
        script = 'mount -t tmpfs -o size=64k tmpfs "$1"'
        if shutil.which("unshare") and _try(["unshare", "-rm", "sh", "-c", script, "sh", probe]):
            return "unshare"
    return None


def run_on_tmpfs(
    code: str, size: str = "1m", *, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, ``sys.argv[1]`` the root of a new,
    empty tmpfs of ``size`` (``mount -o size=``: ``"1m"``, ``"512k"``).

    Returns the CompletedProcess (text output). Skips the calling test where
    this machine lets no test mount a tmpfs.
    """
    how = _how()
    if how is None:
        pytest.skip("cannot mount a tmpfs here (neither as root nor through unshare -rm)")
    code = textwrap.dedent(code)
    with _directory() as root:
        if how == "unshare":
            script = 'mount -t tmpfs -o "size=$1" tmpfs "$2" && exec "$3" -c "$4" "$2"'
            argv = ["unshare", "-rm", "sh", "-c", script, "sh", size, root, sys.executable, code]
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=child_env(),
                check=False,
            )
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", root], check=True)
        try:
            return subprocess.run(
                [sys.executable, "-c", code, root],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=child_env(),
                check=False,
            )
        finally:
            if not _try(["umount", root]):
                _try(["umount", "-l", root])  # still busy (a process it started): detach it
