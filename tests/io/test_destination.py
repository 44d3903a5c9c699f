"""interop.io.destination: what a save may replace, checked before any data moves.

Every case runs on real files in tmp_path (FIFOs through os.mkfifo, read by a
thread); never on a device node. Permission refusal is tested as an
unprivileged process would see it: root bypasses mode bits, so the subprocess
test drops root's override capabilities first.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import threading

import numpy as np
import pytest

import interop
from interop.io import _replaced, destination
from interop.io.destination import Destination, prepare_destination
from tests.helpers import reading_fifo, run_python


def _umask() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


def _save(dest: Destination, data: bytes) -> None:
    with dest.open() as f:
        f.write(data)


# ----------------------------------------------------------------- new and regular


def _unnamed_temporaries(directory) -> bool:
    """Whether this system gives ``directory`` unnamed files (``O_TMPFILE``)."""
    if not hasattr(os, "O_TMPFILE"):
        return False
    try:
        os.close(os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


@pytest.fixture(params=["unnamed", "named"])
def temporary_kind(request, tmp_path, monkeypatch):
    """Each test twice: with the unnamed temporary file (O_TMPFILE) where the
    system has one, and with the named one other systems get."""
    if request.param == "unnamed" and not _unnamed_temporaries(tmp_path):
        pytest.skip("no O_TMPFILE here: every save uses the named temporary file")
    monkeypatch.setattr(destination, "_UNNAMED_TEMPORARY", request.param == "unnamed")
    return request.param


def test_new_file_goes_through_a_short_hidden_temporary_beside_it(tmp_path, temporary_kind):
    dest = prepare_destination(tmp_path / "a.npy")
    assert os.listdir(tmp_path) == []  # checking creates nothing
    assert dest.path == dest.target == tmp_path / "a.npy"
    assert not dest.streaming
    assert dest.temporary is not None
    assert dest.temporary.parent == tmp_path
    assert dest.temporary.name.startswith(".a.npy.")
    with dest.open() as f:
        f.write(b"payload")
        f.flush()
        # nothing under the name yet; the temporary file has no name at all where it can
        named = [] if temporary_kind == "unnamed" else [dest.temporary.name]
        assert os.listdir(tmp_path) == named
    assert (tmp_path / "a.npy").read_bytes() == b"payload"
    assert os.listdir(tmp_path) == ["a.npy"]
    assert stat.S_IMODE((tmp_path / "a.npy").stat().st_mode) == 0o666 & ~_umask()


def _big_file(path, nbytes: int = 16 << 20, fill: int = 1) -> os.stat_result:
    """A file whose blocks are allocated (what the rename would free)."""
    path.write_bytes(bytes([fill]) * nbytes)
    return os.stat(path)


def _held_names() -> list[str]:
    """What this process's descriptors point to (``... (deleted)`` for an unlinked file)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, already closed
            continue
    return names


@pytest.fixture
def local_fs(tmp_path):
    """``tmp_path``, on a file system where a replaced file is freed in the background."""
    dev = os.stat(tmp_path).st_dev
    kind = _replaced._file_system_types().get((os.major(dev), os.minor(dev)))
    if kind not in _replaced._FREE_ON_CLOSE:
        pytest.skip(f"the temporary directory is on {kind!r}: replaced files are freed inline")
    return tmp_path


@pytest.fixture
def gated_closes(monkeypatch):
    """Hold the background closer inside its next ``os.close`` until the test opens the gate."""
    gate, entered = threading.Event(), threading.Event()
    closed_by: dict[int, str] = {}
    real_close = os.close

    def close(fd: int) -> None:
        who = threading.current_thread().name
        if who == "free-replaced-files":
            entered.set()
            assert gate.wait(30), "the test never opened the gate"
        closed_by[fd] = who
        real_close(fd)

    monkeypatch.setattr(os, "close", close)
    yield gate, entered, closed_by
    gate.set()


