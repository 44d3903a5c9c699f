"""What a copy moves, where and how: the request a public call builds once.

The public calls (:mod:`interop.transfer`, :mod:`interop.io`) check their
options first (:func:`check_options`, before they allocate or create
anything), then their arrays, describe them, and hand one
:class:`TransferRequest` to :func:`interop.pipeline.start.start`, whose
validator resolves the options and checks that the request is whole.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Any, Literal

import numpy as np

from ..arrays import Source
from ..config import chunk_bytes_or_default, config
from ..errors import UsageError
from .backend import HostStage
from .progress import check_progress

__all__ = ["TransferRequest", "check_options"]

# (device, target, stage) each direction needs
_NEEDS = {
    "d2h": (True, False, True),
    "h2d": (True, False, True),
    "h2h": (False, False, True),
    "d2d": (True, True, False),
}


def check_options(chunk_bytes: Any, progress: Any) -> int:
    """The chunk size of ``chunk_bytes`` (:func:`~interop.config.chunk_bytes_or_default`),
    once ``progress`` is a bool or a callable.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A ``chunk_bytes`` that is not an integer in bounds, a ``progress``
        that is neither (a ``TypeError`` or ``ValueError``).
    """
    chunk = chunk_bytes_or_default(chunk_bytes)
    check_progress(progress)
    return chunk


@dataclass(frozen=True)
class TransferRequest:
    """One copy, described by the public call that starts it.

    Attributes
    ----------
    func : str
        The public function, for messages and the transfer thread's name.
    direction : {"d2h", "h2d", "h2h", "d2d"}
        Device to host, host to device (both through the staging ring), host
        to host (the host engine), device to device (one queued copy).
    result : object
        What :meth:`Transfer.result` returns.
    stage : HostStage, optional
        The host end: what happens to each chunk on the host.
    device : Source, optional
        The device array: the source (d2h, d2d) or the destination (h2d).
    target : Source, optional
        d2d: the destination.
    shape, itemsize : tuple of int, int
        h2h: the array walked in C order (a device request reads them off
        the device array).
    chunk_bytes : int, optional
        Given to the constructor; validated into :attr:`chunk`, default
        ``config.chunk_bytes`` (at least 64 KiB).
    progress : bool or callable
        A tqdm bar, or ``progress(bytes_done, bytes_total)``.
    order : str
        What the byte ranges of progress and errors count in.
    threads : int
        Host threads for the stage's pieces; 0 (default): ``config.host_threads``.
    host : numpy.ndarray, optional
        The host array the stage writes (d2h) or reads (h2d): the DMAs use it
        directly where it is page-locked and C-contiguous.
    cast : numpy.dtype, optional
        d2h: the floating dtype the chunks are cast to on the device.
    inline : bool
        Run on the calling thread before :func:`start` returns (blocking calls).
    """

    func: str
    direction: Literal["d2h", "h2d", "h2h", "d2d"]
    result: Any
    stage: HostStage | None = None
    device: Source | None = None
    target: Source | None = None
    shape: tuple[int, ...] = ()
    itemsize: int = 1
    chunk_bytes: InitVar[int | None] = None
    progress: Any = False
    order: str = "the source's C order"
    threads: int = 0
    host: np.ndarray | None = None
    cast: np.dtype | None = None
    inline: bool = False
    chunk: int = field(init=False)

    def __post_init__(self, chunk_bytes: int | None) -> None:
        """The validator: the options checked and resolved, and the ends the
        direction needs present."""
        object.__setattr__(self, "chunk", check_options(chunk_bytes, self.progress))
        if not self.threads:
            object.__setattr__(self, "threads", config.host_threads)
        have = (self.device is not None, self.target is not None, self.stage is not None)
        if _NEEDS.get(self.direction) != have:
            raise UsageError(
                f"{self.func}: expected a request of direction 'd2h', 'h2d', 'h2h' or 'd2d' "
                f"with its ends (device, target, stage) {_NEEDS.get(self.direction)} "
                f"(got {self.direction!r} with {have})"
            )
