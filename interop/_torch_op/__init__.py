"""CuPy and NumPy functions as PyTorch operators: ``interop.torch_op``.

A package of its own, not ``interop/torch_op/``: that path would shadow the
decorator ``interop.torch_op`` for tools that read the source (mkdocstrings).
"""

from .register import torch_op
from .schema import Array, array_namespace

__all__ = ["Array", "array_namespace", "torch_op"]
