"""Where a saved file goes: checked in named steps, written atomically (docs/npy.md)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from ..errors import InvalidTypeError, InvalidValueError, PathError, path_error
from ._replaced import replaced_files, wait_for_replaced_files

__all__ = [
    "Destination",
    "checked_path",
    "file_kind",
    "prepare_destination",
    "same_file",
    "wait_for_replaced_files",
]

T = TypeVar("T")
_SUFFIX = ".npy"
_NAME_CHARS = 16  # of the file's name in the temporary's: any name numpy.save takes fits
_TEMPORARY_TRIES = 16
# An unnamed temporary (O_TMPFILE) leaves nothing behind a killed process
_UNNAMED_TEMPORARY = sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")
# open(O_TMPFILE) where there are no unnamed files (EISDIR: kernels before 3.11)
_NO_UNNAMED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


class Destination:
    """A checked place to write one file: :meth:`open`, or :meth:`create` then :meth:`commit`."""

    __slots__ = ("_created", "_opened", "func", "path", "streaming", "target", "temporary")

    def __init__(self, path: Path, target: Path, *, streaming: bool, func: str) -> None:
        self.path = path  # as given, with .npy appended
        self.target = target  # what is written or replaced: absolute, symlinks followed
        self.streaming = streaming  # written in place, in order: no temporary, no offsets
        # the hidden temporary beside target, from create() until commit() or discard()
        self.temporary: Path | None = None if streaming else _temporary_name(target)
        self.func = func
        self._created = False  # the named temporary exists
        self._opened = False  # create() or open() was called

    def create(self) -> int:
        """Open the FIFO or device, or create :attr:`temporary` exclusively; return the fd."""
        flags = os.O_WRONLY | os.O_CLOEXEC
        if self.streaming:
            self._first_open()
            fd = os.open(self.target, flags | os.O_NOCTTY)
        else:
            flags |= os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            mode = self._first_open()
            fd = self._under_a_free_name(lambda name: os.open(name, flags, mode))
        self._opened = self._created = True
        return fd

    def _first_open(self) -> int:
        """The temporary's mode: open()'s, 0600 until :meth:`commit` where it replaces a file."""
        if self._opened:
            raise RuntimeError(f"{str(self.path)!r}: create() was already called")
        return 0o600 if self.target.exists() else 0o666

    def _under_a_free_name(self, make: Callable[[Path], T]) -> T:
        """``make(temporary)``, drawing another name while one exists."""
        for _ in range(_TEMPORARY_TRIES):
            try:
                assert self.temporary is not None
                return make(self.temporary)
            except FileExistsError:
                self.temporary = _temporary_name(self.target)
        message = f"{self.func} could not create a temporary file beside {str(self.target)!r}"
        raise path_error(errno.EEXIST, message, str(self.temporary))

    def _create_unnamed(self) -> int | None:
        """An unnamed temporary beside the target (``O_TMPFILE``); None where there is none."""
        if self.streaming or not _UNNAMED_TEMPORARY:
            return None
        mode = self._first_open()
        try:
            fd = os.open(self.target.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode)
        except OSError as exc:
            if exc.errno in _NO_UNNAMED:
                return None
            raise
        if not os.path.exists(f"/proc/self/fd/{fd}"):  # pragma: no cover - no /proc
            os.close(fd)
            return None
        self._opened = True
        return fd

    def _name_unnamed(self, fd: int) -> None:
        """Give the unnamed file ``fd`` its hidden name, ready for :meth:`commit`."""
        assert self.temporary is not None
        # a directory fd makes os.link call linkat, which follows the /proc entry
        directory = os.open(self.temporary.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._under_a_free_name(
                lambda name: os.link(
                    f"/proc/self/fd/{fd}", name.name, dst_dir_fd=directory, follow_symlinks=True
                )
            )
        finally:
            os.close(directory)
        self._created = True

    def commit(self) -> None:
        """Rename the temporary over the target, keeping a replaced file's mode and owner."""
        if self.streaming:
            return
        if not self._created or self.temporary is None:
            raise RuntimeError(f"{str(self.path)!r}: nothing to commit (create() first)")
        old = None
        try:
            try:
                st = os.stat(self.target)
            except FileNotFoundError:
                pass  # a new file: it already has open()'s mode
            else:
                if not stat.S_ISREG(st.st_mode):
                    shown = str(self.target)
                    why = f"it became {file_kind(st.st_mode)} while the data was written"
                    raise path_error(
                        errno.EEXIST, f"{self.func} will not replace {shown!r}: {why}", shown
                    )
                _copy_owner_and_mode(self.temporary, st)
                old = replaced_files.hold(self.target, st)
            try:
                os.replace(self.temporary, self.target)
            finally:
                replaced_files.close_later(old)
        except BaseException:
            self.discard()
            raise
        self._created = self._opened = False
        self.temporary = None

    def discard(self) -> None:
        """Remove the temporary file, if any (idempotent, never raises)."""
        if self._created and self.temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temporary)
        self._created = self._opened = False

    @contextlib.contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """Write the file in a ``with`` block: committed when it ends, discarded when it raises."""
        fd = self._create_unnamed()
        unnamed = fd is not None
        if fd is None:
            fd = self.create()
        try:
            with open(fd, "wb") as f:  # closes fd also if open itself fails
                yield f
                if unnamed:  # complete: give it a name (killed from here on, it stays)
                    f.flush()
                    self._name_unnamed(fd)
        except BaseException:
            self.discard()  # an unnamed file is freed by the close
            raise
        self.commit()


