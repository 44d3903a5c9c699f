"""Import-time promises and the error classes of SPEC §2."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import interop
from interop import _backends
from tests.helpers import REPO_ROOT, run_python


def test_import_interop_imports_neither_torch_nor_cupy():
    proc = run_python(
        """
        import sys, interop
        interop.to_numpy(__import__("numpy").arange(3))
        print(sorted(m for m in ("torch", "cupy") if m in sys.modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("blocked", "call", "extra"),
    [
        ("cupy", "interop.to_cupy(np.arange(3))", "cuda12"),
        ("torch", "interop.to_torch(np.arange(3))", "torch"),
    ],
)
def test_missing_backend_names_the_extra(blocked, call, extra):
    proc = run_python(
        f"""
        import sys
        sys.modules[{blocked!r}] = None  # as if not installed
        import numpy as np, interop
        try:
            {call}
        except ImportError as exc:
            assert isinstance(exc, interop.BackendUnavailableError)
            assert isinstance(exc.__cause__, ImportError)
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert f"needs {blocked}" in proc.stdout
    assert f"install it with: {_backends.install_command(extra)}" in proc.stdout


def test_to_numpy_works_without_torch_and_cupy():
    proc = run_python(
        """
        import sys
        sys.modules["torch"] = None
        sys.modules["cupy"] = None
        import numpy as np, interop
        print(interop.to_numpy(np.arange(3)).tolist())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 1, 2]"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (interop.CopyRequiredError, BufferError),
        (interop.UnsupportedDtypeError, TypeError),
        (interop.BackendUnavailableError, ImportError),
        (interop.NoDeviceError, RuntimeError),
        (interop.TransferError, RuntimeError),
    ],
)
def test_error_hierarchy(cls, builtin):
    assert issubclass(cls, interop.InteropError)
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")


def test_read_only_warning_is_a_user_warning():
    assert issubclass(interop.ReadOnlyWarning, UserWarning)


def test_public_names():
    for name in ["to_numpy", "to_torch", "to_cupy", "copy_to_host", "copy_to_host_async"]:
        assert name in interop.__all__
        assert callable(getattr(interop, name))


def _pyproject_field(name: str) -> str:
    """A string field of pyproject.toml's [project] table (read as text: Python 3.10 has no
    tomllib)."""
    text = (REPO_ROOT / "pyproject.toml").read_text()
    table = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    (value,) = re.findall(rf'^{name} = "([^"]*)"$', table, flags=re.MULTILINE)
    return value


def test_install_hints_name_this_distribution():
    # The PyPI name "interop" is an unrelated package; every hint names ours, which is the
    # distribution this checkout builds.
    from interop import _backends

    assert _pyproject_field("name") == _backends.DISTRIBUTION == "torch-cupy-interop"
    assert _pyproject_field("version") == interop.__version__


def test_the_installed_distribution_is_this_checkout():
    import importlib.metadata

    from interop import _backends

    try:
        dist = importlib.metadata.distribution(_backends.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        # Used in place, not installed (PYTHONPATH=., as on a GPU runner): then the interop
        # imported is this checkout's.
        assert Path(interop.__file__).resolve().parent == REPO_ROOT / "interop"
        return
    assert dist.metadata["Name"] == "torch-cupy-interop"
    assert dist.version == interop.__version__
    assert (dist.read_text("top_level.txt") or "").split() == ["interop"]


def _documented_names() -> list[str]:
    """Every ``::: name`` of the API reference, every ``interop.<module>`` import the
    pages, the README and the examples show, and the module paths the pages name."""
    pages = [
        *REPO_ROOT.glob("docs/*.md"),
        REPO_ROOT / "README.md",
        *REPO_ROOT.glob("examples/*.py"),
    ]
    text = "\n".join(p.read_text() for p in pages)
    names = set(re.findall(r"^::: (interop[\w.]*)", (REPO_ROOT / "docs/api.md").read_text(), re.M))
    for module, imported in re.findall(r"^\s*from (interop[\w.]*) import ([\w, ]+)$", text, re.M):
        names |= {f"{module}.{name.strip()}" for name in imported.split(",")}
    names |= set(re.findall(r"^\s*import (interop[\w.]*)$", text, re.M))
    names |= set(re.findall(r"`(interop\.(?:dask|testing|safetensors))[`.]", text))
    return sorted(names)


def _resolve(name: str) -> object:
    """Import the longest module prefix of ``name``, then take the rest as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def test_every_documented_name_and_module_path_imports():
    """What the API reference and the pages tell users to import (interop.dask and
    interop.testing among them) still imports after the package was rearranged."""
    names = _documented_names()
    assert {"interop.to_cupy", "interop.dask.save_npy", "interop.testing"} <= set(names)
    for name in names:
        assert _resolve(name) is not None, name
