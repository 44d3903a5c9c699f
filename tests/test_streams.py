"""interop.stream and the stream helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import interop
from interop.streams import resolve_stream, same_stream
from tests.helpers import run_python


class Protocol:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


def test_resolve_raw_handles_and_protocol_objects():
    assert resolve_stream(0) == (0, None)
    assert resolve_stream(0x7F00) == (0x7F00, None)
    assert resolve_stream(Protocol((0, 1234))) == (1234, None)


def test_the_legacy_default_stream_has_two_handles():
    assert same_stream(0, 1)
    assert same_stream(1, 0)
    assert same_stream(0x7F00, 0x7F00)
    assert not same_stream(0, 2)  # the per-thread default stream is another one
    assert not same_stream(1, 0x7F00)


@pytest.mark.parametrize("bad", ["s", None, 1.5, True, [1], object()])
def test_non_streams_are_type_errors(bad):
    with pytest.raises(TypeError, match=r"expected a torch.cuda.Stream, .* \(got "):
        resolve_stream(bad)
    with pytest.raises(TypeError, match=r"expected a torch\.cuda\.Stream"), interop.stream(bad):
        pass


@pytest.mark.parametrize("value", [(0,), "x", (0, "1"), (0, 1.0), None])
def test_bad_protocol_values(value):
    with pytest.raises(TypeError, match=r"__cuda_stream__\(\) to return \(version, handle\)"):
        resolve_stream(Protocol(value))


def test_negative_handle():
    with pytest.raises(ValueError, match=r"handle >= 0 \(got -1\)"):
        resolve_stream(-1)


def test_without_a_device(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    entered = False
    with pytest.raises(interop.NoDeviceError, match="expected a CUDA device"), interop.stream(0):
        entered = True
    assert not entered


def _cupy_external_streams(tree: ast.AST) -> list[tuple[int, ast.AST | None]]:
    """``(line, innermost enclosing function)`` of each ``<cp or cupy>.cuda.ExternalStream``."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        cuda = getattr(node, "value", None)
        if not (
            isinstance(node, ast.Attribute)
            and node.attr == "ExternalStream"
            and isinstance(cuda, ast.Attribute)
            and cuda.attr == "cuda"
            and getattr(cuda.value, "id", getattr(cuda.value, "attr", None)) in ("cp", "cupy")
        ):
            continue
        scope = parents.get(node)
        while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope = parents.get(scope)
        found.append((node.lineno, scope))
    return found


def test_no_code_path_calls_cupys_deprecated_external_stream():
    """CuPy 14 deprecates ``cupy.cuda.ExternalStream`` (it warns, an error under
    ``filterwarnings = error``): a raw handle becomes a CuPy stream through
    ``interop.streams.cupy_stream`` (``Stream.from_external``). The old class is
    left only as the fallback of a function that asks for ``from_external`` first
    (a CuPy before 14)."""
    root = Path(__file__).resolve().parents[1]
    dirs = ("interop", "tests", "benchmarks", "examples")
    files = [p for d in dirs for p in (root / d).rglob("*.py")]
    assert any(p.name == "devices.py" for p in files)
    calls = []
    for path in files:
        for line, scope in _cupy_external_streams(ast.parse(path.read_text(), str(path))):
            if scope is None or "from_external" not in ast.unparse(scope):
                calls.append(f"{path.relative_to(root)}:{line}")
    assert calls == []