def _copy_owner_and_mode(temporary: Path, st: os.stat_result) -> None:
    """Give ``temporary`` the file's owner/group where permitted, then its mode (after chown)."""
    mine = os.stat(temporary)
    if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
        for uid in (st.st_uid, -1):
            with contextlib.suppress(PermissionError):
                os.chown(temporary, uid, st.st_gid)
                break
    os.chmod(temporary, stat.S_IMODE(st.st_mode))


def _temporary_name(target: Path) -> Path:
    return target.with_name(f".{target.name[:_NAME_CHARS]}.{secrets.token_hex(4)}.tmp")


def prepare_destination(
    path: str | os.PathLike[str], func: str = "save_npy", suffix: str | None = _SUFFIX
) -> Destination:
    """Check where ``path`` leads, creating nothing; ``suffix``: added to a name without one."""
    dest = _file_name(path, func, suffix)
    st, streaming = _kind(dest, func)
    if streaming:
        real = _follow_links(dest)
        # /dev/stdout and /proc/self/fd/N lead to names like "pipe:[123]": open as given
        target = real if same_file(real, st) else dest.absolute()
        return Destination(dest, target, streaming=True, func=func)
    target = _replaced_target(dest, st, func)
    dir_st = _check_directory(target, str(dest), func)
    _check_permissions(target, dest, st, dir_st, func)
    return Destination(dest, target, streaming=False, func=func)


def checked_path(path: object, func: str) -> str:
    """``path`` as a str, refusing what is no path and a NUL byte."""
    try:
        given = os.fsdecode(os.fspath(path))  # type: ignore[call-overload]
    except TypeError:
        raise InvalidTypeError(
            f"{func} expected path to be a str or os.PathLike (got {type(path).__name__} {path!r})"
        ) from None
    if "\0" in given:
        raise InvalidValueError(f"{func} expected a path without a NUL byte (got {given!r})")
    return given


def _file_name(path: object, func: str, suffix: str | None = _SUFFIX) -> Path:
    """Step 1: ``suffix`` appended to a name without one (not to a FIFO's or device's)."""
    given = checked_path(path, func)
    if given == "":
        raise InvalidValueError(f"{func} expected a file path (got {path!r}); pass a file name")
    if given.endswith(os.sep) or (os.altsep and given.endswith(os.altsep)):
        message = (
            f"{func} expected a file path (got {given!r}, which names a directory); add a file name"
        )
        raise path_error(errno.EISDIR, message, given)
    name = Path(given)
    if suffix is None or name.suffix or name.name.endswith(suffix):
        return name
    try:
        st = os.stat(name)
    except OSError:
        return Path(given + suffix)
    return name if _streams(st) else Path(given + suffix)


def _streams(st: os.stat_result) -> bool:
    return stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)


def _kind(dest: Path, func: str) -> tuple[os.stat_result | None, bool]:
    """Step 2: what ``dest`` is (None: nothing) and whether it streams (a FIFO or device)."""
    shown = str(dest)
    try:
        st = os.stat(dest)
    except FileNotFoundError:
        return None, False
    except OSError as exc:  # ENOTDIR, ELOOP, ENAMETOOLONG, EACCES on a directory above
        message = f"{func} cannot write {shown!r}: {exc.strerror}{_FIXES.get(exc.errno, '')}"
        raise path_error(exc.errno, message, shown) from exc
    if stat.S_ISDIR(st.st_mode):
        message = (
            f"{func} expected a file path (got {shown!r}, a directory); pass a file name inside it"
        )
        raise path_error(errno.EISDIR, message, shown)
    if _streams(st):
        if not os.access(dest, os.W_OK, effective_ids=True):
            raise _not_writable(func, dest, st)
        return st, True
    if not stat.S_ISREG(st.st_mode):
        why = f"it is {file_kind(st.st_mode)}; save to a regular file"
        raise path_error(errno.EINVAL, f"{func} will not write {shown!r}: {why}", shown)
    return st, False


