"""Replaced files freed by a thread: rename costs no block freeing (0.5 s/GiB on ext4)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from pathlib import Path

from .. import _process

__all__ = ["replaced_files", "wait_for_replaced_files"]

# Smaller files are freed in the rename (a hand-over costs more); at most this many are held.
_FREE_LATER_BYTES = 8 << 20
_FREE_LATER_MAX = 4
# Local file systems, where the last close frees a file with no name left (not NFS)
_FREE_ON_CLOSE = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "overlay"})


def _file_system_types() -> dict[tuple[int, int], str]:
    """The type of each mounted file system by device number (empty without ``/proc``)."""
    types = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 3 or not rest:
                    continue
                major, _, minor = parts[2].partition(":")
                types[(int(major), int(minor))] = rest.split()[0]
    except (OSError, ValueError):
        return {}
    return types


class _ReplacedFiles:
    """Descriptors of replaced files, closed by a thread that leaves after a second idle."""

    _IDLE_SECONDS = 1.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[int | threading.Event] = queue.SimpleQueue()
        self._held: dict[int, tuple[int, int]] = {}
        self._thread: threading.Thread | None = None

    def hold(self, target: Path, st: os.stat_result) -> int | None:
        """A descriptor of ``target`` (the file ``st``) for :meth:`close_later`, or None."""
        if st.st_nlink != 1 or st.st_blocks * 512 < _FREE_LATER_BYTES:
            return None
        # read each time: device numbers of tmpfs, overlay or NFS mounts are reused
        kind = _file_system_types().get((os.major(st.st_dev), os.minor(st.st_dev)))
        if kind not in _FREE_ON_CLOSE:
            return None
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(target, flags)
        except OSError:
            return None
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            return None
        with self._lock:
            self._held[fd] = (now.st_dev, now.st_ino)
        return fd

    def close_later(self, fd: int | None) -> None:
        """Close ``fd`` on the thread; at once when enough wait or no thread starts."""
        if fd is None:
            return
        with self._lock:
            if len(self._held) <= _FREE_LATER_MAX and self._started():
                self._queue.put(fd)
                return
        self._close(fd)

    def _started(self) -> bool:
        """A running thread (called with the lock held); False if none can start."""
        if self._thread is not None:
            return True
        # not "interop-...": the exit handler joins those; at exit the kernel closes the rest
        thread = threading.Thread(target=self._run, name="free-replaced-files", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread"
            return False
        self._thread = thread
        return True

    def _close(self, fd: int) -> None:
        """Close a held descriptor, then forget it unless its number was held again since."""
        with self._lock:
            key = self._held.get(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        with self._lock:
            if key is not None and self._held.get(fd) == key:
                del self._held[fd]

    def wait(self) -> None:
        """Block until every descriptor handed over so far was closed."""
        done = threading.Event()
        with self._lock:
            if self._thread is None:
                return
            self._queue.put(done)  # set by the thread after what was queued before it
        done.wait()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._IDLE_SECONDS)
            except queue.Empty:
                with self._lock:  # every put happens under the lock: nothing can slip in
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if isinstance(item, threading.Event):
                item.set()
            else:
                self._close(item)

    def after_fork_in_child(self) -> None:
        """Close the child's copies of the held descriptors (it has no thread)."""
        for fd, key in list(self._held.items()):
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == key:
                    os.close(fd)
        self._reset()


replaced_files = _ReplacedFiles()
_process.at_fork("replaced files", replaced_files.after_fork_in_child)


def wait_for_replaced_files() -> None:
    """Block until every file replaced so far was freed: for benchmarks and tests."""
    replaced_files.wait()