def test_a_replaced_large_file_is_freed_after_the_save_returns(local_fs, gated_closes):
    tmp_path = local_fs
    gate, entered, _ = gated_closes
    path = tmp_path / "a.npy"
    _big_file(path)
    new = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    interop.save_npy(new, path)
    np.testing.assert_array_equal(np.load(path), new)
    assert os.listdir(tmp_path) == ["a.npy"]  # no temporary left
    assert entered.wait(30)
    # the old file has no name but is still open: its blocks are not freed yet
    assert f"{path} (deleted)" in _held_names()
    gate.set()
    _replaced.replaced_files.wait()
    assert f"{path} (deleted)" not in _held_names()


def test_the_background_closer_holds_at_most_four_files(local_fs, gated_closes):
    tmp_path = local_fs
    gate, entered, closed_by = gated_closes
    files = _replaced._ReplacedFiles()
    fds = []
    for i in range(6):
        st = _big_file(tmp_path / f"f{i}", 8 << 20)
        fd = files.hold(tmp_path / f"f{i}", st)
        assert fd is not None
        fds.append(fd)
        files.close_later(fd)
        if i == 0:
            assert entered.wait(30)  # the thread is closing the first (held at the gate)
    # the one being closed and three waiting; the fifth and sixth were closed at once
    assert [closed_by.get(fd) for fd in fds] == [None] * 4 + ["MainThread"] * 2
    assert sorted(files._held) == sorted(fds[:4])
    gate.set()
    files.wait()
    assert [closed_by[fd] for fd in fds] == ["free-replaced-files"] * 4 + ["MainThread"] * 2
    assert files._held == {}
    files.close_later(None)  # nothing was held: nothing happens


def test_a_number_held_again_before_its_close_is_forgotten_stays_held(local_fs, monkeypatch):
    """The descriptor number a close frees may be handed out at once, for the
    next replaced file: forgetting the closed one must not forget that one."""
    tmp_path = local_fs
    files = _replaced._ReplacedFiles()
    first, second = tmp_path / "first", tmp_path / "second"
    fd = files.hold(first, _big_file(first))
    again: list[int | None] = []
    real_close = os.close

    def close_then_hold(number: int) -> None:
        real_close(number)
        if number == fd and not again:
            again.append(files.hold(second, _big_file(second)))  # the lowest free number

    monkeypatch.setattr(os, "close", close_then_hold)
    files._close(fd)
    monkeypatch.undo()
    assert again == [fd]  # the same number, now the second file's
    st = os.stat(second)
    assert files._held == {fd: (st.st_dev, st.st_ino)}
    files._close(fd)
    assert files._held == {}


def test_the_closer_leaves_when_idle_and_wait_returns_at_once_without_it(local_fs):
    """A process with a thread warns at os.fork(): the closer does not linger."""
    tmp_path = local_fs
    files = _replaced._ReplacedFiles()
    files._IDLE_SECONDS = 0.05
    files.wait()  # no thread yet
    for round_ in range(2):  # and a later hand-over starts another
        old = tmp_path / f"old{round_}"
        fd = files.hold(old, _big_file(old))
        old.unlink()  # as the rename would
        assert f"{old} (deleted)" in _held_names()
        files.close_later(fd)
        thread = files._thread
        assert thread is not None
        files.wait()
        assert f"{old} (deleted)" not in _held_names()  # wait returned after the close
        thread.join(10)
        assert not thread.is_alive()
        assert files._thread is None
        files.wait()


