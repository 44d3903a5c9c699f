"""``interop.config``: transfer settings, global or per ``with`` block.

Each setting is mirrored by an environment variable read at import:
``INTEROP_CHUNK_BYTES``, ``INTEROP_NUM_BUFFERS``, ``INTEROP_HOST_THREADS``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["Config", "config"]

# Provisional defaults (see docs/transfer.md): 4 slots of 32 MiB keep a PCIe
# Gen5 link busy (~0.7 ms of DMA per chunk, far above the per-chunk overhead)
# with 128 MiB of pinned memory.
_DEFAULTS = {"chunk_bytes": 32 << 20, "num_buffers": 4, "host_threads": 4}
_MINIMUM = {"chunk_bytes": 1, "num_buffers": 1, "host_threads": 1}
_ENV = {name: f"INTEROP_{name.upper()}" for name in _DEFAULTS}


def _validate(name: str, value: object) -> int:
    if name not in _DEFAULTS:
        raise AttributeError(f"expected one of {sorted(_DEFAULTS)} (got {name!r})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected {name} to be an int (got {value!r})")
    if value < _MINIMUM[name]:
        raise ValueError(f"expected {name} >= {_MINIMUM[name]} (got {value!r})")
    return value


def _from_env(name: str) -> int:
    raw = os.environ.get(_ENV[name])
    if raw is None or raw.strip() == "":
        return _DEFAULTS[name]
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise ValueError(
            f"expected {_ENV[name]} to be an integer (got {raw!r}); unset it or fix it"
        ) from None
    return _validate(name, value)


class Config:
    """Transfer settings.

    Attributes
    ----------
    chunk_bytes : int
        Size of one staging buffer (one chunk), in bytes.
    num_buffers : int
        Number of staging buffers in the ring.
    host_threads : int
        Threads that copy between staging buffers and host arrays.

    Examples
    --------
    >>> import interop
    >>> with interop.config.set(chunk_bytes=8 << 20):
    ...     interop.config.chunk_bytes
    8388608
    """

    # The values are a base (global assignments, environment) plus one overlay
    # per active ``set`` block. Leaving a block removes its own overlay
    # wherever it is in the stack, so blocks entered and left by different
    # threads in any interleaving restore the base exactly, instead of one
    # thread "restoring" another thread's temporary value forever.
    __slots__ = ("_base", "_lock", "_overlays", "_values")
    _lock: threading.Lock
    _base: dict[str, int]
    _overlays: list[dict[str, int]]
    _values: dict[str, int]

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_base", {name: _from_env(name) for name in _DEFAULTS})
        object.__setattr__(self, "_overlays", [])
        object.__setattr__(self, "_values", dict(self._base))

    def _recompute(self) -> None:  # with self._lock held
        values = dict(self._base)
        for overlay in self._overlays:
            values.update(overlay)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> int:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"interop.config has no setting {name!r}") from None

    def __setattr__(self, name: str, value: object) -> None:
        checked = _validate(name, value)
        with self._lock:
            # Inside a block that set this name, the assignment lasts until
            # that block exits (as if the block had set it), like a restore.
            for overlay in reversed(self._overlays):
                if name in overlay:
                    overlay[name] = checked
                    break
            else:
                self._base[name] = checked
            self._recompute()

    def as_dict(self) -> dict[str, int]:
        """The current settings."""
        return dict(self._values)

    @contextlib.contextmanager
    def set(self, **settings: int) -> Iterator[Config]:
        """Change settings for the duration of a ``with`` block.

        All values are validated before any is changed; the previous values
        are restored on exit, also when the block raises. Blocks nest. The
        settings are process-wide (a transfer started by any thread while the
        block is active uses them); blocks entered by several threads at once
        each remove only their own change on exit. For a per-call choice pass
        ``chunk_bytes=`` to the call instead.

        Raises
        ------
        AttributeError, TypeError, ValueError
            Unknown setting, or a value that is not a positive int.
        """
        checked = {name: _validate(name, value) for name, value in settings.items()}
        overlay = dict(checked)
        with self._lock:
            self._overlays.append(overlay)
            self._recompute()
        try:
            yield self
        finally:
            with self._lock:
                # identity, not equality: two blocks may set the same values
                index = next(i for i, o in enumerate(self._overlays) if o is overlay)
                del self._overlays[index]
                self._recompute()

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"interop.config({items})"


config = Config()


def chunk_bytes_or_default(chunk_bytes: int | None) -> int:
    """A call's ``chunk_bytes`` argument, or ``config.chunk_bytes`` for None.

    Raises
    ------
    ValueError
        Not a positive int.
    """
    value = config.chunk_bytes if chunk_bytes is None else chunk_bytes
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"expected chunk_bytes to be a positive int (got {value!r})")
    return value
