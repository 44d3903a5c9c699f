"""interop.config: global settings, with-blocks and environment variables."""

from __future__ import annotations

import json
import os
import re
import threading

import numpy as np
import pytest

import interop
from interop.config import MIN_CHUNK_BYTES, chunk_bytes_or_default
from tests.helpers import run_python


def test_defaults_are_positive_ints():
    values = interop.config.as_dict()
    assert set(values) == {"chunk_bytes", "num_buffers", "host_threads", "register_min_bytes"}
    assert values.pop("register_min_bytes") == -1  # measured on first use
    assert all(isinstance(v, int) and v > 0 for v in values.values())


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_default_host_threads_are_half_the_cpus_at_least_one():
    # The child may run on 1, then 2, ... of this machine's CPUs; no INTEROP_HOST_THREADS.
    cpus = sorted(os.sched_getaffinity(0))
    for k in sorted({1, 2, 3, len(cpus)} & set(range(1, len(cpus) + 1))):
        proc = run_python(
            f"""
            import os
            os.sched_setaffinity(0, {cpus[:k]!r})
            import interop
            print(interop.config.host_threads)
            """,
            env={"INTEROP_HOST_THREADS": ""},
        )
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout) == max(1, min(8, k // 2)), k


def test_host_copies_use_all_the_cpus_unless_host_threads_was_set():
    """A host-to-host copy has no device copies to leave cores for: by default
    it takes every CPU (at most 8); a host_threads someone set is kept. One
    thread is the calling one: no pool thread is started for it. (The pool is
    the process's and keeps its threads: the one-thread case is measured
    first.)"""
    cpus = sorted(os.sched_getaffinity(0))
    code = """
        import os, threading
        os.sched_setaffinity(0, {cpus!r})
        import numpy as np
        import interop
        from interop.config import host_copy_threads

        def copying_threads():
            seen = set()
            def progress(done, total):
                names = (t.name for t in threading.enumerate())
                seen.update(n for n in names if n.startswith("interop-host"))
            # one 32 MiB chunk (the default chunk_bytes) per thread
            src = np.arange(host_copy_threads() * (8 << 20), dtype=np.float32)
            out = interop.copy_to_host(src, progress=progress)
            assert np.array_equal(out, src)
            return len(seen)

        with interop.config.set(host_threads=1):
            print(host_copy_threads(), copying_threads())
        print(interop.config.host_threads, host_copy_threads(), copying_threads())
        interop.config.host_threads = 1
        print(host_copy_threads())
        """
    for k in sorted({1, 2, len(cpus)} & set(range(1, len(cpus) + 1))):
        proc = run_python(code.format(cpus=cpus[:k]), env={"INTEROP_HOST_THREADS": ""})
        assert proc.returncode == 0, proc.stderr
        every = max(1, min(8, k))
        pool = every if every > 1 else 0  # threads started besides the calling one
        lines = [line.split() for line in proc.stdout.splitlines()]
        assert lines == [
            ["1", "0"],  # a set block
            [str(max(1, min(8, k // 2))), str(every), str(pool)],  # the default again
            ["1"],  # assigned
        ], k
    proc = run_python(
        "from interop.config import host_copy_threads; print(host_copy_threads())",
        env={"INTEROP_HOST_THREADS": "3"},
    )
    assert proc.stdout.split() == ["3"], proc.stderr  # from the environment: kept


def test_set_block_restores_also_on_error_and_nests():
    before = interop.config.as_dict()
    with interop.config.set(chunk_bytes=1024, num_buffers=2):
        assert interop.config.chunk_bytes == 1024
        assert interop.config.num_buffers == 2
        with interop.config.set(chunk_bytes=77):
            assert interop.config.chunk_bytes == 77
            assert interop.config.num_buffers == 2
        assert interop.config.chunk_bytes == 1024
    assert interop.config.as_dict() == before
    with pytest.raises(RuntimeError, match="boom"), interop.config.set(host_threads=9):
        raise RuntimeError("boom")
    assert interop.config.as_dict() == before


def test_blocks_from_several_threads_restore_the_base_in_any_order():
    """A enters, B enters, A leaves, B leaves: B must not 'restore' A's value."""
    before = interop.config.as_dict()
    steps = [threading.Event() for _ in range(3)]
    seen = {}

    def a():
        with interop.config.set(chunk_bytes=111):
            steps[0].set()
            steps[1].wait(10)
        seen["after A left"] = interop.config.chunk_bytes
        steps[2].set()

    def b():
        steps[0].wait(10)
        with interop.config.set(chunk_bytes=222):
            steps[1].set()
            steps[2].wait(10)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after A left": 222}  # B's block is still active
    assert interop.config.as_dict() == before


def test_one_set_object_entered_twice_or_again_is_refused_and_changes_nothing():
    before = interop.config.as_dict()
    block = interop.config.set(chunk_bytes=4096)
    with block:
        with (
            pytest.raises(
                interop.UsageError, match=r"entered twice.*config\.set\(\.\.\.\) each time"
            ),
            block,
        ):  # today: a foreign AttributeError from contextlib
            pass
        assert interop.config.chunk_bytes == 4096  # the first entry still holds
    assert interop.config.as_dict() == before
    with pytest.raises(interop.UsageError, match="entered twice"), block:  # again, after its end
        pass
    assert interop.config.as_dict() == before
    with interop.config.set(chunk_bytes=4096):  # a new set() object each time works
        assert interop.config.chunk_bytes == 4096
    assert interop.config.as_dict() == before


@pytest.mark.parametrize("name", ["chunk_bytes", "num_buffers", "host_threads"])
def test_deleting_a_setting_is_refused_and_changes_nothing(name):
    before = interop.config.as_dict()
    with interop.config.set(**{name: 3}):
        with pytest.raises(
            interop.UsageError, match=f"expected {name} to be assigned, not deleted"
        ):
            delattr(interop.config, name)  # today: a foreign AttributeError
        assert getattr(interop.config, name) == 3
    assert interop.config.as_dict() == before
    with pytest.raises(interop.UnknownSettingError, match="got 'bogus'"):
        del interop.config.bogus


def test_deleting_configs_own_state_is_refused():
    """In a child process: today ``del config._lock`` succeeds and breaks it."""
    proc = run_python(
        """
        import interop
        for name in ("_lock", "_values", "_overlays"):
            try:
                delattr(interop.config, name)
                print(name, "deleted")
            except interop.UnknownSettingError:
                print(name, "refused")
        with interop.config.set(chunk_bytes=4096):
            print(interop.config.chunk_bytes)
        """
    )
    assert proc.stdout.split() == [
        "_lock",
        "refused",
        "_values",
        "refused",
        "_overlays",
        "refused",
        "4096",
    ], proc.stderr


def test_assignment_inside_a_block_lasts_until_it_ends():
    before = interop.config.as_dict()
    with interop.config.set(chunk_bytes=64):
        interop.config.chunk_bytes = 128
        assert interop.config.chunk_bytes == 128
    assert interop.config.as_dict() == before


def test_global_assignment():
    before = interop.config.host_threads
    try:
        interop.config.host_threads = 3
        assert interop.config.host_threads == 3
    finally:
        interop.config.host_threads = before


@pytest.mark.parametrize(
    ("settings", "exc", "pattern"),
    [
        (
            {"chunk_bytes": 0},
            ValueError,
            r"chunk_bytes between 1 and 1073741824 \(1 GiB\) \(got 0\)",
        ),
        ({"chunk_bytes": (1 << 30) + 1}, ValueError, r"between 1 and 1073741824 .*got 1073741825"),
        ({"chunk_bytes": 1 << 40}, ValueError, r"chunk_bytes between .*got 1099511627776"),
        ({"chunk_bytes": 2**63}, ValueError, r"chunk_bytes between .*got 9223372036854775808"),
        ({"num_buffers": -2}, ValueError, r"num_buffers between 1 and 64 \(got -2\)"),
        ({"num_buffers": 65}, ValueError, r"num_buffers between 1 and 64 \(got 65\)"),
        ({"host_threads": 257}, ValueError, r"host_threads between 1 and 256 \(got 257\)"),
        ({"host_threads": 1.5}, TypeError, r"host_threads to be an integer \(got 1.5\)"),
        ({"host_threads": 4.0}, TypeError, r"host_threads to be an integer \(got 4.0\)"),
        ({"num_buffers": "4"}, TypeError, r"num_buffers to be an integer \(got '4'\)"),
        ({"chunk_bytes": True}, TypeError, r"got True, a bool"),
        ({"chunk_bytes": np.True_}, TypeError, r"chunk_bytes to be an integer \(got np.True_\)"),
        ({"chunkbytes": 5}, AttributeError, r"one of \['chunk_bytes', .*\(got 'chunkbytes'\)"),
    ],
)
def test_invalid_values_change_nothing(settings, exc, pattern):
    before = interop.config.as_dict()
    with pytest.raises(exc, match=pattern), interop.config.set(**{"host_threads": 3, **settings}):
        pass
    assert interop.config.as_dict() == before
    name, value = next(iter(settings.items()))
    with pytest.raises(exc, match=pattern):
        setattr(interop.config, name, value)
    assert interop.config.as_dict() == before


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("chunk_bytes", np.int64(1 << 20)),
        ("chunk_bytes", 1 << 30),
        ("num_buffers", np.uint8(64)),
        ("host_threads", np.int32(256)),
        ("host_threads", 1),
    ],
)
def test_any_integral_value_within_bounds_is_accepted_as_int(name, value):
    with interop.config.set(**{name: value}):
        assert getattr(interop.config, name) == int(value)
        assert type(getattr(interop.config, name)) is int
    before = getattr(interop.config, name)
    try:
        setattr(interop.config, name, value)
        assert type(getattr(interop.config, name)) is int
        assert getattr(interop.config, name) == int(value)
    finally:
        setattr(interop.config, name, before)


def test_small_chunks_are_raised_to_the_floor():
    assert MIN_CHUNK_BYTES == 64 << 10
    assert chunk_bytes_or_default(4) == MIN_CHUNK_BYTES
    assert chunk_bytes_or_default(np.int64(MIN_CHUNK_BYTES - 1)) == MIN_CHUNK_BYTES
    assert chunk_bytes_or_default(1 << 20) == 1 << 20
    with interop.config.set(chunk_bytes=64):
        assert interop.config.chunk_bytes == 64  # the setting is kept as given ...
        assert chunk_bytes_or_default(None) == MIN_CHUNK_BYTES  # ... transfers use the floor
    with pytest.raises(ValueError, match="chunk_bytes between 1 and"):
        chunk_bytes_or_default(0)
    with pytest.raises(TypeError, match="chunk_bytes to be an integer"):
        chunk_bytes_or_default(4096.0)


def test_a_transfer_with_tiny_chunks_moves_64_kib_per_chunk():
    a = np.arange(4 << 14, dtype=np.float32)  # 256 KiB
    seen = []
    out = interop.copy_to_host(a, chunk_bytes=4, progress=lambda d, t: seen.append(d))
    np.testing.assert_array_equal(out, a)
    assert seen == [MIN_CHUNK_BYTES * k for k in range(1, 5)]
    with pytest.raises(
        ValueError, match=r"chunk_bytes between 1 and 1073741824 .*got 1099511627776"
    ):
        interop.copy_to_host(a, chunk_bytes=1 << 40)
    np.testing.assert_array_equal(interop.copy_to_host(a, chunk_bytes=np.int64(1 << 16)), a)


def test_environment_variables():
    proc = run_python(
        "import interop; print(interop.config.as_dict())",
        env={
            "INTEROP_CHUNK_BYTES": "0x100000",
            "INTEROP_NUM_BUFFERS": "6",
            "INTEROP_HOST_THREADS": "2",
            "INTEROP_REGISTER_MIN_BYTES": "0x8000000",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "{'chunk_bytes': 1048576, 'num_buffers': 6, 'host_threads': 2, "
        "'register_min_bytes': 134217728}"
    )


def test_bad_environment_variable_says_which():
    proc = run_python("import interop", env={"INTEROP_NUM_BUFFERS": "lots"})
    assert proc.returncode != 0
    assert "expected INTEROP_NUM_BUFFERS to be an integer (got 'lots')" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "raw", "pattern"),
    [
        ("INTEROP_CHUNK_BYTES", "99999999999999999999999", r"INTEROP_CHUNK_BYTES between 1 and "),
        ("INTEROP_CHUNK_BYTES", "0", r"INTEROP_CHUNK_BYTES between 1 and 1073741824 \(1 GiB\)"),
        ("INTEROP_NUM_BUFFERS", "1000", r"INTEROP_NUM_BUFFERS between 1 and 64 \(got 1000\)"),
        ("INTEROP_HOST_THREADS", "-1", r"INTEROP_HOST_THREADS between 1 and 256 \(got -1\)"),
        ("INTEROP_REGISTER_MIN_BYTES", "-2", r"INTEROP_REGISTER_MIN_BYTES between -1 and "),
    ],
)
def test_an_absurd_environment_variable_is_refused_at_import(variable, raw, pattern):
    proc = run_python("import interop", env={variable: raw})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("interop.errors.InvalidValueError: expected")  # a ValueError
    assert re.search(pattern, last), last
    assert last.endswith("unset it or fix it")


_FORK = """
    import json, os, signal, threading
    import interop
    config = interop.config
    base = config.as_dict()
    inside, held, release = threading.Event(), threading.Event(), threading.Event()

    def in_a_block():  # another thread inside a with config.set block
        with config.set(chunk_bytes=12345, num_buffers=7):
            inside.set()
            release.wait(60)

    def holding_the_lock():  # another thread holding config's lock
        with config._lock:
            held.set()
            release.wait(60)

    threads = [threading.Thread(target=in_a_block), threading.Thread(target=holding_the_lock)]
    read, write = os.pipe()
    with config.set(host_threads=3):  # the forking thread's own block
        threads[0].start()
        inside.wait(10)
        threads[1].start()
        held.wait(10)
        seen = {"parent before": config.as_dict()}
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang in the child ends it instead of leaking it
            seen["child, own block"] = config.as_dict()
            with config.set(chunk_bytes=4096):
                seen["child, new block"] = config.as_dict()
            config.num_buffers = 5
            seen["child, assigned"] = config.as_dict()
        else:
            os.close(write)
            release.set()
    if pid == 0:
        seen["child, after its blocks"] = config.as_dict()
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    for t in threads:
        t.join(10)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = json.loads(f.read() or "{}")
    print(json.dumps({"base": base, "status": status, "child": child,
                      "parent after": config.as_dict()}))
"""


def test_fork_while_another_thread_holds_the_lock_or_is_in_a_block():
    proc = run_python(_FORK, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    base = report["base"]
    assert report["status"] == 0  # the child neither hung (SIGALRM) nor failed
    child = report["child"]
    assert child["parent before"] == {
        **base,
        "chunk_bytes": 12345,
        "num_buffers": 7,
        "host_threads": 3,
    }
    # the other thread's block is gone in the child; the forking thread's own stays
    assert child["child, own block"] == {**base, "host_threads": 3}
    assert child["child, new block"] == {**base, "host_threads": 3, "chunk_bytes": 4096}
    assert child["child, assigned"] == {**base, "host_threads": 3, "num_buffers": 5}
    assert child["child, after its blocks"] == {**base, "num_buffers": 5}
    assert report["parent after"] == base  # the parent is unaffected
