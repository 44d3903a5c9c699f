"""A process forked after CUDA was initialised in its parent cannot use CUDA:
interop says so, with what to do, on the first call that needs CUDA.

Forking happens in a subprocess (never in pytest's own process, whose threads
the child would inherit).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import pytest

import interop
from tests.helpers import child_env, run_python

# One interpreter forks twice: before interop has initialised CUDA ("early"),
# and after ("late", with a grandchild). Without a GPU here interop never
# initialises CUDA itself, so the script records it as interop does where it
# first finds a usable device. Each process reports what the calls that need
# CUDA raise.
_SCRIPT = """
import os, sys, numpy as np, torch, interop
from interop import _backends

CALLS = {
    "to_cupy": lambda: interop.to_cupy(np.arange(3)),
    "copy_to_device": lambda: interop.copy_to_device(np.arange(3)),
    "to_torch(device='cuda')": lambda: interop.to_torch(np.arange(3), device="cuda"),
    "stream": lambda: interop.stream(0).__enter__(),
    "use_torch_allocator": lambda: interop.use_torch_allocator().__enter__(),
}

def report(who):
    for name, call in CALLS.items():
        try:
            call()
            print(who, "|", name, "|", "ok")
        except interop.InteropError as exc:
            runtime = isinstance(exc, RuntimeError)
            print(who, "|", name, "|", type(exc).__name__, runtime, "|", exc)
    sys.stdout.flush()

def fork(who, grandchild=False):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        report(who)
        if grandchild:
            fork("grandchild")
        os._exit(0)
    os.waitpid(pid, 0)

fork("early")
_backends.note_cuda_initialised()
fork("late", grandchild=True)
report("parent")
"""


@functools.cache
def _reports() -> dict[str, dict[str, tuple[str, str]]]:
    proc = run_python(_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for line in proc.stdout.splitlines():
        who, name, kind, *message = line.split(" | ")
        out.setdefault(who, {})[name] = (kind, " | ".join(message))
    return out


def test_a_child_forked_after_cuda_was_initialised_gets_a_clear_error():
    for who in ("late", "grandchild"):
        calls = _reports()[who]
        assert len(calls) == 5
        for name, (kind, message) in calls.items():
            assert kind == "CudaAfterForkError True", (who, name)
            assert "CUDA cannot be used after fork" in message
            assert "multiprocessing's 'spawn' start method" in message
            assert "multiprocessing.get_context('spawn')" in message
            assert "forked after CUDA was initialised in process " in message


def test_forking_before_cuda_is_used_is_harmless_and_the_parent_unaffected():
    reports = _reports()
    # the early child answers exactly as the parent does (here: no device)
    assert reports["early"] == reports["parent"]
    assert len(reports["parent"]) == 5
    assert all(kind != "CudaAfterForkError True" for kind, _ in reports["parent"].values())


def test_pytorchs_own_bad_fork_flag_counts_too():
    # CUDA initialised by the user through PyTorch, outside interop.
    proc = run_python(
        """
        import numpy as np, torch, interop
        torch.cuda._is_in_bad_fork = lambda: True  # what PyTorch reports in such a child
        try:
            interop.to_cupy(np.arange(3))
        except interop.CudaAfterForkError as exc:
            print("refused:", "forked after CUDA was initialised in its parent" in str(exc))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused: True"


_CUPY_ONLY_SCRIPT = """
import os, sys, numpy as np, interop
from interop import _backends
import cupy
from cupy.cuda import driver

def attempt():
    try:
        interop.to_cupy(np.arange(3))
        return "ok"
    except interop.InteropError as exc:
        return type(exc).__name__

def fork():
    sys.stdout.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, f"{attempt()} {'torch' in sys.modules}".encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    return os.read(r, 200).decode()

print("probe", _backends.cuda_driver_initialised())  # nothing initialised CUDA here yet
print("early", fork())
print("recorded", _backends._cuda_initialised_in)
# What CuPy's driver bindings answer once something (CuPy itself, here) ran cuInit:
# cuCtxGetCurrent no longer fails with CUDA_ERROR_NOT_INITIALIZED.
driver.ctxGetCurrent = lambda: 0
print("probe", _backends.cuda_driver_initialised())
print("late", fork())
print("parent", _backends._cuda_initialised_in == os.getpid(), attempt())
"""


