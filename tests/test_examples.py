"""Every example script runs with its small defaults and shows what it claims.

Each example's ``main(argv)`` returns its figures; these tests check the
values (right data, zero-copy hand-overs, memory bounds), not the timings.
On a machine without a GPU the examples run on the CPU, as they say; on a GPU
runner the same tests run them on the device.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import interop
from interop.info import install_command
from tests.helpers import REPO_ROOT, child_env, run_python

EXAMPLES = REPO_ROOT / "examples"
MiB = 1 << 20


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))


def test_every_example_has_a_test():
    tests = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
    untested = [name for name in _example_names() if f'"{name}"' not in tests]
    assert untested == []


@pytest.mark.parametrize("name", _example_names())
def test_help_names_the_options(name, capsys):
    if name == "dask_checkpoint":
        pytest.importorskip("distributed", reason="the example needs the 'dask' extra")
    module = _load(name)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    assert "--cpu" in out
    if name != "exchange_tour":
        assert "--full" in out  # the GPU sizes


def test_exchange_tour(capsys):
    seen = _load("exchange_tour").main([])
    assert seen["shared"] == 42.0
    assert seen["conj"] == [1 - 2j, 3 + 4j]
    assert seen["neg"] == [-2.0, 4.0]
    assert seen["reversed"] == [3.0, 2.0, 1.0, 0.0]
    assert seen["bf16"] == ("bfloat16", [1.5, -2.0])
    assert seen["readonly_warning"] == ["ReadOnlyWarning"]
    assert seen["broadcast_readonly"] is True
    assert seen["copy_false"] == "CopyRequiredError"
    assert seen["not_an_array"] is True
    if "cupy_sum" in seen:  # a CUDA device was visible
        assert seen["cupy_sum"] == 57.0
        assert seen["cupy_reversed"] == [[2.0, 1.0, 42.0], [5.0, 4.0, 3.0]]
    out = capsys.readouterr().out
    assert "reversed            to_torch(np.arange(4.0)[::-1])  [3.0, 2.0, 1.0, 0.0]" in out


def test_exchange_tour_runs_as_a_script():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "exchange_tour.py"), "--cpu"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "copy_false" in proc.stdout
    assert "CopyRequiredError" in proc.stdout


def test_oversized_to_host(tmp_path, capsys):
    result = _load("oversized_to_host").main(["--dir", str(tmp_path)])
    nbytes = 64 * MiB
    assert result.nbytes == nbytes
    methods = [row.method for row in result.rows]
    assert methods[:3] == [
        "interop.copy_to_host(x, out)",
        "interop.copy_to_host(x)",
        "interop.save_npy(x, path)",
    ]
    assert len(methods) == (5 if result.device.startswith("cuda") else 4)
    assert [row.method for row in result.rows if not row.matches] == []
    assert list(tmp_path.iterdir()) == []  # the .npy file went with its temporary directory

    prealloc, naive = result.rows[0], result.rows[3]
    if prealloc.extra_host_bytes is not None:  # Linux: RSS is measurable
        # Into a preallocated buffer: at most the staging ring (device) or a
        # few thread stacks (host), never a full-size temporary ...
        ring = interop.config.num_buffers * interop.config.chunk_bytes
        bound = ring + nbytes // 2 if result.device.startswith("cuda") else nbytes // 4
        assert prealloc.extra_host_bytes <= bound
        # ... where the naive way allocates the whole array (this checks the measurement).
        assert naive.extra_host_bytes >= nbytes * 9 // 10
    out = capsys.readouterr().out
    assert "GB/s" in out
    assert "extra host MiB" in out
    assert "interop.save_npy(x, path)" in out
    assert "WRONG" not in out


# PyTorch itself warns while it compiles the loss (torch 2.13: inductor, and
# dynamo looking at the .grad of the model's output)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_segmentation_focal_loss(capsys):
    result = _load("segmentation_focal_loss").main([])
    assert result.mask_dtype == "torch.uint8"
    assert result.zero_copy is True
    assert len(result.losses) == 40
    assert all(math.isfinite(v) for v in result.losses)
    assert result.losses[-1] < result.losses[0] / 2  # it learns
    # The IoU of the last step from the streamed host copies is the IoU that
    # PyTorch computes on the device from the same tensors.
    assert result.iou_last_host == pytest.approx(result.iou_last_device, nan_ok=True)
    assert len(result.iou) == 3
    assert all(0.0 <= v <= 1.0 for v in result.iou)
    assert result.iou_last_host[0] > 0.8  # background, after 40 steps
    # The loss is an interop.torch_op: the same value as PyTorch's own loss,
    # compiled whole where a compiler is available.
    assert result.loss_gap <= 1e-5
    if result.device.startswith("cuda"):
        assert result.loss_runs == "torch.compile(fullgraph=True, backend='inductor')"
    else:  # inductor's C++ build would take most of a CPU run's time
        assert result.loss_runs == "torch.compile(fullgraph=True, backend='aot_eager')"
    out = capsys.readouterr().out
    assert "masks reached PyTorch as torch.uint8, zero-copy: True" in out
    assert "focal loss: interop.torch_op of CuPy/NumPy kernels" in out
    assert "background" in out


def test_segmentation_focal_loss_operator_gradient():
    import torch

    module = sys.modules.get("examples_segmentation_focal_loss") or _load("segmentation_focal_loss")
    logp = -torch.rand(6, 5, dtype=torch.float64) * 4 - 1e-3  # log-probabilities < 0
    logp.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda lp: module.focal_term(lp, 2.0), (logp,))
    torch.library.opcheck(module.focal_term, (logp, 1.5))
    logits = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    target = torch.randint(0, 3, (2, 4, 4))
    assert torch.allclose(
        module.focal_loss(logits, target), module.focal_loss_reference(logits, target)
    )
    result = module.main(["--steps", "2", "--compile", "off"])
    assert result.loss_runs == "eager (--compile off)"
    assert result.loss_gap <= 1e-5


def test_plot_device_array(tmp_path, capsys):
    module = _load("plot_device_array")
    result = module.main(["--out", str(tmp_path)])
    assert result.step == 4
    assert [row.dtype for row in result.rows] == ["float32", "bfloat16"]
    assert [row.field_shape for row in result.rows] == [(2048, 2048)] * 2
    assert [row.drawn_shape for row in result.rows] == [(512, 512)] * 2
    # Only the drawn pixels reached the host: a sixteenth of each field's
    # elements, as float32 (the bfloat16 field is cast to float32 on the way).
    assert [row.moved_bytes for row in result.rows] == [512 * 512 * 4, 512 * 512 * 4]
    assert [row.field_bytes for row in result.rows] == [2048 * 2048 * 4, 2048 * 2048 * 2]
    assert all(row.values_match for row in result.rows)
    assert result.png == tmp_path / "device_field.png"
    assert result.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "moved 8.33% of the fields' bytes" in capsys.readouterr().out  # 2 MiB of 24

    odd = module.main(["--out", str(tmp_path), "--side", "1000", "--pixels", "333"])
    assert odd.step == 4
    assert [row.drawn_shape for row in odd.rows] == [(250, 250)] * 2
    assert all(row.values_match for row in odd.rows)


def test_mixed_pipeline(capsys):
    result = _load("mixed_pipeline").main([])
    assert sum(result.counts) == 4 * 16
    assert result.counts == result.reference_counts
    assert result.max_prob_difference <= 1e-5
    assert result.zero_copy is True
    if result.device.startswith("cuda"):
        assert result.one_stream is True
        assert result.cupy_pool_growth_bytes == 0  # CuPy allocated from PyTorch's pool
        assert result.torch_peak_bytes > 0
    else:
        assert result.one_stream is None
    out = capsys.readouterr().out
    assert "same counts as PyTorch alone: True" in out


# The README's and the getting-started page's code blocks run as scripts: the
# first block of each on any machine, the second (GPU lines) on a GPU.


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def _run_script(source: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "snippet.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_readme_quick_start_runs_as_a_script(tmp_path):
    cpu, _gpu = _python_blocks(REPO_ROOT / "README.md")[:2]
    proc = _run_script(cpu, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "42.0"
    assert lines[1] == "[1.-2.j]"
    assert lines[2].startswith("CopyRequiredError: ")
    assert lines[3] == "[3.0, 2.0, 1.0, 0.0] bfloat16"
    assert lines[4] == "True"
    assert (tmp_path / "x.npy").stat().st_size == 1000 * 1000 * 4 + 128


@pytest.mark.gpu
def test_readme_gpu_lines_run(tmp_path):
    cpu, gpu = _python_blocks(REPO_ROOT / "README.md")[:2]
    proc = _run_script(cpu + gpu, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[0.0, 2.0, 4.0]"


def test_getting_started_first_calls_run(tmp_path):
    cpu, _gpu = _python_blocks(REPO_ROOT / "docs" / "getting-started.md")[:2]
    proc = _run_script(cpu, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["[1.-2.j]", "[-2.]"]
    assert lines[2] == "tensor([3., 2., 1., 0.], dtype=torch.float64)"
    assert (tmp_path / "x.npy").exists()


@pytest.mark.gpu
def test_getting_started_gpu_lines_run(tmp_path):
    cpu, gpu = _python_blocks(REPO_ROOT / "docs" / "getting-started.md")[:2]
    proc = _run_script(cpu + gpu, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "18.0"


def test_checkpoint_model(tmp_path, capsys):
    module = _load("checkpoint_model")
    seen = module.main(["--dir", str(tmp_path)])
    assert seen["equal"] is True  # every tensor of the reloaded model is the trained one's
    assert seen["in_place"] is True  # filled where it was: no second copy of the model
    assert seen["device"] == ("cpu" if module._gpu_status() else "cuda")
    assert seen["index"] == "model.safetensors.index.json"
    assert len(seen["files"]) > 2  # shards of at most 1 MB, and the index
    assert sorted(p.name for p in tmp_path.iterdir()) == seen["files"]
    index = json.loads((tmp_path / seen["index"]).read_text())
    assert index["metadata"]["total_size"] == seen["parameters"] * 4
    assert seen["losses"][-1] < seen["losses"][0]
    captured = capsys.readouterr()
    assert "compared  equal" in captured.out
    assert "save_sharded: 100%" in captured.err  # the progress bars
    assert "load_into: 100%" in captured.err


def test_dask_checkpoint(tmp_path, capsys):
    pytest.importorskip("distributed", reason="the example needs the 'dask' extra")
    module = _load("dask_checkpoint")
    seen = module.main(["--rows", "512", "--cols", "256", "--workers", "0", "--dir", str(tmp_path)])
    assert seen["equal"] is True
    gpu = module._gpu_status() is None
    assert seen["blocks"] == ("cupy.ndarray" if gpu else "numpy.ndarray")
    assert seen["shape"] == (512, 256)
    assert seen["file_bytes"] == 512 * 256 * 4 + 128
    out = capsys.readouterr().out
    assert "round trip  equal" in out
    assert gpu or "NumPy blocks:" in out


def test_dask_checkpoint_on_worker_processes(tmp_path, capsys):
    """A real 2-process cluster: with a GPU, CuPy blocks never leave their workers
    (distributed cannot move them without numba or RMM); compared by digests."""
    pytest.importorskip("distributed", reason="the example needs the 'dask' extra")
    gpu = _load("dask_checkpoint")._gpu_status() is None
    # as a script, as scripts/gpu-check runs it: its functions go to the workers by value
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "dask_checkpoint.py"), "--rows", "256", "--cols", "128",
         "--workers", "2", "--dir", str(tmp_path)],
        env=child_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(None, 1) for line in proc.stdout.splitlines()[-5:])
    assert lines["blocks"] == ("cupy.ndarray" if gpu else "numpy.ndarray")
    assert lines["shape"] == "(256, 128)"
    assert proc.stdout.splitlines()[-1] == "round trip  equal"


def test_dask_checkpoint_digests_compare_values_not_chunks():
    pytest.importorskip("dask", reason="the example needs the 'dask' extra")
    import dask
    import dask.array as da

    checked = _load("dask_checkpoint")._checked
    a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    b = a.copy()
    b[5, 7] = np.nextafter(b[5, 7], np.float32(9))  # one bit of one value
    with dask.config.set(scheduler="threads"):
        same, on_gpu = checked(da.from_array(a, chunks=(16, 12)))
        assert on_gpu is False
        assert checked(da.from_array(a, chunks=(8, 48)))[0] == same  # other chunks
        assert checked(da.from_array(b, chunks=(16, 12)))[0] != same
        assert checked(da.from_array(a[::-1].copy(), chunks=(16, 12)))[0] != same  # moved


def test_an_example_whose_check_fails_exits_with_an_error(tmp_path):
    """Run as a script (as scripts/gpu-check runs it), a wrong result fails, not only prints."""
    code = (
        "import runpy, sys, interop\n"
        "right = interop.copy_to_host\n"
        "interop.copy_to_host = lambda x, *a, **k: right(x, *a, **k) + 1  # a wrong copy\n"
        f"sys.argv = ['x.py', '--cpu', '--side', '64', '--out', {str(tmp_path)!r}]\n"
        f"runpy.run_path({str(EXAMPLES / 'plot_device_array.py')!r}, run_name='__main__')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "WRONG" in proc.stdout
    assert "differs from the usual way's for: NumPy, torch (cpu)" in proc.stderr


# What each example imports besides interop's own dependencies, and the extra
# that installs it (docs/examples.md lists the same). CuPy is left out: every
# example runs without it, on the CPU.
NEEDS = {
    "checkpoint_model": {"torch": "examples"},
    "dask_checkpoint": {"dask": "dask", "distributed": "dask"},
    "exchange_tour": {"torch": "examples"},
    "mixed_pipeline": {"torch": "examples"},
    "oversized_to_host": {"torch": "examples"},
    "plot_device_array": {"torch": "examples", "matplotlib": "examples"},
    "segmentation_focal_loss": {"torch": "examples"},
}
OPTIONAL = {"torch", "matplotlib", "dask", "distributed"}


def _imported(path: Path) -> set[str]:
    """Top-level names of every module the script imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_optional_import_of_an_example_is_listed():
    found = {name: _imported(EXAMPLES / f"{name}.py") & OPTIONAL for name in _example_names()}
    assert found == {name: set(needs) for name, needs in NEEDS.items()}


