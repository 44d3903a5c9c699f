"""Transfer, the future of a running copy: in-order completion, cancel, errors
held without keeping data alive, and the interpreter's exit with transfers
still running."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import interop
from interop.pipeline.future import Transfer, cancel_running
from interop.pipeline.progress import Progress

from .helpers import child_env


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
