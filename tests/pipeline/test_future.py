"""Transfer, the future of a running copy: in-order completion, cancel, errors
held without keeping data alive, and the interpreter's exit with transfers
still running."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import interop
from interop.pipeline.future import Transfer, cancel_running
from interop.pipeline.progress import Progress
from tests.helpers import child_env, run_python


def test_chunks_complete_out_of_order_count_in_order():
    seen = []
    t = Transfer(None, [10, 20, 30], Progress(lambda d, n: seen.append(d), 60, "x"), func="x")
    t.chunk_done(1)
    assert t.bytes_done == 0
    t.chunk_done(0)
    assert t.bytes_done == 30
    t.chunk_done(2)
    assert seen == [30, 60]


def test_cancel_running_stops_and_joins_every_transfer():
    gate = threading.Event()
    a = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: 128 chunks of 64 KiB
    transfers = [
        interop.copy_to_host_async(a, chunk_bytes=1 << 16, progress=lambda d, t: gate.wait(0.01))
        for _ in range(3)
    ]
    cancel_running()
    assert all(t.done() for t in transfers)
    for t in transfers:
        with pytest.raises(interop.TransferError, match="cancelled"):
            t.result()
    gate.set()


EXIT_SCRIPT = """
    import sys, time, threading
    import numpy as np, torch, interop
    slow = lambda done, total: time.sleep(0.002)
    sources = [torch.arange(1 << 21, dtype=torch.float64) for _ in range(4)]
    transfers = [
        interop.copy_to_host_async(s.conj() if i % 2 else s, chunk_bytes=1 << 16, progress=slow)
        for i, s in enumerate(sources)
    ]
    time.sleep(0.05)
    sys.exit(0)  # transfers still running: they are cancelled and joined at exit
