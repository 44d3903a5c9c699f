"""Where a saved file goes: every check before any data moves, atomic replacement.

The policy is :func:`interop.save_npy`'s (its docstring states it for users).
:func:`prepare_destination` applies it in named steps: :func:`_file_name`
(``.npy`` appended as ``numpy.save`` appends it), :func:`_kind` (nothing, a
regular file, a FIFO or character device written into, or refused),
:func:`_replaced_target` (the file a symlink leads to), :func:`_check_directory`
and :func:`_check_permissions` (the temporary can be made beside the target and
renamed over it, as ``open`` would allow this process: ``os.access`` with the
effective ids; a file whose directory is not writable is refused, although
``numpy.save`` would overwrite it in place: a save that cannot be atomic is not
attempted).

:meth:`Destination.open` writes an unnamed temporary file where the system
allows it (Linux's ``O_TMPFILE``), so a killed process leaves nothing behind,
and names it (``.NAME.XXXXXXXX.tmp``) just before the rename; elsewhere (NFS,
say) that hidden named file exists from the start. :meth:`Destination.create`
always makes the named file (other processes open it by name).
"""

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
    "wait_for_replaced_files",
]

T = TypeVar("T")
_SUFFIX = ".npy"
# The temporary's name: "." + the first characters of the file's name (to tell
# what a leftover after a killed process belonged to) + a random token. Short
# whatever the file's name, so a name numpy.save accepts never becomes too long.
_NAME_CHARS = 16
_TEMPORARY_TRIES = 16
# Write through an unnamed temporary file (O_TMPFILE) where the system allows
# it, so that a killed process leaves nothing behind; tests switch it off to
# exercise the named temporary that other systems get.
_UNNAMED_TEMPORARY = sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")
# What open(O_TMPFILE) fails with where the file system (or kernel) has no
# unnamed files: EOPNOTSUPP, EISDIR on kernels before 3.11, EINVAL.
_NO_UNNAMED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


class Destination:
    """A checked place to write one file (made by :func:`prepare_destination`):
    a temporary renamed over the target, or a FIFO / character device written
    in place. Write through :meth:`open`, or :meth:`create` then :meth:`commit`
    or :meth:`discard` (when other processes write the temporary by name)."""

    __slots__ = ("_created", "_opened", "func", "path", "streaming", "target", "temporary")

    def __init__(
        self, path: Path, target: Path, *, streaming: bool, func: str = "save_npy"
    ) -> None:
        self.path = path  # as given, with .npy appended
        self.target = target  # what is written or replaced: absolute, symlinks followed
        self.streaming = streaming  # written in place, in order: no temporary, no offsets
        # the hidden temporary beside target, from create() (open(): the end of
        # the writes) until commit() or discard()
        self.temporary: Path | None = None if streaming else _temporary_name(target)
        self.func = func
        self._created = False  # the named temporary exists
        self._opened = False  # create() or open() was called

    def __repr__(self) -> str:
        how = "streaming" if self.streaming else f"temporary={str(self.temporary)!r}"
        return f"Destination({str(self.path)!r}, target={str(self.target)!r}, {how})"

    def create(self) -> int:
        """Open the destination for writing; return the descriptor (closed by
        the caller before :meth:`commit`): :attr:`temporary` created
        exclusively, never through a link, with ``open(path, "wb")``'s mode
        (0600 until :meth:`commit` when it replaces a file); or the FIFO
        (waiting for a reader, as ``open`` does) or device."""
        self._refuse_a_second_open()
        flags = os.O_WRONLY | os.O_CLOEXEC
        if self.streaming:
            fd = os.open(self.target, flags | os.O_NOCTTY)
        else:
            mode = 0o600 if self.target.exists() else 0o666
            flags |= os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = self._under_a_free_name(lambda name: os.open(name, flags, mode))
        self._opened = self._created = True
        return fd

    def _refuse_a_second_open(self) -> None:
        if self._opened:
            raise RuntimeError(f"{self!r}: create() was already called")

    def _under_a_free_name(self, make: Callable[[Path], T]) -> T:
        """``make(temporary)``, drawing another name while one exists."""
        for _ in range(_TEMPORARY_TRIES):
            try:
                assert self.temporary is not None
                return make(self.temporary)
            except FileExistsError:
                self.temporary = _temporary_name(self.target)
        raise path_error(
            errno.EEXIST,
            f"{self.func} could not create a temporary file beside {str(self.target)!r} "
            f"after {_TEMPORARY_TRIES} tries (every drawn name existed)",
            str(self.temporary),
        )

    def _create_unnamed(self) -> int | None:
        """An unnamed temporary beside the target (``O_TMPFILE``); None where there is none."""
        if self.streaming or not _UNNAMED_TEMPORARY:
            return None
        self._refuse_a_second_open()
        mode = 0o600 if self.target.exists() else 0o666
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
        # A directory descriptor makes os.link call linkat (a plain link(2)
        # would link the /proc entry itself, not follow it to the file).
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
        """Rename the temporary over the target, atomically (streaming: nothing to do).

        An existing file's mode bits are kept, and its owner and group where
        this process may set them; nothing is synced to disk (as
        ``numpy.save``). A replaced file is freed by :data:`~interop.io._replaced.replaced_files`'
        thread. On an error (the target became a directory, the rename
        failed) the temporary is removed.
        """
        if self.streaming:
            return
        if not self._created or self.temporary is None:
            raise RuntimeError(f"{self!r}: nothing to commit (create() first)")
        old = None
        try:
            try:
                st = os.stat(self.target)
            except FileNotFoundError:
                pass  # a new file: it already has open()'s mode
            else:
                if not stat.S_ISREG(st.st_mode):
                    raise path_error(
                        errno.EEXIST,
                        f"{self.func} will not replace {str(self.target)!r}: it became "
                        f"{file_kind(st.st_mode)} while the data was written; nothing was changed",
                        str(self.target),
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
        """Remove the temporary file, if any; the target stays as it was.
        Idempotent, never raises; what was written into a FIFO stays written."""
        if self._created and self.temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temporary)
        self._created = self._opened = False

    @contextlib.contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """Write the file in a ``with`` block (a buffered binary file):
        committed when it ends, discarded when it raises."""
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
    """Give ``temporary`` the replaced file's owner/group (where permitted), then
    its mode (after chown, which clears set-user/group-ID bits)."""
    mine = os.stat(temporary)
    if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
        for uid in (st.st_uid, -1):
            try:
                os.chown(temporary, uid, st.st_gid)
                break
            except PermissionError:
                continue
    os.chmod(temporary, stat.S_IMODE(st.st_mode))


