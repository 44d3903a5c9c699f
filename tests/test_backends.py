"""The checks that guard every device call (interop/_backends.py): what they
ask once per process, and what they ask every time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import interop
from interop import _backends
from tests.helpers import run_python


@pytest.fixture
def torch_cuda(monkeypatch):
    """PyTorch's CUDA check, counted and answered by the test; interop's
    per-process records start empty and are restored afterwards."""
    torch = pytest.importorskip("torch")
    answer = {"available": True, "asked": 0}

    def is_available() -> bool:
        answer["asked"] += 1
        return answer["available"]

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(_backends, "_torch_cuda_in", None)
    monkeypatch.setattr(_backends, "_cuda_initialised_in", None)
    return torch, answer


def test_pytorch_is_asked_for_cuda_once_per_process(torch_cuda):
    torch, answer = torch_cuda
    for _ in range(3):
        assert _backends.require_torch_cuda() is torch
    assert answer["asked"] == 1
    assert _backends._torch_cuda_in == os.getpid()
    assert _backends._cuda_initialised_in == os.getpid()


def test_a_missing_cuda_is_asked_again_and_refused_each_time(torch_cuda):
    _, answer = torch_cuda
    answer["available"] = False
    for _ in range(2):
        with pytest.raises(interop.NoDeviceError, match=r"torch.cuda.is_available\(\) is False"):
            _backends.require_torch_cuda()
    assert answer["asked"] == 2
    assert _backends._torch_cuda_in is None
    answer["available"] = True  # a later answer is taken, not a remembered refusal
    _backends.require_torch_cuda()
    assert answer["asked"] == 3


def test_the_answer_of_the_parent_is_no_answer_in_a_forked_child(torch_cuda, monkeypatch):
    """The fork check runs on every call, before the remembered answer."""
    _, answer = torch_cuda
    _backends.require_torch_cuda()
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # as a child of this process sees it
    with pytest.raises(interop.CudaAfterForkError, match=f"initialised in process {parent}"):
        _backends.require_torch_cuda()
    assert answer["asked"] == 1


# ----------------------------------------------------------------- install hints


def _real_direct_url() -> dict:
    import importlib.metadata
    import json

    return json.loads(
        importlib.metadata.distribution(_backends.DISTRIBUTION).read_text("direct_url.json") or "{}"
    )


def test_install_hints_name_the_source_tree_of_an_editable_install():
    """Here (and in CI) interop is installed with pip install -e from a clone."""
    direct = _real_direct_url()
    if not direct.get("dir_info", {}).get("editable"):
        pytest.skip("interop is not installed in editable mode here")
    tree = Path(direct["url"].removeprefix("file://"))
    assert 'name = "torch-cupy-interop"' in (tree / "pyproject.toml").read_text()
    assert _backends.install_command("torch") == f"pip install -e '{tree}[torch]'"
    assert _backends.install_command("dask") == f"pip install -e '{tree}[dask]'"


def _dist_info(site: Path, direct_url: str | None) -> None:
    """A distribution of interop in ``site``, found before the real one."""
    info = site / "torch_cupy_interop-9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch-cupy-interop\nVersion: 9.9\n"
    )
    if direct_url is not None:
        (info / "direct_url.json").write_text(direct_url)


@pytest.mark.parametrize(
    ("direct_url", "command"),
    [
        (None, "pip install 'torch-cupy-interop[torch]'"),  # from an index
        ('{"url": "file://TREE", "dir_info": {}}', "pip install 'TREE[torch]'"),
        ('{"url": "file://TREE", "dir_info": {"editable": true}}', "pip install -e 'TREE[torch]'"),
        (  # a source tree removed since: its path would not install
            '{"url": "file://TREE/gone", "dir_info": {"editable": true}}',
            "pip install 'torch-cupy-interop[torch]'",
        ),
        (  # a wheel
            '{"url": "file://TREE/w.whl", "archive_info": {}}',
            "pip install 'torch-cupy-interop[torch]'",
        ),
        ('{"url": "https://example.org/t.tar.gz", "archive_info": {}}', None),
        ("not JSON", None),
    ],
    ids=["index", "tree", "editable", "tree gone", "wheel", "url", "broken"],
)
def test_install_hints_follow_how_interop_was_installed(tmp_path, monkeypatch, direct_url, command):
    tree = tmp_path / "a clone's 'tree'"  # a space and quotes: the path is quoted for a shell
    tree.mkdir()
    (tree / "w.whl").write_bytes(b"")
    quoted_tree = str(tree).replace("'", "'\"'\"'")
    site = tmp_path / "site"
    _dist_info(site, None if direct_url is None else direct_url.replace("TREE", str(tree)))
    monkeypatch.syspath_prepend(str(site))
    expected = command or "pip install 'torch-cupy-interop[torch]'"
    assert _backends.install_command("torch") == expected.replace("TREE", quoted_tree)


def test_a_missing_backend_names_the_install_command():
    code = (
        "import sys; sys.modules['torch'] = None; from interop import _backends; _backends.torch()"
    )
    proc = run_python(code)
    assert "BackendUnavailableError" in proc.stderr
    assert f"install it with: {_backends.install_command('torch')} (or follow" in proc.stderr
