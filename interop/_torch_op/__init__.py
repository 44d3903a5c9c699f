"""``interop.torch_op``: CuPy and NumPy functions as PyTorch operators (named
``_torch_op``: ``interop/torch_op/`` would shadow the decorator for mkdocstrings)."""

from .register import torch_op
from .schema import Array, array_namespace

__all__ = ["Array", "array_namespace", "torch_op"]
