"""Shared fixtures and the ``gpu`` marker policy.

Tests marked ``gpu`` need a CUDA device usable by both PyTorch and CuPy. Without
one they are skipped, unless ``INTEROP_REQUIRE_GPU=1`` is set, in which case they
fail: a GPU runner can never pass by skipping; and the GPU tests run first, so
that a run stopped by a time limit has their results. Tests marked ``multigpu``
need two devices and are skipped with fewer unless ``INTEROP_REQUIRE_MULTIGPU=1``.

The ``device`` fixture runs a test's one body on each device (tests/helpers/devices.py):
``[emulated]`` always, ``[cuda]`` under the ``gpu`` marker.
"""

from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def gpu_count() -> int:
    """CUDA devices usable by both torch and CuPy (0 if either is missing)."""
    try:
        import cupy
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0
    return min(n, torch.cuda.device_count())


def _require(env: str, needed: int, what: str) -> None:
    have = gpu_count()
    if have >= needed:
        return
    msg = f"{what}: needs {needed} CUDA device(s) visible to torch and CuPy, found {have}"
    if os.environ.get(env) == "1":
        pytest.fail(f"{env}=1 but {msg}", pytrace=False)
    pytest.skip(msg)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("INTEROP_REQUIRE_GPU") == "1":
        # A stable sort: each group keeps pytest's order.
        items.sort(key=lambda item: item.get_closest_marker("gpu") is None)


@pytest.fixture(autouse=True)
def _gpu_policy(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("multigpu") is not None:
        _require("INTEROP_REQUIRE_MULTIGPU", 2, "multi-GPU test")
    if request.node.get_closest_marker("gpu") is not None:
        _require("INTEROP_REQUIRE_GPU", 1, "GPU test")


@pytest.fixture
def cp():
    """The cupy module, on a machine with a CUDA device (use with @pytest.mark.gpu)."""
    import cupy

    return cupy


@pytest.fixture
def torch():
    """The torch module."""
    import torch as _torch

    return _torch


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def device_kind(request: pytest.FixtureRequest) -> str:
    """Which device a ``device`` test runs on: "emulated", or "cuda" (marked ``gpu``)."""
    return request.param


@pytest.fixture
def device(device_kind: str):
    """A test device (tests/helpers/devices.py) of each kind; after the test, checked
    released (emulated: no rule broken, copy streams closed, pinned memory
    freed; CUDA: every queued copy done) and closed. A test that needs other
    emulated settings (a delay, injected faults) takes ``device_kind`` and
    opens its own with ``devices.opened(device_kind, ...)``."""
    from tests.helpers.devices import opened

    with opened(device_kind) as d:
        yield d
