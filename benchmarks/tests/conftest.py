"""The ``gpu`` marker policy of the main suite (``tests/conftest.py``) for the lab's tests:
a GPU test is skipped without a device, and fails instead with ``INTEROP_REQUIRE_GPU=1``;
and the shared lab runs' directory."""

from __future__ import annotations

import pytest

from tests.conftest import _gpu_policy

from . import runs

__all__ = ["_gpu_policy"]


@pytest.fixture(scope="session", autouse=True)
def _shared_runs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> None:
    """The lab runs the tests read are made once per session, not once per xdist worker:
    the workers share pytest's base temporary directory (its parent, under xdist)."""
    base = tmp_path_factory.getbasetemp()
    worker = hasattr(request.config, "workerinput")  # an xdist worker
    runs.SHARED = base.parent if worker else base
