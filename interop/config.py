"""``interop.config``: transfer settings, global or per ``with`` block.

Each setting is mirrored by an environment variable read at import
(``INTEROP_CHUNK_BYTES``, ``INTEROP_NUM_BUFFERS``, ``INTEROP_HOST_THREADS``,
``INTEROP_REGISTER_MIN_BYTES``) and
checked where it is set: an integer between a floor and a ceiling (docs/config.md
has the table and the reasons), refused at once with the setting's name.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from contextlib import AbstractContextManager
from typing import Any

from . import _process
from .errors import InvalidTypeError, InvalidValueError, UnknownSettingError, UsageError

__all__ = ["MIN_CHUNK_BYTES", "Config", "config"]


def _cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


# From sweeps on an H100 with 16 cores (docs/transfer.md). Half the cores, at most 8,
# leaves the rest to the issuing thread and the user.
_MOST_THREADS = 8
_DEFAULTS = {
    "chunk_bytes": 32 << 20,
    "num_buffers": 4,
    "host_threads": max(1, min(_MOST_THREADS, _cores() // 2)),
    "register_min_bytes": -1,  # measured on first use
}
_BOUNDS = {
    "chunk_bytes": (1, 1 << 30),
    "num_buffers": (1, 64),
    "host_threads": (1, 256),
    "register_min_bytes": (-1, 1 << 50),
}
_ENV = {name: f"INTEROP_{name.upper()}" for name in _DEFAULTS}

MIN_CHUNK_BYTES = 64 << 10
"""The smallest chunk a transfer uses: a smaller ``chunk_bytes`` is raised to it."""


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _unknown(name: str) -> UnknownSettingError:
    return UnknownSettingError(
        f"expected a setting of interop.config, one of {sorted(_DEFAULTS)} (got {name!r})"
    )


def _validate(name: str, value: object, source: str | None = None) -> int:
    """``value`` as an int within the setting's bounds; ``source`` names it in errors."""
    if name not in _DEFAULTS:
        raise _unknown(name)
    source = source or name
    if isinstance(value, bool):
        raise InvalidTypeError(f"expected {source} to be an integer (got {value!r}, a bool)")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidTypeError(
            f"expected {source} to be an integer (got {value!r}); pass an int such as "
            f"{_DEFAULTS[name]}"
        ) from None
    low, high = _BOUNDS[name]
    if not low <= number <= high:
        unit = f" ({_bytes(high)})" if name == "chunk_bytes" else ""
        raise InvalidValueError(f"expected {source} between {low} and {high}{unit} (got {value!r})")
    return number


def _env_text(name: str) -> str | None:
    """The setting's environment variable, stripped; None where unset or empty."""
    return os.environ.get(_ENV[name], "").strip() or None


def _from_env(name: str) -> int:
    variable = _ENV[name]
    text = _env_text(name)
    if text is None:
        return _DEFAULTS[name]
    try:
        value = int(text, 0)
    except ValueError:
        raise InvalidValueError(
            f"expected {variable} to be an integer (got {os.environ[variable]!r}); "
            "unset it or fix it"
        ) from None
    try:
        return _validate(name, value, variable)
    except ValueError as exc:
        raise InvalidValueError(f"{exc}; unset it or fix it") from None


class _Overlay:
    """The values of one active ``set`` block, and the thread that entered it."""

    __slots__ = ("thread", "values")

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values
        self.thread = threading.get_ident()


