"""interop._process: one owner of the process-wide state, and the one fork handler
that resets it, step by step, in a stated order."""

from __future__ import annotations

import json
import pathlib

import interop
from tests.helpers import run_python

ROOT = pathlib.Path(interop.__file__).parent


def test_one_module_registers_the_fork_handler():
    registering = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if "register_at_fork" in path.read_text()
    )
    assert registering == ["_process.py"]


_STEPS = """
    import json, os
    import interop
    from interop import _process

    ran = []
    for step in _process.ORDER:  # a reset of the test's own after each registered one
        _process.at_fork(step, lambda step=step: ran.append(step))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(ran).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = json.loads(f.read() or "null")
    registered = {step: len(resets) - 1 for step, resets in _process._resets.items()}
    print(json.dumps({"order": list(_process.ORDER), "child": child, "parent": ran,
                      "registered": registered}))
"""


def test_a_forked_child_runs_every_step_once_in_order():
    proc = run_python(_STEPS, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["child"] == report["order"]
    assert report["parent"] == []  # the parent resets nothing
    # each step is some module's: importing interop registers a reset for every one
    assert all(n >= 1 for n in report["registered"].values()), report["registered"]
