"""What a copy moves, where and how: the request a public call builds once.

Public calls run :func:`check_options` before they allocate anything, then
hand one :class:`TransferRequest` to :func:`interop.pipeline.start.start`.
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
    """``chunk_bytes`` resolved (config's default and floor), once ``progress`` is checked."""
    chunk = chunk_bytes_or_default(chunk_bytes)
    check_progress(progress)
    return chunk


@dataclass(frozen=True)
class TransferRequest:
    """One copy: what moves (``device``, ``stage``, ``shape``), where (``direction``), how."""

    func: str  # the public function: messages, the transfer thread's name
    # d2h, h2d: through the staging ring; h2h: the host engine; d2d: one queued copy
    direction: Literal["d2h", "h2d", "h2h", "d2d"]
    result: Any  # what Transfer.result() returns
    stage: HostStage | None = None  # the host end (all but d2d)
    device: Source | None = None  # the device array: the source (d2h, d2d) or destination (h2d)
    target: Source | None = None  # d2d: the destination
    shape: tuple[int, ...] = ()  # h2h: the array walked in C order, and its itemsize
    itemsize: int = 1
    chunk_bytes: InitVar[int | None] = None  # resolved into chunk (config's default)
    progress: Any = False  # a tqdm bar, or progress(bytes_done, bytes_total)
    order: str = "the source's C order"  # what progress and error byte ranges count
    threads: int = 0  # host threads for the stage's pieces (0: config.host_threads)
    # d2h, h2d: the host array the stage writes or reads; the DMAs use it
    # directly where it is page-locked and C-contiguous
    host: np.ndarray | None = None
    cast: np.dtype | None = None  # d2h: the floating dtype chunks are cast to on the device
    fresh: bool = False  # d2h: host is a new array, its pages touched by the threads that fill them
    inline: bool = False  # run on the calling thread before start() returns (blocking calls)
    chunk: int = field(init=False)

    def __post_init__(self, chunk_bytes: int | None) -> None:
        """The validator: options resolved, and the ends the direction needs present."""
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
