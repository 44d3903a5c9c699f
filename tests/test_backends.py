"""The checks that guard every device call (interop/_backends.py): what they
ask once per process, and what they ask every time."""

from __future__ import annotations

import os

import pytest

import interop
from interop import _backends


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
