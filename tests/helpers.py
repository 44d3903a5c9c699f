"""Helpers shared by the tests (not fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``code`` in a fresh interpreter; return the CompletedProcess.

    Used for anything that could abort the interpreter (a C++ terminate in a
    library) and for import-time checks.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )
