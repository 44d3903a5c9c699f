"""``interop.torch_op`` (named ``_torch_op``: a ``torch_op/`` would shadow it in the API docs)."""

from .register import torch_op
from .schema import Array, array_namespace

__all__ = ["Array", "array_namespace", "torch_op"]
