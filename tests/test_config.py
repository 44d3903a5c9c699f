"""interop.config: global settings, with-blocks and environment variables."""

from __future__ import annotations

import threading

import pytest

import interop

from .helpers import run_python


def test_defaults_are_positive_ints():
    values = interop.config.as_dict()
    assert set(values) == {"chunk_bytes", "num_buffers", "host_threads"}
    assert all(isinstance(v, int) and v > 0 for v in values.values())


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
        ({"chunk_bytes": 0}, ValueError, r"chunk_bytes >= 1 \(got 0\)"),
        ({"num_buffers": -2}, ValueError, r"num_buffers >= 1 \(got -2\)"),
        ({"host_threads": 1.5}, TypeError, r"host_threads to be an int \(got 1.5\)"),
        ({"chunk_bytes": True}, TypeError, "got True"),
        ({"chunkbytes": 5}, AttributeError, "chunkbytes"),
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


def test_environment_variables():
    proc = run_python(
        "import interop; print(interop.config.as_dict())",
        env={
            "INTEROP_CHUNK_BYTES": "0x100000",
            "INTEROP_NUM_BUFFERS": "6",
            "INTEROP_HOST_THREADS": "2",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{'chunk_bytes': 1048576, 'num_buffers': 6, 'host_threads': 2}"


def test_bad_environment_variable_says_which():
    proc = run_python("import interop", env={"INTEROP_NUM_BUFFERS": "lots"})
    assert proc.returncode != 0
    assert "expected INTEROP_NUM_BUFFERS to be an integer (got 'lots')" in proc.stderr