def _without(tmp_path: Path, package: str) -> dict[str, str]:
    """A child environment in which ``import package`` raises ImportError."""
    stub = tmp_path / "hidden" / package
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('{package} is hidden by the test')\n")
    return child_env({"PYTHONPATH": str(stub.parent)})


def _run_example(name: str, env: dict[str, str], cwd: Path, *args: str):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--cpu", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "package"),
    [(name, package) for name, needs in NEEDS.items() for package in needs],
)
def test_an_example_without_its_package_says_which_extra_to_install(tmp_path, name, package):
    proc = _run_example(name, _without(tmp_path, package), tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{package} is hidden by the test" in proc.stderr  # the reason, as Python gave it
    assert f"Install it with: {install_command(NEEDS[name][package])}" in proc.stderr
    assert "Traceback" not in proc.stderr
    # it stopped before measuring anything (the dask example says first what it uses) ...
    assert proc.stdout in ("", "NumPy blocks: --cpu was given\n")
    assert list(tmp_path.iterdir()) == [tmp_path / "hidden"]  # ... or writing anything


def test_the_dask_example_runs_on_threads_without_distributed(tmp_path):
    pytest.importorskip("dask", reason="the example needs the 'dask' extra")
    proc = _run_example(
        "dask_checkpoint", _without(tmp_path, "distributed"), tmp_path,
        "--workers", "0", "--rows", "256", "--cols", "128", "--dir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "round trip  equal"
    assert "--workers 0" in _run_example(  # the cluster needs it, and says how to do without
        "dask_checkpoint", _without(tmp_path / "again", "distributed"), tmp_path,
        "--rows", "256", "--cols", "128", "--dir", str(tmp_path),
    ).stderr  # fmt: skip