"""


def test_exit_with_transfers_in_flight_is_clean_every_time():
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert [code for code, _ in results] == [0] * 8, [err for _, err in results]
    assert all("terminate called" not in err for _, err in results)


# ----------------------------------------------------------------- misuse


def test_result_called_by_the_transfers_own_progress_callback_is_refused():
    """It would wait for the thread it runs on: refused at once, and the
    transfer ends with that error (the callback's own, raised as itself)."""
    holder: dict[str, Transfer] = {}
    given = threading.Event()
    seen: list[BaseException] = []

    def progress(done, total):
        given.wait(30)
        try:
            holder["t"].result(timeout=5)  # today: waits for itself, 5 s
        except BaseException as exc:
            seen.append(exc)
            raise

    a = np.arange(3 << 13, dtype=np.float64)  # 3 chunks of 64 KiB
    out = np.zeros_like(a)
    holder["t"] = t = interop.copy_to_host_async(a, out, chunk_bytes=1 << 16, progress=progress)
    given.set()
    with pytest.raises(interop.UsageError, match="its own progress callback") as info:
        t.result(timeout=30)
    assert seen == [info.value]  # raised in the callback at its first call
    assert isinstance(info.value, RuntimeError)
    assert "would wait for itself" in str(info.value)
    assert t.done()
    # the chunk complete before the callback ran is there; nothing else was lost
    assert out[: 1 << 13].tolist() == a[: 1 << 13].tolist()


@pytest.mark.parametrize(
    ("timeout", "error", "match"),
    [
        (
            "x",
            interop.InvalidTypeError,
            r"expected timeout to be None or a number of seconds \(got 'x'\)",
        ),
        (True, interop.InvalidTypeError, r"\(got True\)"),
        (
            float("nan"),
            interop.InvalidValueError,
            r"expected timeout to be a number of seconds \(got nan\)",
        ),
    ],
)
def test_a_bad_timeout_is_refused_before_waiting(timeout, error, match):
    gate = threading.Event()
    a = np.arange(1 << 14, dtype=np.float64)
    out = np.zeros_like(a)
    t = interop.copy_to_host_async(a, out, chunk_bytes=1 << 16, progress=lambda d, n: gate.wait(30))
    try:
        with pytest.raises(error, match=match):
            t.result(timeout=timeout)  # today: "x" a foreign TypeError, nan no wait at all
        assert not t.done()  # the transfer goes on, untouched
    finally:
        gate.set()
    assert t.result(timeout=30) is out
    assert out.tolist() == a.tolist()


def test_an_infinite_or_huge_timeout_waits_as_none_does():
    gate = threading.Event()
    a = np.arange(1 << 14, dtype=np.float64)
    for timeout in (float("inf"), 1e300):
        t = interop.copy_to_host_async(
            a, chunk_bytes=1 << 16, progress=lambda d, n: gate.wait(0.05)
        )
        assert t.result(timeout=timeout).tolist() == a.tolist()  # today: OverflowError
    # a negative timeout is an immediate check, as threading's
    gate.clear()
    t = interop.copy_to_host_async(a, chunk_bytes=1 << 16, progress=lambda d, n: gate.wait(30))
    with pytest.raises(interop.TransferTimeoutError):
        t.result(timeout=-1)
    gate.set()
    t.result(timeout=30)


def test_cancel_true_means_result_raises_even_at_the_last_chunk():
    """``cancel()`` from the callback of the last chunk (every byte copied, no
    chunk left to skip): True, so result() raises, as documented."""
    holder: dict[str, Transfer] = {}
    given = threading.Event()
    answers: list[bool] = []

    def progress(done, total):
        if done == total:
            given.wait(30)
            answers.append(holder["t"].cancel())

    a = np.arange(1 << 14, dtype=np.float64)
    holder["t"] = t = interop.copy_to_host_async(a, chunk_bytes=1 << 16, progress=progress)
    given.set()
    with pytest.raises(interop.TransferError, match="cancelled") as info:
        t.result(timeout=30)  # today: returned the array
    assert answers == [True]
    assert info.value.bytes_done == info.value.nbytes == a.nbytes
    assert repr(t).endswith("bytes, cancelled>")
    assert t.cancel() is False  # finished: too late


def test_cancel_races_the_end_true_always_means_result_raises():
    """However the cancel meets the transfer's end, True means result() raises
    the cancellation, and False means it had finished (result() returns)."""
    a = np.arange(1 << 13, dtype=np.float64)  # one chunk
    answers = {True: 0, False: 0}
    for _ in range(300):
        t = interop.copy_to_host_async(a, chunk_bytes=1 << 16)
        cancelled = t.cancel()
        answers[cancelled] += 1
        if cancelled:
            with pytest.raises(interop.TransferError, match="cancelled"):
                t.result(timeout=30)
        else:
            assert t.result(timeout=30).tolist() == a.tolist()
    assert answers[True] > 0  # the race was met at least once each way on most machines


_FORK_MID_TRANSFER = """
    import json, os, signal, threading
    import numpy as np, interop

    gate, started = threading.Event(), threading.Event()

    def progress(done, total):  # holds the transfer after its first chunk
        started.set()
        gate.wait(60)

    a = np.arange(3 << 13, dtype=np.float64)  # 3 chunks of 64 KiB
    out = np.zeros_like(a)
    t = interop.copy_to_host_async(a, out, chunk_bytes=1 << 16, progress=progress)
    started.wait(30)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(15)  # a hang in the child ends it instead of leaking it
        seen = {"done": t.done(), "cancel": t.cancel(), "repr": repr(t)}
        try:
            t.result()  # today: waits forever for a thread this process does not have
            seen["result"] = "returned"
        except interop.InteropError as exc:
            seen["result"] = [type(exc).__name__, str(exc), exc.bytes_done, exc.nbytes]
            n = exc.bytes_done // 8
            seen["prefix intact"] = out[:n].tolist() == a[:n].tolist()
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    gate.set()
    parent = t.result(timeout=30) is out and out.tolist() == a.tolist()
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = json.loads(f.read() or "{}")
    print(json.dumps({"status": status, "child": child, "parent": parent, "pid": os.getpid()}))
"""


def test_result_in_a_child_forked_while_the_transfer_ran_is_refused_at_once():
    """The transfer's thread exists in the parent only: in a forked child the
    transfer never finishes, so result() says so at once instead of waiting
    forever; the parent's transfer is unaffected."""
    proc = run_python(_FORK_MID_TRANSFER, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == 0, report  # the child neither hung (SIGALRM) nor failed
    assert report["parent"] is True
    child = report["child"]
    assert child["done"] is True  # over, as far as the child can tell
    assert child["cancel"] is False  # nothing to stop in the child
    assert child["repr"].endswith(
        f"{1 << 16} of {3 << 16} bytes, running in process {report['pid']}>"
    )
    name, message, done, nbytes = child["result"]
    assert name == "TransferError"
    assert "forked" in message
    assert "call result() in the process that started it" in message
    assert (done, nbytes) == (1 << 16, 3 << 16)  # the chunk reported before the fork
    assert f"bytes [0, {done}) of {nbytes}" in message
    assert child["prefix intact"] is True
