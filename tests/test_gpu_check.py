"""``scripts/gpu-check``: runs its steps in order, keeps going after a failure, keeps results.

The whole script (test suite and all) runs on a GPU runner; here it runs a few
of its steps, on the host rows, to show the plumbing works. Those runs hide any
GPU (``CUDA_VISIBLE_DEVICES`` empty), so they check the same plumbing on every
machine and a GPU runner does not spend minutes of its tests re-measuring what
its own bench and sweep steps measure. What it leaves in
OUTDIR must come back from a runner whole: at most 8 files of at most 16 MiB,
at most two folders down, named in letters, digits, ``.``, ``_`` and ``-``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import NO_GPU

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="needs bash and coreutils timeout",
)


def _environ() -> dict[str, str]:
    """This process's environment without pytest's own variables, for a child that runs pytest.

    Under pytest-xdist this process is a worker (PYTEST_XDIST_WORKER and the like); a child
    pytest that inherits those takes itself for one too (pytest-benchmark then warns, an error
    in this suite).
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def _run(out: Path, *steps: str, scale: str = "0.02", **env: str) -> subprocess.CompletedProcess:
    tmp = out.parent / "scratch"
    tmp.mkdir(exist_ok=True)
    env = {
        **_environ(),
        "PYTHON": sys.executable,
        "INTEROP_BENCH_SCALE": scale,
        **NO_GPU,
        "TMPDIR": str(tmp),
        **env,
    }
    return subprocess.run(
        [str(SCRIPT), str(out), *steps],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def _steps(out: Path) -> dict[str, str]:
    lines = (out / "steps.tsv").read_text().splitlines()
    assert lines[0] == "step\tstatus\texit\tseconds"
    return {line.split("\t")[0]: line.split("\t")[1] for line in lines[1:]}


def _section(out: Path, step: str) -> str:
    """The part of gpu-check.log that one step wrote."""
    log = (out / "gpu-check.log").read_text()
    return log.split(f"===== {step}: ", 1)[1].split("\n===== ", 1)[0]


def _assert_fits_what_comes_back(out: Path) -> list[str]:
    files = sorted(p for p in out.rglob("*") if p.is_file())
    names = [str(p.relative_to(out)) for p in files]
    assert len(files) <= 8, names
    for path, name in zip(files, names, strict=True):
        assert len(path.relative_to(out).parts) <= 3, name
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in Path(name).parts), name
        assert path.stat().st_size <= 16 << 20, name
    return names


def test_a_failing_step_is_recorded_and_the_next_ones_run(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "bench", "sweep", "plot", scale="-1")  # bench and sweep refuse the scale
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _steps(out) == {"bench": "failed", "sweep": "failed", "plot": "failed"}
    assert "INTEROP_BENCH_SCALE" in _section(out, "bench")
    assert "INTEROP_BENCH_SCALE" in _section(out, "sweep")
    assert "no bench.json or sweep.json" in (out / "gpu-check.log").read_text()
    summary = (out / "summary.txt").read_text()
    assert summary.splitlines()[-1] == "failed: bench sweep plot"
    assert "commit" in summary
    assert list((tmp_path / "scratch").iterdir()) == []  # scratch removed