def test_without_cupy():
    proc = run_python(
        """
        import sys
        sys.modules["cupy"] = None
        import interop
        try:
            with interop.stream(0):
                pass
        except interop.BackendUnavailableError as exc:
            print("unavailable:", exc)
        except interop.NoDeviceError as exc:
            print("no device:", exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    # torch is checked first: without a CUDA torch build this is NoDeviceError
    assert proc.stdout.startswith(("unavailable: this call needs cupy", "no device:"))


# ----------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["torch", "cupy", "protocol", "int"])
def test_both_libraries_use_the_stream_and_restore(cp, torch, kind):
    ts = torch.cuda.Stream()
    handle = ts.cuda_stream
    s = {
        "torch": ts,
        "cupy": cp.cuda.Stream.from_external(ts)
        if hasattr(cp.cuda.Stream, "from_external")
        else cp.cuda.ExternalStream(handle),
        "protocol": Protocol((0, handle)),
        "int": handle,
    }[kind]
    before_t = torch.cuda.current_stream().cuda_stream
    before_c = cp.cuda.get_current_stream().ptr
    with interop.stream(s) as got:
        assert got is s
        assert torch.cuda.current_stream().cuda_stream == handle
        assert cp.cuda.get_current_stream().ptr == handle
    assert torch.cuda.current_stream().cuda_stream == before_t
    assert cp.cuda.get_current_stream().ptr == before_c


@pytest.mark.gpu
def test_legacy_stream_handle_one_is_the_default_stream(cp, torch):
    """1 (cudaStreamLegacy, what DLPack and cuda.core call the legacy default
    stream) is PyTorch's default stream; PyTorch refuses 1 as an external stream."""
    with interop.stream(1):
        assert torch.cuda.current_stream().cuda_stream == 0
        assert cp.cuda.get_current_stream().ptr == 1
        x = torch.ones(1 << 10, device="cuda")
        assert float(interop.to_cupy(x).sum()) == 1024.0
        with interop.use_torch_allocator():  # the same stream to the pool
            assert float(cp.ones(16, dtype=cp.float32).sum()) == 16.0


@pytest.mark.gpu
def test_restored_after_exceptions_and_nesting(cp, torch):
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    before = (torch.cuda.current_stream().cuda_stream, cp.cuda.get_current_stream().ptr)
    seen = []

    def fail_inside():
        with interop.stream(a), interop.stream(b):
            seen.append(cp.cuda.get_current_stream().ptr)
            raise RuntimeError("inner")

    with pytest.raises(RuntimeError, match="inner"):
        fail_inside()
    assert seen == [b.cuda_stream]
    assert (torch.cuda.current_stream().cuda_stream, cp.cuda.get_current_stream().ptr) == before
    with interop.stream(a):
        with interop.stream(b):
            pass
        assert torch.cuda.current_stream().cuda_stream == a.cuda_stream
        assert cp.cuda.get_current_stream().ptr == a.cuda_stream
    assert (torch.cuda.current_stream().cuda_stream, cp.cuda.get_current_stream().ptr) == before


@pytest.mark.gpu
def test_side_stream_work_consumed_by_cupy_without_sync(cp, torch):
    float(cp.zeros(1 << 20, dtype=cp.float32).sum())  # compile the sum before the sleep
    side = torch.cuda.Stream()
    with interop.stream(side):
        x = torch.zeros(1 << 20, device="cuda")
        torch.cuda._sleep(200_000_000)
        x.fill_(4.0)
        c = interop.to_cupy(x)
        total = c.sum()  # CuPy kernel on the same stream, after torch's
        assert not side.query()
    side.synchronize()
    assert float(total) == 4.0 * (1 << 20)


@pytest.mark.gpu
def test_explicit_device_zero(cp, torch):
    s = torch.cuda.Stream(device=0)
    with cp.cuda.Device(0), interop.stream(s):
        assert cp.cuda.runtime.getDevice() == 0
        assert torch.cuda.current_device() == 0


@pytest.mark.multigpu
def test_stream_of_device_one_makes_device_one_current(cp, torch):
    s = torch.cuda.Stream(device=1)
    with interop.stream(s):
        assert cp.cuda.runtime.getDevice() == 1
        assert torch.cuda.current_device() == 1
        assert cp.cuda.get_current_stream().ptr == s.cuda_stream
    assert cp.cuda.runtime.getDevice() == 0


@pytest.mark.parametrize(("ptds", "expect"), [("0", "1 1234"), ("1", "2 1234")])
def test_cupy_names_its_null_stream_to_producers_as_its_default_stream(ptds, expect):
    """What CuPy's from_dlpack passes as ``stream`` for its null stream: the legacy
    default stream (1), or the per-thread one (2) that PyTorch refuses."""
    proc = run_python(
        """
        import types, cupy, interop.streams as s
        print(s.cupy_consumer_handle(cupy.cuda.Stream.null),
              s.cupy_consumer_handle(types.SimpleNamespace(ptr=1234)))
        """,
        env={"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": ptds},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expect
