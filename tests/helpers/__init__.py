"""Helpers shared by the tests (not fixtures)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_head() -> str | None:
    """The commit of the checkout the tests run in; None in a copy without git (a runner's)."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


# dtype names PyTorch and NumPy share (SPEC 1.1: every int, bool, float, complex)
STANDARD = [
    "bool",
    *(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)),
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
# ... plus the ones NumPy only has through ml_dtypes
ML = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
ALL_NAMES = STANDARD + ML
NUMPY_DTYPES = [
    np.dtype(n) if n in STANDARD else np.dtype(getattr(ml_dtypes, n)) for n in ALL_NAMES
]


class Producer:
    """A minimal foreign DLPack producer wrapping a NumPy array or a tensor."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


class _Holder(dict):
    """A dict that says when something was put in it."""

    def __init__(self) -> None:
        super().__init__()
        self.given = threading.Event()

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.given.set()


def cancel_on_progress():
    """``(holder, progress)``: a progress callback that cancels the transfer
    put in ``holder["t"]`` at its first call, which waits (up to 30 s) until
    the transfer was put there: however fast the device, the cancel comes
    after the first chunk and before the last."""
    holder = _Holder()

    def progress(done, total):
        holder.given.wait(30)
        holder["t"].cancel()

    return holder, progress


@contextlib.contextmanager
def pinned(device, shape, dtype, order="C"):
    """A NumPy array in an emulated device's page-locked memory, freed after the block."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    ptr, buf = device.host_alloc(max(n, 1))
    try:
        buf[:] = 0
        yield buf[:n].view(dtype).reshape(shape, order=order)
    finally:
        device.host_free(ptr)


def staged(device):
    """How many host-thread slot accesses (drains and fills) ran so far."""
    return device.counts["drain"] + device.counts["fill"]


def sample(shape, dtype, seed=0):
    """Deterministic test data of any dtype above (values exact in every dtype)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.uniform(-4, 4, shape).astype(dtype)


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``code`` in a fresh interpreter; return the CompletedProcess.

    Used for anything that could abort the interpreter (a C++ terminate in a
    library) and for import-time checks.
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(env),
        check=False,
    )


#: Environment that hides every CUDA device from a child process, on any machine.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``env``, for a child Python that imports interop.

    The repository comes first on PYTHONPATH, as an absolute path, and whatever PYTHONPATH
    already holds after it (a GPU runner finds its carried packages there). A relative entry
    such as the runner's ``PYTHONPATH=.`` would name the child's working directory instead.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")])
    )
    return full_env


def transfer_threads() -> int:
    """Threads alive, not counting the workers of interop's process-wide host pool,
    which the first transfer that needs them starts and which stay for the process:
    what a finished transfer must leave as it found."""
    return sum(not t.name.startswith("interop-host") for t in threading.enumerate())


def in_threads(work: Callable[[int], Any], n: int) -> list[Any]:
    """``work(i)`` for ``i`` in ``range(n)``, each in a thread of its own, all at
    once; their results in order, or the first error raised in any of them."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(work, range(n)))


@contextlib.contextmanager
def reading_fifo(fifo: os.PathLike[str] | str, timeout: float = 30) -> Iterator[bytearray]:
    """Read everything written to the FIFO ``fifo`` on a thread while the block runs.

    Yields the bytearray the reader fills; complete once the block has ended
    (the reader is joined). If the writer never opens the FIFO, the reader is
    unblocked so that no thread is left waiting.
    """
    received = bytearray()

    def read() -> None:
        with open(fifo, "rb") as f:
            while block := f.read(1 << 16):
                received.extend(block)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield received
        reader.join(timeout)
    finally:
        if reader.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(10)


def hold(stream, timeout: float = 10) -> threading.Event:
    """Block an emulated device's ``stream`` at this point of its queue until
    the returned event is set (or ``timeout`` seconds passed): work queued
    after it on that stream stays queued, not run."""
    gate = threading.Event()
    stream.enqueue("op", lambda: gate.wait(timeout))
    return gate


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    """``a`` and ``b`` have one dtype, one shape and the same bytes in C order."""
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # C order whatever the strides


def inverted_bytes(a: np.ndarray) -> bytes:
    """``a``'s bytes in C order, each XOR 0xFF: the values of an emulated
    device's lazily inverted view of ``a``."""
    return (np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8) ^ 0xFF).tobytes()


def self_overlapping_outs(torch):
    """Writable outs of shape (3, 4) float64 whose elements share memory, over
    the 4 or 6 float64 of ``base`` (zeros): a stride of 0, rows 2 elements apart."""
    strided = np.lib.stride_tricks.as_strided
    row, rows = np.zeros(4), np.zeros(6)
    t = torch.zeros(4, dtype=torch.float64)
    return [
        (row, strided(row, (3, 4), (0, 8))),
        (rows, strided(rows, (3, 4), (16, 8))),
        (t, t.expand(3, 4).numpy()),
    ]