def test_bench_sweep_and_plot_write_their_results(tmp_path):
    out = tmp_path / "out"
    # the lab's own tests run every row; here two, named as a runner short of time would
    proc = _run(
        out, "info", "bench", "sweep", "plot", GPU_CHECK_BENCH_ROWS="host_copy,d2h_prealloc"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + (out / "summary.txt").read_text()
    assert _steps(out) == {"info": "passed", "bench": "passed", "sweep": "passed", "plot": "passed"}
    bench = json.loads((out / "bench.json").read_text())
    assert bench["kind"] == "bench"
    assert [r["name"] for r in bench["rows"]] == ["host_copy", "d2h_prealloc"]
    assert [r["status"] for r in bench["rows"]] == ["ok", "skipped"]  # no GPU here
    assert bench["quick"] is False
    assert "partial" not in bench
    sweep = json.loads((out / "sweep.json").read_text())
    host = next(r for r in sweep["rows"] if r["name"] == "host_copy")
    assert host["status"] == "ok"
    assert {p["chunk_bytes"] >> 20 for p in host["points"]} == {4, 8, 16, 32, 64}
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert "host_copy" in _section(out, "bench")
    assert "interop" in _section(out, "info")
    assert (out / "summary.txt").read_text().splitlines()[-1] == "every step passed"
    assert _assert_fits_what_comes_back(out) == [
        "bench.json",
        "gpu-check.log",
        "steps.tsv",
        "summary.txt",
        "sweep.json",
        "throughput.png",
    ]
    assert list((tmp_path / "scratch").iterdir()) == []


def test_examples_run_outside_the_checkout_and_are_recorded(tmp_path):
    out = tmp_path / "out"
    before = set(ROOT.iterdir())
    proc = _run(out, "examples", GPU_CHECK_EXAMPLES="plot_device_array", GPU_CHECK_FULL="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr + (out / "gpu-check.log").read_text()
    assert _steps(out) == {"example-plot_device_array": "passed"}
    section = _section(out, "example-plot_device_array")
    assert "--full" not in section.splitlines()[0]  # GPU_CHECK_FULL=0: the small sizes
    assert "wrote" in section
    assert set(ROOT.iterdir()) == before  # its PNG went to the scratch directory
    assert _assert_fits_what_comes_back(out) == ["gpu-check.log", "steps.tsv", "summary.txt"]


def test_an_unknown_step_is_refused(tmp_path):
    proc = _run(tmp_path / "out", "bench", "lint")
    assert proc.returncode == 2
    assert "expected steps among" in proc.stderr


def test_a_step_budget_can_be_set_from_the_environment(tmp_path):
    """GPU_CHECK_<STEP>_S replaces a step's budget: 2 s is below the 5 s a step needs."""
    out = tmp_path / "out"
    proc = _run(out, "info", "plot", GPU_CHECK_INFO_S="2")
    assert proc.returncode == 1
    steps = _steps(out)
    assert steps["info"] == "not run (no time left)"
    assert steps["plot"] == "failed"  # nothing to plot, but it ran: only info's budget changed


@pytest.mark.skipif(
    shutil.which("compute-sanitizer") is not None, reason="compute-sanitizer is installed here"
)
def test_sanitize_runs_only_when_named_and_says_what_is_missing(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "sanitize")
    assert proc.returncode == 1
    assert _steps(out) == {"sanitize": "not run (no compute-sanitizer)"}
    assert "compute-sanitizer is not on PATH" in (out / "gpu-check.log").read_text()
    help_text = subprocess.run(
        [str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "only when named" in help_text
    assert "GPU_CHECK_TOTAL_S the 525 s in all" in help_text
    assert help_text.rstrip().endswith("-m gpu tests/test_transfer.py'.")  # the whole header


_CUT_SHORT = """
import time

def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3

def test_hangs():
    time.sleep(120)

def test_never_reached():
    pass
"""


def test_tests_cut_short_by_their_limit_still_report_what_ran(tmp_path):
    """The time limit stops pytest as Ctrl-C would: junit.xml and the failures are written."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_cut_short.py").write_text(_CUT_SHORT)
    out = tmp_path / "out"
    proc = _run(out, "tests", GPU_CHECK_TESTS_S="7", GPU_CHECK_PYTEST_ARGS=str(suite))
    assert proc.returncode == 1
    assert _steps(out) == {"tests": "timed out"}
    junit = (out / "junit.xml").read_text()
    assert 'name="test_passes"' in junit
    assert 'name="test_fails"' in junit
    assert "assert (1 + 1) == 3" in junit
    assert "test_never_reached" not in junit
    section = _section(out, "tests")
    assert "test_cut_short.py::test_hangs" in section  # -v names the test that hung
    assert "FAILED" in section
    assert "test_cut_short.py::test_fails" in section
    assert "stopped by signal 15 (the time limit)" in section


_SPLIT_SUITE = {
    "conftest.py": """
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU")
""",
    "test_split.py": """
import pytest

@pytest.mark.gpu
def test_on_the_device():
    assert 2 * 2 == 4

def test_on_the_host():
    assert 2 + 2 == 4
""",
}


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_suite_runs_gpu_tests_alone_then_the_rest(tmp_path, workers):
    """Without GPU_CHECK_PYTEST_ARGS the tests step is two runs, each with its JUnit file;
    the second over worker processes where pytest-xdist is installed."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in _SPLIT_SUITE.items():
        (suite / name).write_text(text)
    out = tmp_path / "out"
    proc = _run(out, "tests", GPU_CHECK_SUITE=str(suite), GPU_CHECK_WORKERS=workers)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (out / "gpu-check.log").read_text()
    assert _steps(out) == {"tests-gpu": "passed", "tests-host": "passed"}
    gpu = (out / "junit-gpu.xml").read_text()
    host = (out / "junit.xml").read_text()
    assert 'name="test_on_the_device"' in gpu
    assert "test_on_the_host" not in gpu
    assert 'name="test_on_the_host"' in host
    assert "test_on_the_device" not in host
    assert "junit-gpu.xml -m gpu" in _section(out, "tests-gpu")  # the command, as logged
    assert "-m not gpu" in _section(out, "tests-host")
    spread = workers == "2" and importlib.util.find_spec("xdist") is not None
    assert ("-p no:benchmark -n 2" in _section(out, "tests-host")) == spread
    assert bool(re.search(r"\[gw\d+\]", _section(out, "tests-host"))) == spread  # xdist's workers
    assert _assert_fits_what_comes_back(out) == [
        "gpu-check.log",
        "junit-gpu.xml",
        "junit.xml",
        "steps.tsv",
        "summary.txt",
    ]


def _collected(*args: str, **env: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**_environ(), **env},
        timeout=120,
        check=True,
    )
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_a_gpu_runner_runs_the_gpu_tests_first():
    files = ["tests/test_streams.py", "tests/pipeline/test_ring.py"]
    plain = _collected(*files, INTEROP_REQUIRE_GPU="0")
    gpu = _collected("-m", "gpu", *files, INTEROP_REQUIRE_GPU="0")
    required = _collected(*files, INTEROP_REQUIRE_GPU="1")
    assert gpu
    assert len(gpu) < len(plain)
    assert plain[: len(gpu)] != gpu  # so the order below is the sort's doing
    assert required[: len(gpu)] == gpu  # the GPU tests first, in pytest's order
    assert required[len(gpu) :] == [t for t in plain if t not in gpu]


_FIRST_SUITE = {
    **_SPLIT_SUITE,
    "test_changed.py": """
import pytest

@pytest.mark.gpu
def test_rewritten():
    import gpucheck_probe  # from the carried wheel
    assert gpucheck_probe.VALUE == 7
""",
    "test_split.py": _CUT_SHORT.replace("def test_", "@pytest.mark.gpu\ndef test_")
    .replace("import time", "import time\nimport pytest")
    .replace("@pytest.mark.gpu\ndef test_passes", "def test_passes"),
}


def _wheel(folder: Path, requires: str) -> None:
    """A wheel of one module, gpucheck_probe, requiring ``requires``."""
    info = "gpucheck_probe-1.0.dist-info"
    folder.mkdir()
    with zipfile.ZipFile(folder / "gpucheck_probe-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("gpucheck_probe.py", "VALUE = 7\n")
        whl.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: gpucheck-probe\n"
            f"Version: 1.0\nRequires-Dist: {requires}\n",
        )
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")


def test_the_first_call_dry_run_keeps_its_order_and_budgets(tmp_path):
    """The first call of a lend on CPU: wheels, info, the rewritten code's gpu tests then the
    others, the lab's rows (one it lacks left out), the examples; each step ends by the planned
    end of the budgets so far (350 s in all), and the rerun lists what did not pass."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in _FIRST_SUITE.items():
        (suite / name).write_text(text)
    _wheel(tmp_path / "whl", "numpy")
    out, again = tmp_path / "out", tmp_path / "rerun"
    proc = _run(
        out,
        "first",
        GPU_CHECK_SUITE=str(suite),
        GPU_CHECK_FIRST=str(suite / "test_changed.py"),
        GPU_CHECK_WHEELS=str(tmp_path / "whl"),
        GPU_CHECK_WHEELS_S="20",
        GPU_CHECK_TESTS_GPU_S="5",
        GPU_CHECK_EXAMPLES="plot_device_array",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _steps(out) == {
        "wheels": "passed",
        "wheels-check": "passed",
        "info": "passed",
        "tests-gpu": "timed out",
        "bench": "passed",
        "example-plot_device_array": "passed",
    }
    log = (out / "gpu-check.log").read_text()
    ends = re.findall(r"gpu-check: (\S+) begins at \d+ s, budget (\d+) s, ends by (\d+) s", log)
    assert ends == [
        ("wheels", "20", "20"),
        ("info", "10", "30"),
        ("tests-gpu", "5", "35"),
        ("bench", "125", "160"),
        ("examples", "45", "205"),
    ]
    junit = re.findall(
        r'testcase classname="[^"]*" name="(\w+)"', (out / "junit-gpu.xml").read_text()
    )
    assert junit == ["test_rewritten", "test_fails"]  # the rewritten code first; then it hung
    summary = (out / "summary.txt").read_text()
    for fact in ("cpu model ", "numa nodes ", "transparent huge pages "):
        assert fact in summary
    assert "not in the lab" not in summary  # d2h_hybrid is in the lab now
    rows = [r["name"] for r in json.loads((out / "bench.json").read_text())["rows"]]
    first_rows = re.search(r"^FIRST_ROWS=(.*)$", SCRIPT.read_text(), re.M)[1].split(",")
    assert first_rows[:3] == ["host_limit", "d2h_limit", "h2d_limit"]  # the ceilings first
    assert rows == first_rows
    rerun = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu-rerun"), str(out)],
        env={**_environ(), "GPU_CHECK_SUITE": str(suite), "GPU_CHECK_RERUN": str(again)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # ids relative to pytest's rootdir: the suite, or a folder above both it and the checkout
    assert [t.rsplit("/", 1)[-1] for t in (again / "tests.txt").read_text().split()] == [
        "test_split.py::test_fails",
        "test_split.py::test_hangs",
        "test_split.py::test_never_reached",
    ], rerun.stdout
    assert "host_limit" not in (again / "rows.txt").read_text().split()  # it was ok
    assert "plot_device_array" not in (again / "examples.txt").read_text().split()
    # The second call, on lists cut to two items (the real suite's ids are the checkout's).
    (again / "tests.txt").write_text(f"{suite}/test_split.py::test_fails\n")
    (again / "rows.txt").write_text("host_copy\n")
    (again / "examples.txt").write_text("")
    proc = _run(
        tmp_path / "out2",
        "rerun",
        GPU_CHECK_RERUN=str(again),
        GPU_CHECK_WHEELS=str(tmp_path / "whl"),
    )
    assert _steps(tmp_path / "out2") == {
        "wheels": "passed",
        "wheels-check": "passed",
        "tests": "failed",
        "bench": "passed",
        "examples": f"skipped (no examples in {again}/examples.txt)",
    }


def test_a_wheel_whose_requirement_is_missing_is_named(tmp_path):
    _wheel(tmp_path / "whl", "no-such-package-gpucheck>=1")
    out = tmp_path / "out"
    proc = _run(out, "wheels", GPU_CHECK_WHEELS=str(tmp_path / "whl"))
    assert proc.returncode == 1
    assert _steps(out) == {"wheels": "passed", "wheels-check": "failed"}
    unmet = "gpucheck-probe 1.0 requires no-such-package-gpucheck, which is not installed"
    assert unmet in _section(out, "wheels-check")
