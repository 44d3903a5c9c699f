"""Progress of a transfer in bytes: a tqdm bar or a user callback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidTypeError

__all__ = ["Progress", "check_progress"]


def check_progress(progress: Any) -> None:
    """Raise InvalidTypeError for a ``progress`` that is neither a bool nor a callable."""
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise InvalidTypeError(
        "expected progress to be True, False or a callable progress(bytes_done, bytes_total) "
        f"(got {progress!r})"
    )


class Progress:
    """A tqdm bar (``True``), a callable ``progress(bytes_done, bytes_total)``, or nothing.

    :meth:`add` is called by the transfer's thread only, with completed bytes in order.
    """

    def __init__(self, progress: Any, total: int, desc: str) -> None:
        self._callback: Callable[[int, int], Any] | None = None
        self._bar = None
        self.done = 0
        self.total = total
        self.desc = desc
        self.raised: BaseException | None = None  # what the callback raised, if it did
        if callable(progress):
            self._callback = progress
        elif progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc)

    def add(self, n: int) -> None:
        """Count ``n`` more bytes as done."""
        self.done += n
        if self._callback is not None:
            try:
                self._callback(self.done, self.total)
            except BaseException as exc:
                self.raised = exc  # raised as itself, not as the transfer's own failure
                add_note = getattr(exc, "add_note", None)  # Python >= 3.11
                if add_note is not None:
                    add_note(
                        f"raised by the progress callback of {self.desc}; bytes [0, {self.done}) "
                        f"of {self.total} were complete when it raised"
                    )
                raise
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Close the bar, if any. Idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
