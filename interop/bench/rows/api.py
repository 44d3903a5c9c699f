"""The interop functions a row measures, looked up when the row runs (a row
lists what it needs; one missing from the installed build makes the row "not
available" instead of failing the whole benchmark)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["api"]


def api(name: str) -> Any:
    """``interop.<name>``, looked up at call time."""
    return getattr(importlib.import_module("interop"), name)