def _replaced_target(dest: Path, st: os.stat_result | None, func: str) -> Path:
    """Step 3: the file replaced (or created), symlinks followed: the file ``dest`` names."""
    target = _follow_links(dest)
    if st is not None and not same_file(target, st):
        why = f"it resolves to {str(target)!r}, another file (a link into /proc?)"
        raise path_error(errno.EINVAL, f"{func} cannot replace {str(dest)!r}: {why}", str(dest))
    return target


def _check_directory(target: Path, shown: str, func: str) -> os.stat_result:
    """Step 4: the target's directory exists and allows its name; its status."""
    directory = target.parent
    try:
        dir_st = os.stat(directory)
    except OSError as exc:
        missing = f"its directory {str(directory)!r} does not exist; create it first"
        why = missing if isinstance(exc, FileNotFoundError) else str(exc.strerror)
        raise path_error(exc.errno, f"{func} cannot write {shown!r}: {why}", shown) from exc
    if not stat.S_ISDIR(dir_st.st_mode):
        why = f"{str(directory)!r} is a file"
        raise path_error(errno.ENOTDIR, f"{func} cannot write {shown!r}: {why}", shown)
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 0
    if limit > 0 and len(os.fsencode(target.name)) > limit:
        why = f"its name is {len(os.fsencode(target.name))} bytes, the file system allows {limit}"
        raise path_error(errno.ENAMETOOLONG, f"{func} cannot write {shown!r}: {why}", shown)
    return dir_st


def _check_permissions(
    target: Path, dest: Path, st: os.stat_result | None, dir_st: os.stat_result, func: str
) -> None:
    """Step 5: this process may write the file and make and rename a temporary beside it."""
    shown, directory = str(dest), target.parent
    if st is not None and not os.access(target, os.W_OK, effective_ids=True):
        raise _not_writable(func, dest, st)
    if not os.access(directory, os.W_OK | os.X_OK, effective_ids=True):
        why = "is on a read-only file system" if _read_only_fs(directory) else "is not writable"
        action = "replace" if st is not None else "create"
        why = f"its directory {str(directory)!r} {why} (a temporary file is written there)"
        raise path_error(errno.EACCES, f"{func} cannot {action} {shown!r}: {why}", shown)
    sticky = dir_st.st_mode & stat.S_ISVTX
    if st is not None and sticky and os.geteuid() not in (0, st.st_uid, dir_st.st_uid):
        why = f"its directory {str(directory)!r} is sticky and neither it nor the file is yours"
        raise path_error(errno.EPERM, f"{func} cannot replace {shown!r}: {why}", shown)


_FIXES: dict[int | None, str] = {  # what to do about a failed stat of the path
    errno.ENOTDIR: "; a component of its directory is a file, not a directory",
    errno.ENAMETOOLONG: "; use a shorter name",
    errno.ELOOP: "; the symlinks at the path lead back to themselves: fix or remove them",
    errno.EACCES: "; a directory above it may not be searched by this process: save elsewhere",
}


def _follow_links(path: Path) -> Path:
    """``path`` made absolute, the symlinks of its last component followed (as ``open`` does)."""
    # the directory part is kept: resolving it could need permissions open does not
    path = path.absolute()
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            link = os.readlink(path)
        except OSError:  # not a link, or nothing there: the end of the chain
            return path
        path = path.parent / link  # an absolute link replaces the whole path
    raise path_error(errno.ELOOP, os.strerror(errno.ELOOP), str(path))


def same_file(path: Path, st: os.stat_result | None) -> bool:
    """Whether ``path`` is the file of ``st`` (False where it cannot be looked at)."""
    try:
        other = os.stat(path)
    except OSError:
        return False
    return st is not None and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


_KINDS = dict(d="a directory", p="a FIFO", c="a character device", b="a block device", s="a socket")


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (from ``stat``, never a link) is, for a message ("a FIFO", ...)."""
    return _KINDS.get(stat.filemode(mode)[0], "not a regular file")


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _not_writable(func: str, dest: Path, st: os.stat_result) -> PathError:
    if _read_only_fs(dest):
        why, fix = "on a read-only file system", "save elsewhere"
    else:
        why, fix = "which this process may not write", "chmod u+w it or save elsewhere"
    mode = stat.filemode(st.st_mode)
    message = f"{func} expected a writable file (got {str(dest)!r}, mode {mode}, {why}); {fix}"
    return path_error(errno.EACCES, message, str(dest))