class Config:
    """Transfer settings.

    Attributes
    ----------
    chunk_bytes : int
        Bytes of one chunk (one staging buffer): 1 to 1 GiB; transfers use at
        least :data:`MIN_CHUNK_BYTES` (64 KiB).
    num_buffers : int
        Staging buffers in the ring: 1 to 64.
    host_threads : int
        Threads copying between staging buffers and host arrays: 1 to 256 (where
        set, also those of host-to-host copies; see :func:`host_copy_threads`).
    register_min_bytes : int
        A pageable ``out`` of a device-to-host copy this large or larger is partly
        page-locked in place (``cudaHostRegister``) while the ring copies the rest:
        -1 (default) measures the threshold on first use, 0 never registers.

    Examples
    --------
    >>> import interop
    >>> with interop.config.set(chunk_bytes=8 << 20):
    ...     interop.config.chunk_bytes
    8388608
    """

    # The values are a base (assignments, environment) plus one overlay per active
    # ``set`` block; leaving a block removes its own overlay wherever it is in the
    # stack, so blocks of several threads in any interleaving restore the base.
    __slots__ = ("__weakref__", "_base", "_chosen", "_lock", "_overlays", "_values")
    _lock: threading.Lock
    _base: dict[str, int]
    _chosen: set[str]
    _overlays: list[_Overlay]
    _values: dict[str, int]

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_base", {name: _from_env(name) for name in _DEFAULTS})
        # the settings given a value (assigned, or from the environment), not defaulted
        chosen = {name for name in _DEFAULTS if _env_text(name) is not None}
        object.__setattr__(self, "_chosen", chosen)
        object.__setattr__(self, "_overlays", [])
        object.__setattr__(self, "_values", dict(self._base))
        _instances.add(self)

    def _is_chosen(self, name: str) -> bool:
        """Whether ``name`` was given a value (assigned, from the environment, or by
        an active ``set`` block) rather than defaulted."""
        with self._lock:
            return name in self._chosen or any(name in o.values for o in self._overlays)

    def _recompute(self) -> None:  # with self._lock held
        values = dict(self._base)
        for overlay in self._overlays:
            values.update(overlay.values)
        object.__setattr__(self, "_values", values)

    def _after_fork_in_child(self) -> None:
        # a fresh lock, and only the forking thread's blocks (the others' threads are gone)
        me = threading.get_ident()
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_overlays", [o for o in self._overlays if o.thread == me])
        self._recompute()

    def __getattr__(self, name: str) -> int:
        try:
            return self._values[name]
        except KeyError:
            raise _unknown(name) from None

    def __setattr__(self, name: str, value: object) -> None:
        checked = _validate(name, value)
        with self._lock:
            # inside a block that set this name, the assignment lasts until that block exits
            for overlay in reversed(self._overlays):
                if name in overlay.values:
                    overlay.values[name] = checked
                    break
            else:
                self._base[name] = checked
                self._chosen.add(name)
            self._recompute()

    def __delattr__(self, name: str) -> None:
        if name not in _DEFAULTS:
            raise _unknown(name)  # config's own state included
        raise UsageError(
            f"expected {name} to be assigned, not deleted (got del config.{name}); assign "
            f"a value (config.{name} = {_DEFAULTS[name]}) or use a block: "
            f"with config.set({name}=...)"
        )

    def as_dict(self) -> dict[str, int]:
        """The current settings."""
        return dict(self._values)

    def set(self, **settings: int) -> AbstractContextManager[Config]:
        """Change settings for the duration of a ``with`` block.

        Every value is checked before any changes; the previous values come back
        on exit, also when the block raises. Blocks nest, each from its own
        ``set(...)`` call. The settings are process-wide (any thread's transfer
        uses them); each block removes only its own change. For one call only,
        pass ``chunk_bytes=`` to it.

        Raises
        ------
        UnknownSettingError
            An unknown setting.
        InvalidTypeError
            A value that is not an integer (``bool`` included).
        InvalidValueError
            A value outside the setting's bounds (see :class:`Config`).
        UsageError
            On entering: the object was entered already.
        """
        return _Block(self, {name: _validate(name, value) for name, value in settings.items()})

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"interop.config({items})"


class _Block(AbstractContextManager[Config]):
    """One ``config.set(...)``: entered once, its overlay removed on exit."""

    __slots__ = ("_config", "_overlay", "_values")

    def __init__(self, config: Config, values: dict[str, int]) -> None:
        self._config = config
        self._values = values
        self._overlay: _Overlay | None = None

    def __enter__(self) -> Config:
        config = self._config
        with config._lock:
            if self._overlay is not None:
                raise UsageError(
                    "expected each config.set(...) object to be entered once (got one entered "
                    "twice, or again after its block); call config.set(...) each time, as in "
                    "with interop.config.set(chunk_bytes=...):"
                )
            self._overlay = _Overlay(self._values)
            config._overlays.append(self._overlay)
            config._recompute()
        return config

    def __exit__(self, *exc_info: Any) -> None:
        config = self._config
        with config._lock:
            # identity, not equality: two blocks may set the same values (absent in a
            # forked child where another thread entered it)
            for i, o in enumerate(config._overlays):
                if o is self._overlay:
                    del config._overlays[i]
                    break
            config._recompute()


_instances: weakref.WeakSet[Config] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for instance in list(_instances):
        instance._after_fork_in_child()


_process.at_fork("config", _after_fork_in_child)

config = Config()


def host_copy_threads() -> int:
    """Threads of a host-to-host copy: ``config.host_threads`` where it was given a
    value, else all the CPUs this process may run on, at most 8 (a host copy has
    no issuing thread to leave cores to)."""
    if config._is_chosen("host_threads"):
        return config.host_threads
    return max(1, min(_MOST_THREADS, _cores()))


def chunk_bytes_or_default(chunk_bytes: object | None) -> int:
    """The chunk size a transfer uses: ``chunk_bytes`` (checked as the setting is),
    or ``config.chunk_bytes`` for None, raised to :data:`MIN_CHUNK_BYTES`."""
    value = config.chunk_bytes if chunk_bytes is None else _validate("chunk_bytes", chunk_bytes)
    return max(value, MIN_CHUNK_BYTES)