def _temporary_name(target: Path) -> Path:
    return target.with_name(f".{target.name[:_NAME_CHARS]}.{secrets.token_hex(4)}.tmp")


# ----------------------------------------------------------------------- the checks


def prepare_destination(
    path: str | os.PathLike[str], func: str = "save_npy", suffix: str | None = _SUFFIX
) -> Destination:
    """Check where ``path`` leads and how a file written there must be made
    (the module's steps; ``func`` names the caller in messages). Nothing is
    created: a refused destination costs nothing. Raises the interop
    ``PathError`` subclasses (``PermissionError``, ``IsADirectoryError``...),
    ``TypeError`` and ``ValueError`` that :func:`interop.save_npy` lists.
    ``suffix``: appended to a name without one (None: the name is kept)."""
    dest = _file_name(path, func, suffix)
    st, streaming = _kind(dest, func)
    if streaming:
        real = _follow_links(dest)
        # /dev/stdout and /proc/self/fd/N lead to names like "pipe:[123]":
        # open the path as given when the link's text does not name the file.
        target = real if _same_file(real, st) else dest.absolute()
        return Destination(dest, target, streaming=True, func=func)
    target = _replaced_target(dest, st, func)
    dir_st = _check_directory(target, str(dest), func)
    _check_permissions(target, dest, st, dir_st, func)
    return Destination(dest, target, streaming=False, func=func)


def checked_path(path: object, func: str) -> str:
    """``path`` as a str; an :class:`InvalidTypeError` for what is no path, an
    :class:`InvalidValueError` for a NUL byte (no file name holds one)."""
    try:
        given = os.fsdecode(os.fspath(path))  # type: ignore[call-overload]
    except TypeError:
        raise InvalidTypeError(
            f"{func} expected path to be a str or os.PathLike (got {type(path).__name__} {path!r})"
        ) from None
    if "\0" in given:
        raise InvalidValueError(
            f"{func} expected a path without a NUL byte (got {given!r}); no file name can "
            "hold one: remove it"
        )
    return given


def _file_name(path: object, func: str, suffix: str | None = _SUFFIX) -> Path:
    """Step 1: the path, ``.npy`` appended to a name without a suffix (not
    to an existing FIFO or character device's)."""
    given = checked_path(path, func)
    if given == "":
        raise InvalidValueError(f"{func} expected a file path (got {path!r}); pass a file name")
    if given.endswith(os.sep) or (os.altsep and given.endswith(os.altsep)):
        raise path_error(
            errno.EISDIR,
            f"{func} expected a file path (got {given!r}, which names a directory); "
            "add a file name",
            given,
        )
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
    """Step 2: what ``dest`` is now (None: nothing, or a dangling link) and
    whether it streams (a writable FIFO or character device); anything else
    but a regular file is refused."""
    shown = str(dest)
    try:
        st = os.stat(dest)
    except FileNotFoundError:
        return None, False
    except NotADirectoryError as exc:
        raise path_error(
            errno.ENOTDIR,
            f"{func} cannot write {shown!r}: a component of its directory is a file, "
            "not a directory",
            shown,
        ) from exc
    except OSError as exc:  # ELOOP, ENAMETOOLONG, EACCES on a directory above
        raise path_error(
            exc.errno,
            f"{func} cannot write {shown!r}: {exc.strerror}{_FIXES.get(exc.errno, '')}",
            shown,
        ) from exc
    if stat.S_ISDIR(st.st_mode):
        raise path_error(
            errno.EISDIR,
            f"{func} expected a file path (got {shown!r}, a directory); "
            f"pass a file name inside it, e.g. {str(dest / ('array' + _SUFFIX))!r}",
            shown,
        )
    if _streams(st):
        if not _writable(dest, os.W_OK):
            raise _not_writable(func, dest, st)
        return st, True
    if not stat.S_ISREG(st.st_mode):
        raise path_error(
            errno.EINVAL,
            f"{func} will not write {shown!r}: it is {file_kind(st.st_mode)}; save to a regular "
            "file (or a FIFO or character device to stream the data)",
            shown,
        )
    return st, False