def test_cuda_initialised_by_cupy_alone_is_seen_at_the_fork():
    """A parent that used the GPU through CuPy only (no torch, no interop call):
    interop asks the driver just before the fork and records the parent, so the
    child gets CudaAfterForkError instead of a misleading "no device"."""
    if interop._backends.cupy_device_count() > 0:
        pytest.skip("a CUDA device is visible: the probe would be real (see the gpu test)")
    proc = run_python(_CUPY_ONLY_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert lines == [
        ["probe", "False"],
        ["early", "NoDeviceError", "False"],  # no device here; and no torch was imported
        ["recorded", "None"],
        ["probe", "True"],
        ["late", "CudaAfterForkError", "False"],
        ["parent", "True", "NoDeviceError"],  # the parent itself is not refused
    ]


def test_the_driver_probe_initialises_nothing_and_imports_nothing():
    proc = run_python(
        """
        import sys
        from interop import _backends
        print(_backends.cuda_driver_initialised(), "cupy" in sys.modules, "torch" in sys.modules)
        import os
        pid = os.fork()  # the hook runs: it must not import CuPy either
        if pid == 0:
            print("child", "cupy" in sys.modules, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print(_backends._cuda_initialised_in)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "False", "child", "False", "None"]


_GPU_SCRIPT = """
import multiprocessing, os, sys
import numpy as np, interop


def work(n):
    return int(interop.to_numpy(interop.to_cupy(np.arange(n))).sum())


if __name__ == "__main__":
    assert work(4) == 6  # CUDA initialised here, through interop
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            interop.to_cupy(np.arange(3))
            code = 1
        except interop.CudaAfterForkError:
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("fork", os.waitstatus_to_exitcode(status))
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # what the message advises
        print("spawn", pool.apply(work, (5,)))
"""


@pytest.mark.gpu
def test_gpu_a_forked_child_is_refused_and_spawn_works(tmp_path):
    script = tmp_path / "fork_then_spawn.py"  # a file: spawn imports the main module
    script.write_text(textwrap.dedent(_GPU_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fork", "0", "spawn", "10"]


_GPU_CUPY_ONLY_SCRIPT = """
import os, sys
import numpy as np
import cupy as cp

x = cp.arange(10, dtype=cp.float32)
assert float(x.sum()) == 45.0  # CUDA initialised by CuPy, before interop is even imported
import interop
from interop import _backends

assert _backends._cuda_initialised_in is None  # interop itself initialised nothing
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    results = []
    for call in (lambda: interop.to_cupy(np.arange(3)), lambda: interop.copy_to_host(x)):
        try:
            call()
            results.append("ok")
        except interop.CudaAfterForkError:
            results.append("refused")
        except Exception as exc:
            results.append(type(exc).__name__)
    print("child", *results, "torch" in sys.modules, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", _backends._cuda_initialised_in == os.getpid(), interop.copy_to_host(x).sum())
"""


@pytest.mark.gpu
def test_gpu_a_child_forked_after_cupy_alone_used_cuda_is_refused():
    proc = run_python(_GPU_CUPY_ONLY_SCRIPT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "refused", "refused", "False", "parent", "True", "45.0"]


# Page-locked buffers made before a fork: the child inherits the parent's pages, not the
# right to free them (CUDA fails every call there). One dropped in the child, one kept to
# its exit (weakref.finalize's atexit); the parent's values stay.
_PINNED_SCRIPT = """
import gc, os, sys
import numpy as np
import interop

if {kind!r} == "emulated":
    from interop.pinned import pinned_array
    from interop.testing import EmulatedDevice

    device = EmulatedDevice()
    empty = lambda n: pinned_array(device, (n,), np.dtype(np.float32))
else:
    empty = lambda n: interop.empty_pinned(n, np.float32)  # initialises CUDA here
kept, dropped = empty(1024), empty(1024)
kept[:], dropped[:] = 1, 2
sys.stdout.flush()
sys.stderr.flush()
pid = os.fork()
if pid == 0:
    del dropped
    gc.collect()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
print("parent", float(kept.sum() + dropped.sum()))
"""


@pytest.mark.parametrize("kind", ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_forked_child_leaves_the_parents_pinned_buffers_alone_silently(kind):
    proc = run_python(_PINNED_SCRIPT.format(kind=kind), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "0", "parent", "3072.0"]
    assert proc.stderr == ""  # no "Exception ignored in: <finalize object ...>"
