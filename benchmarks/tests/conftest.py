"""The ``gpu`` marker policy of the main suite (``tests/conftest.py``) for the lab's tests:
a GPU test is skipped without a device, and fails instead with ``INTEROP_REQUIRE_GPU=1``."""

from __future__ import annotations

from tests.conftest import _gpu_policy

__all__ = ["_gpu_policy"]
