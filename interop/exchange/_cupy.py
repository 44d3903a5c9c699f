"""CuPy arrays as the source of an exchange."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import _backends
from ..arrays import target_str
from ..transfer import copy_to_device, copy_to_host
from ._layout import copy_required, unshareable
from ._numpy import share_with_torch, torch_copy
from ._torch import ALREADY_CURRENT, cupy_index, cupy_stream_handle

if TYPE_CHECKING:
    import cupy
    import torch

    from ..arrays import Target


def to_numpy(c: cupy.ndarray, copy: bool | None) -> np.ndarray:
    """``to_numpy`` of a CuPy array: always a host copy."""
    if copy is False:
        raise copy_required(f"a CuPy array on cuda:{c.device.id} (to_numpy returns host memory)")
    return copy_to_host(c)


def to_torch(c: cupy.ndarray, target: Target | None, copy: bool | None) -> torch.Tensor:
    """``to_torch`` of a CuPy array: shared on its device, else copied."""
    _backends.torch()  # BackendUnavailableError before any work
    if target is None or (target[0] == "cuda" and c.device.id == cupy_index(target[1])):
        return _share_with_torch(c, copy)
    if copy is False:
        raise copy_required(f"moving a CuPy array to {target_str(target)}")
    if target[0] == "cpu":
        return share_with_torch(copy_to_host(c), None)
    return torch_copy(c, target[1])


def _share_with_torch(c: cupy.ndarray, copy: bool | None) -> torch.Tensor:
    """A CUDA tensor sharing ``c``'s memory where PyTorch can, else a copy."""
    th = _backends.require_torch_cuda()
    index = int(c.data.device_id)
    shape = c.shape
    plain = (  # the common case, answered first: what PyTorch takes as it is
        c.flags.c_contiguous and 0 not in shape and 1 not in shape and not c.data.ptr % c.itemsize
    )
    problem = None if plain or c.size == 0 else unshareable(c)
    if problem and copy is False:
        raise copy_required(f"an array with {problem}")
    if problem or (copy and c.size > 0):
        return torch_copy(c, index)
    cp = _backends.cupy()
    # CuPy's __dlpack__ orders PyTorch's current stream after CuPy's, on its device
    here = cp.cuda.runtime.getDevice() == index
    with ALREADY_CURRENT if here else cp.cuda.Device(index):
        if c.size == 0 and (copy or unshareable(c)):
            c = cp.empty(c.shape, c.dtype)  # nothing to share: no strides to export
        cupy_stream_handle("to_torch", index)  # PyTorch's is the consumer named to __dlpack__
        return th.from_dlpack(c)


def to_cupy(c: cupy.ndarray, target: Target | None, copy: bool | None) -> cupy.ndarray:
    """``to_cupy`` of a CuPy array: itself, or a copy (on ``target``'s device)."""
    _backends.require_cupy_device()
    index = int(c.device.id)
    if target is not None and cupy_index(target[1]) != index:  # never 'cpu': refused before
        if copy is False:
            raise copy_required(f"moving a CuPy array to {target_str(target)}")
        index = cupy_index(target[1])
    elif not copy:
        return c
    # on CuPy's current stream there, one copy ordered both ways (a peer copy across devices)
    return copy_to_device(c, device=index)
