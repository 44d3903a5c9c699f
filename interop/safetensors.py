"""Checkpoints in the safetensors format, streamed through the staging ring: a
drop-in for ``safetensors.torch`` (the documented module path; the code is in
:mod:`interop.io.safetensors`).

``import interop`` does not import it; it imports without PyTorch (for
``framework="np"``) and never needs the safetensors package.
"""

from __future__ import annotations

from .io.safetensors import (
    load_file,
    load_into,
    load_model,
    safe_open,
    save_file,
    save_model,
    save_sharded,
)

__all__ = [
    "load_file",
    "load_into",
    "load_model",
    "safe_open",
    "save_file",
    "save_model",
    "save_sharded",
]