def test_a_closer_that_cannot_start_closes_at_once(local_fs, monkeypatch):
    tmp_path = local_fs
    files = _replaced._ReplacedFiles()

    def refuse(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    old = tmp_path / "old"
    fd = files.hold(old, _big_file(old))
    old.unlink()
    files.close_later(fd)  # no error: the save already succeeded
    assert f"{old} (deleted)" not in _held_names()
    assert files._held == {}
    assert files._thread is None


def test_the_mount_table_names_each_devices_file_system(local_fs):
    types = _replaced._file_system_types()
    proc = os.stat("/proc").st_dev
    assert types[(os.major(proc), os.minor(proc))] == "proc"
    here = os.stat(local_fs).st_dev
    assert types[(os.major(here), os.minor(here))] in _replaced._FREE_ON_CLOSE


def test_files_not_worth_holding_are_freed_by_the_rename(local_fs, monkeypatch):
    tmp_path = local_fs
    files = _replaced._ReplacedFiles()
    small = _big_file(tmp_path / "small", (8 << 20) - 4096)
    assert files.hold(tmp_path / "small", small) is None
    linked = _big_file(tmp_path / "linked")
    os.link(tmp_path / "linked", tmp_path / "other-name")
    assert files.hold(tmp_path / "linked", os.stat(tmp_path / "linked")) is None
    assert files.hold(tmp_path / "small", linked) is None  # not the file that was checked
    assert files.hold(tmp_path / "missing", small) is None
    big = _big_file(tmp_path / "big")
    held = files.hold(tmp_path / "big", big)
    assert held is not None
    files.close_later(held)
    files.wait()
    dev = (os.major(big.st_dev), os.minor(big.st_dev))
    # a network file system: holding would leave a visible ".nfs..." file
    monkeypatch.setattr(_replaced, "_file_system_types", lambda: {dev: "nfs4"})
    assert files.hold(tmp_path / "big", big) is None
    assert files._held == {}
    names = _held_names()
    assert not any(str(tmp_path) in name for name in names)


def test_a_forked_child_closes_the_files_its_parent_holds(local_fs):
    """The child gets copies of the held descriptors but not the thread that
    closes them; a held number that now names another file is left alone."""
    tmp_path = local_fs
    _big_file(tmp_path / "old")
    (tmp_path / "other").write_bytes(b"x")
    done = run_python(
        f"""
        import os
        from pathlib import Path
        from interop.io import _replaced
        path = Path({str(tmp_path / "old")!r})
        files = _replaced.replaced_files
        fd = files.hold(path, os.stat(path))  # held, not yet handed to a thread
        other = os.open({str(tmp_path / "other")!r}, os.O_RDONLY)
        files._held[other] = (0, 0)  # a number since reused for another file
        pid = os.fork()
        if pid == 0:
            try:
                os.fstat(fd)
            except OSError:
                os.fstat(other)  # still open
                os._exit(0 if not files._held else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        os.fstat(fd)  # the parent's is still open
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["child", "0"]


def test_a_name_numpy_save_accepts_is_not_made_too_long(tmp_path):
    name = "x" * 251 + ".npy"  # 255 bytes: the longest name the file system takes
    np.save(tmp_path / name, np.arange(3))
    dest = prepare_destination(tmp_path / name)
    assert len(dest.temporary.name) < 40
    _save(dest, b"new")
    assert (tmp_path / name).read_bytes() == b"new"


def test_name_longer_than_the_file_system_allows_is_refused_first(tmp_path):
    with pytest.raises(OSError, match="File name too long") as info:
        prepare_destination(tmp_path / ("y" * 300 + ".npy"))
    assert not isinstance(info.value, PermissionError)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_error_while_writing_keeps_the_old_file_and_leaves_nothing(
    tmp_path, error, temporary_kind
):
    target = tmp_path / "keep.npy"
    target.write_bytes(b"old")
    dest = prepare_destination(target)

    def write_half():
        with dest.open() as f:
            f.write(b"half of the new data")
            raise error("stop")

    with pytest.raises(error):
        write_half()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["keep.npy"]
    dest.discard()  # idempotent
    assert os.listdir(tmp_path) == ["keep.npy"]


def test_an_existing_file_keeps_its_mode_owner_and_group(tmp_path):
    target = tmp_path / "m.npy"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    if os.geteuid() == 0:  # root may give the file away: it must come back so
        os.chown(target, 65534, 65534)
    before = target.stat()
    dest = prepare_destination(target)
    fd = dest.create()
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600  # private while written
        os.write(fd, b"new")
    finally:
        os.close(fd)
    dest.commit()
    after = target.stat()
    assert target.read_bytes() == b"new"
    assert after.st_ino != before.st_ino  # replaced by a rename, not rewritten in place
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert os.listdir(tmp_path) == ["m.npy"]
    dest.discard()  # after a commit: nothing to remove, the file stays
    assert target.read_bytes() == b"new"


def test_a_file_replaced_through_open_keeps_its_mode_owner_and_group(tmp_path, temporary_kind):
    target = tmp_path / "m.npy"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)
    before = target.stat()
    dest = prepare_destination(target)
    with dest.open() as f:
        assert stat.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o600  # private while written
        f.write(b"new")
    after = target.stat()
    assert target.read_bytes() == b"new"
    assert after.st_ino != before.st_ino
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert os.listdir(tmp_path) == ["m.npy"]
    assert dest.temporary is None  # committed


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("weights", "weights.npy"),
        ("weights.npy", "weights.npy"),
        ("weights.bin", "weights.bin"),
        (".hidden", ".hidden.npy"),
    ],
)
def test_npy_suffix_is_added_to_a_name_without_one(tmp_path, given, written):
    dest = prepare_destination(tmp_path / given)
    assert dest.path == tmp_path / written
    assert dest.target == tmp_path / written
    _save(dest, b"data")
    assert os.listdir(tmp_path) == [written]
    if not given.endswith(".bin"):  # numpy.save appends .npy to every other name
        np.save(tmp_path / given, np.arange(2))
        assert os.listdir(tmp_path) == [written]


def test_a_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dest = prepare_destination("rel")
    assert dest.path == type(dest.path)("rel.npy")
    assert dest.target == tmp_path / "rel.npy"
    assert dest.temporary.parent == tmp_path
    _save(dest, b"r")
    assert (tmp_path / "rel.npy").read_bytes() == b"r"


def test_destination_pickles_for_other_processes(tmp_path):
    dest = prepare_destination(tmp_path / "p.npy")
    copy = pickle.loads(pickle.dumps(dest))
    assert (copy.path, copy.target, copy.temporary, copy.streaming) == (
        dest.path,
        dest.target,
        dest.temporary,
        dest.streaming,
    )


def test_create_twice_and_commit_without_create_are_errors(tmp_path):
    dest = prepare_destination(tmp_path / "c.npy")
    with pytest.raises(RuntimeError, match="nothing to commit"):
        dest.commit()
    os.close(dest.create())
    with pytest.raises(RuntimeError, match="already called"):
        dest.create()
    dest.discard()
    assert os.listdir(tmp_path) == []


def test_a_target_that_became_a_directory_is_not_replaced(tmp_path):
    dest = prepare_destination(tmp_path / "late.npy")
    os.close(dest.create())
    (tmp_path / "late.npy").mkdir()
    with pytest.raises(OSError, match="became a directory"):
        dest.commit()
    assert (tmp_path / "late.npy").is_dir()
    assert os.listdir(tmp_path) == ["late.npy"]  # the temporary is gone


# ----------------------------------------------------------------------- symlinks


def test_a_symlink_is_followed_and_its_target_replaced(tmp_path, temporary_kind):
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "real.npy"
    real.write_bytes(b"old")
    os.symlink("data/real.npy", tmp_path / "hop.npy")
    os.symlink("hop.npy", tmp_path / "link.npy")  # a chain of two links
    dest = prepare_destination(tmp_path / "link.npy")
    assert dest.path == tmp_path / "link.npy"
    assert os.path.samefile(dest.target, real)
    assert dest.temporary.parent.samefile(tmp_path / "data")  # beside the target
    _save(dest, b"new")
    assert os.readlink(tmp_path / "link.npy") == "hop.npy"  # the links stay links
    assert os.readlink(tmp_path / "hop.npy") == "data/real.npy"
    assert real.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path / "data")) == ["real.npy"]


def test_a_dangling_symlink_creates_its_target_like_numpy_save(tmp_path):
    (tmp_path / "d").mkdir()
    os.symlink("d/made.npy", tmp_path / "dangling.npy")
    dest = prepare_destination(tmp_path / "dangling.npy")
    _save(dest, b"x")
    assert (tmp_path / "d" / "made.npy").read_bytes() == b"x"
    assert os.path.islink(tmp_path / "dangling.npy")


def test_a_symlink_loop_is_refused_first(tmp_path):
    os.symlink("b.npy", tmp_path / "a.npy")
    os.symlink("a.npy", tmp_path / "b.npy")
    with pytest.raises(OSError, match="symbolic links"):
        prepare_destination(tmp_path / "a.npy")


# ---------------------------------------------------------------- non-regular files


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"  # no suffix: an existing FIFO keeps its name
    os.mkfifo(fifo)
    payload = bytes(range(256)) * 1000
    with reading_fifo(fifo, timeout=10) as received:
        dest = prepare_destination(fifo)
        assert (dest.path, dest.streaming, dest.temporary) == (fifo, True, None)
        _save(dest, payload)
    assert bytes(received) == payload
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["pipe"]


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "d.npy").mkdir()
    with pytest.raises(IsADirectoryError, match=r"expected a file path .*d\.npy.*a directory"):
        prepare_destination(tmp_path / "d.npy")
    with pytest.raises(IsADirectoryError, match="names a directory"):
        prepare_destination(f"{tmp_path}/new/")
    # a directory named without a suffix: numpy.save writes "d.npy" beside it, so do we
    (tmp_path / "plain").mkdir()
    assert prepare_destination(tmp_path / "plain").path == tmp_path / "plain.npy"


def test_a_socket_is_neither_written_nor_replaced(tmp_path):
    path = tmp_path / "s.npy"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(OSError, match="is a socket"):
            prepare_destination(path)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_missing_directory_is_refused_first(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"directory .*nope.* does not exist"):
        prepare_destination(tmp_path / "nope" / "a.npy")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        prepare_destination(tmp_path / "file" / "a.npy")


@pytest.mark.parametrize(("path", "exc"), [(12, TypeError), (None, TypeError), ("", ValueError)])
def test_not_a_path(path, exc):
    with pytest.raises(exc, match="expected"):
        prepare_destination(path)


# -------------------------------------------------------------------- permissions


def test_a_read_only_file_has_the_outcome_numpy_save_has(tmp_path):
    """Root may write a 0444 file (numpy.save overwrites it): then it is replaced and
    stays 0444. Any other user is refused (tested for root too, below)."""
    probe = tmp_path / "probe.npy"
    probe.write_bytes(b"old")
    os.chmod(probe, 0o444)
    try:
        np.save(probe, np.arange(3))
        numpy_refused = False
    except PermissionError:
        numpy_refused = True
    target = tmp_path / "ro.npy"
    target.write_bytes(b"old")
    os.chmod(target, 0o444)
    if numpy_refused:
        with pytest.raises(PermissionError, match="expected a writable file"):
            prepare_destination(target)
        assert target.read_bytes() == b"old"
    else:
        _save(prepare_destination(target), b"new")
        assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o444


_UNPRIVILEGED = """
    import ctypes, os, numpy as np
    import interop.io.destination as d

    if os.geteuid() == 0:  # drop root's bypass of mode bits (CAP_DAC_OVERRIDE, _READ_SEARCH)
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = Header(0x20080522, 0), (Data * 2)()
        assert libc.capget(ctypes.byref(header), data) == 0, ctypes.get_errno()
        data[0].effective &= ~0b110
        data[0].permitted &= ~0b110
        assert libc.capset(ctypes.byref(header), data) == 0, ctypes.get_errno()

    def outcome(call):
        try:
            call()
            return "ok"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"

    base = {base!r}
    print(outcome(lambda: np.save(base + "/ro.npy", np.arange(3))))
    print(outcome(lambda: d.prepare_destination(base + "/ro.npy")))
    print(outcome(lambda: d.prepare_destination(base + "/locked/new.npy")))
    print(outcome(lambda: d.prepare_destination(base + "/locked/mine.npy")))
"""


def test_files_and_directories_this_process_may_not_write_are_refused_first(tmp_path):
    (tmp_path / "ro.npy").write_bytes(b"old")
    os.chmod(tmp_path / "ro.npy", 0o444)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "mine.npy").write_bytes(b"mine")
    os.chmod(locked, 0o555)
    try:
        proc = run_python(_UNPRIVILEGED.replace("{base!r}", repr(str(tmp_path))))
    finally:
        os.chmod(locked, 0o755)
    assert proc.returncode == 0, proc.stderr
    numpy_said, ro, new, mine = proc.stdout.splitlines()
    assert numpy_said.startswith("PermissionError")  # numpy.save refuses the file ...
    assert ro.startswith("PathPermissionError: [Errno 13] save_npy expected a writable file")
    assert "mode -r--r--r--" in ro
    assert "chmod u+w" in ro
    assert new.startswith("PathPermissionError: [Errno 13] save_npy cannot create")
    assert "its directory" in new
    # a writable file in a locked directory: numpy.save would overwrite it in
    # place; it cannot be replaced atomically, so it is refused
    assert mine.startswith("PathPermissionError: [Errno 13] save_npy cannot replace")
    assert (tmp_path / "ro.npy").read_bytes() == b"old"
    assert (locked / "mine.npy").read_bytes() == b"mine"
    assert sorted(os.listdir(locked)) == ["mine.npy"]


# ------------------------------------------------------------ a killed process

_KILLED_MID_SAVE = """
import sys, time
import numpy as np, interop
from interop.io import destination
from interop.testing import EmulatedDevice

path, kind, unnamed = sys.argv[1], sys.argv[2], sys.argv[3] == "unnamed"
destination._UNNAMED_TEMPORARY = unnamed
a = np.arange(1 << 22, dtype=np.float64)  # 32 MiB in 1 MiB chunks
src = EmulatedDevice().asarray(a) if kind == "device" else a

def hold(done, total):
    if done:  # part of the data is in the temporary file: be killed here
        print("writing", flush=True)
        time.sleep(120)

interop.save_npy(src, path, chunk_bytes=1 << 20, progress=hold)
print("not killed", flush=True)
"""


def _kill_mid_save(path, kind: str, temporary_kind: str) -> None:
    import signal
    import subprocess
    import sys

    from tests.helpers import child_env

    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SAVE, str(path), kind, temporary_kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "writing\n", child.communicate(timeout=60)[1]
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_save_killed_mid_write_leaves_nothing_behind(tmp_path, temporary_kind, kind):
    path = tmp_path / "x.npy"
    old = b"the file that was there before"
    path.write_bytes(old)
    _kill_mid_save(path, kind, temporary_kind)
    assert path.read_bytes() == old
    if temporary_kind == "unnamed":
        assert os.listdir(tmp_path) == ["x.npy"]  # the unnamed file died with the process
    else:  # the named temporary of other systems stays, as documented: a hidden .x.npy.*.tmp
        (left,) = sorted(set(os.listdir(tmp_path)) - {"x.npy"})
        assert left.startswith(".x.npy.")
        assert left.endswith(".tmp")
        assert os.path.getsize(tmp_path / left) > 128


def test_a_save_killed_mid_write_on_a_tmpfs_leaves_nothing_behind():
    from tests.helpers.small_fs import run_on_tmpfs

    code = """
        import os, sys
        from tests.io.test_destination import _kill_mid_save
        d = sys.argv[1]
        _kill_mid_save(os.path.join(d, "x.npy"), "host", "unnamed")
        print(sorted(os.listdir(d)))
    """
    proc = run_on_tmpfs(code, "64m")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