def _replaced_target(dest: Path, st: os.stat_result | None, func: str) -> Path:
    """Step 3: the file replaced (or created), symlinks followed; it must be
    the file ``dest`` names (a link into ``/proc`` may not lead there)."""
    target = _follow_links(dest)
    if st is not None and not _same_file(target, st):
        raise path_error(
            errno.EINVAL,
            f"{func} cannot replace {str(dest)!r}: it resolves to {str(target)!r}, which is not "
            "the same file (a link into /proc?); pass the file's own path",
            str(dest),
        )
    return target


def _check_directory(target: Path, shown: str, func: str) -> os.stat_result:
    """Step 4: the target's directory exists and allows its name; its status."""
    directory = target.parent
    try:
        dir_st = os.stat(directory)
    except FileNotFoundError:
        raise path_error(
            errno.ENOENT,
            f"{func} cannot write {shown!r}: its directory {str(directory)!r} does not exist; "
            "create it first (os.makedirs)",
            shown,
        ) from None
    except OSError as exc:
        raise path_error(
            exc.errno, f"{func} cannot write {shown!r}: {exc.strerror}", shown
        ) from exc
    if not stat.S_ISDIR(dir_st.st_mode):
        raise path_error(
            errno.ENOTDIR, f"{func} cannot write {shown!r}: {str(directory)!r} is a file", shown
        )
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 0
    if limit > 0 and len(os.fsencode(target.name)) > limit:
        raise path_error(
            errno.ENAMETOOLONG,
            f"{func} cannot write {shown!r}: its name is {len(os.fsencode(target.name))} bytes, "
            f"the file system allows {limit}; use a shorter name",
            shown,
        )
    return dir_st


def _check_permissions(
    target: Path, dest: Path, st: os.stat_result | None, dir_st: os.stat_result, func: str
) -> None:
    """Step 5: this process may write the file, make the temporary beside it
    and rename it over the file (a sticky directory's rule included)."""
    shown, directory = str(dest), target.parent
    if st is not None and not _writable(target, os.W_OK):
        raise _not_writable(func, dest, st)
    if not _writable(directory, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only_fs(directory) else "is not writable"
        action = "replace" if st is not None else "create"
        raise path_error(
            errno.EACCES,
            f"{func} cannot {action} {shown!r}: its directory {str(directory)!r} {why} "
            "(the file is written to a temporary file there and renamed when complete, so an "
            "interrupted save never leaves a half-written file); save elsewhere or make the "
            "directory writable",
            shown,
        )
    euid = os.geteuid()
    if (
        st is not None
        and dir_st.st_mode & stat.S_ISVTX
        and euid != 0
        and euid not in (st.st_uid, dir_st.st_uid)
    ):
        raise path_error(
            errno.EPERM,
            f"{func} cannot replace {shown!r}: its directory {str(directory)!r} is sticky "
            "(like /tmp) and neither the file nor the directory is yours; save elsewhere",
            shown,
        )


_FIXES: dict[int | None, str] = {  # what to do about a failed stat of the path
    errno.ENAMETOOLONG: "; use a shorter name",
    errno.ELOOP: "; the symlinks at the path lead back to themselves: fix or remove them",
    errno.EACCES: "; a directory above it may not be searched by this process: save elsewhere",
}


def _follow_links(path: Path) -> Path:
    """``path`` made absolute, the symlinks of its last component followed (as
    ``open`` follows them)."""
    # The directory part is kept as written: its links lead to the same
    # directory, and resolving them could need permissions that open does not.
    path = path.absolute()
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            link = os.readlink(path)
        except OSError:  # not a link, or nothing there: the end of the chain
            return path
        path = path.parent / link  # an absolute link replaces the whole path
    raise path_error(errno.ELOOP, os.strerror(errno.ELOOP), str(path))


def _same_file(path: Path, st: os.stat_result | None) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return st is not None and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, for a message ("a FIFO", ...)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _writable(path: Path | str, mode: int) -> bool:
    """What the kernel answers for this process (effective ids, like ``open``)."""
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)  # pragma: no cover - every Linux has effective ids


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _not_writable(func: str, dest: Path, st: os.stat_result) -> PathError:
    if _read_only_fs(dest):
        why, fix = "on a read-only file system", "save elsewhere"
    else:
        why = "which this process may not write"
        fix = "make it writable (chmod u+w) or save elsewhere"
    return path_error(
        errno.EACCES,
        f"{func} expected a writable file (got {str(dest)!r}, mode "
        f"{stat.filemode(st.st_mode)}, {why}); numpy.save refuses it too: {fix}",
        str(dest),
    )
