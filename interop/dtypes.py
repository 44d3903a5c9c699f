"""Dtypes of PyTorch, NumPy (with ``ml_dtypes``) and CuPy, and bit views between them."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import _backends
from .errors import InvalidTypeError, InvalidValueError, UnsupportedDtypeError

if TYPE_CHECKING:
    import torch

__all__: list[str] = []

# torch dtype name -> (ml_dtypes dtype, same-sized integer dtype name used for the bit view)
_ML_NAMES = {
    "bfloat16": (ml_dtypes.bfloat16, "int16"),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, "uint8"),
    "float8_e5m2": (ml_dtypes.float8_e5m2, "uint8"),
    "float8_e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, "uint8"),
    "float8_e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, "uint8"),
    "float8_e8m0fnu": (ml_dtypes.float8_e8m0fnu, "uint8"),
}

# torch dtypes whose name is also the NumPy dtype's name.
_STANDARD = frozenset(
    ["bool", "float16", "float32", "float64", "complex64", "complex128"]
    + [f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)]
)

_ML_NUMPY = {np.dtype(ml): (name, np.dtype(view)) for name, (ml, view) in _ML_NAMES.items()}


def _torch_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# dtypes are hashable, and the cached answers below are on every exchange's path
@functools.cache
def ml_view_of_torch(dtype: Any) -> tuple[np.dtype, Any] | None:
    """``(ml_dtypes dtype, torch integer view dtype)`` for bfloat16/float8, else None."""
    entry = _ML_NAMES.get(_torch_name(dtype))
    return None if entry is None else (np.dtype(entry[0]), getattr(_backends.torch(), entry[1]))


@functools.cache
def is_ml_dtype(dtype: Any) -> bool:
    """True for the ``ml_dtypes`` types interop moves by bit view (bfloat16, float8)."""
    return np.dtype(dtype) in _ML_NUMPY


@functools.cache
def int_view_of_numpy(dtype: Any) -> np.dtype:
    """A same-sized integer dtype, in its byte order, for ``dtype``'s bits (standard: itself)."""
    dtype = np.dtype(dtype)
    entry = _ML_NUMPY.get(dtype.newbyteorder("="))
    return dtype if entry is None else entry[1].newbyteorder(dtype.byteorder)


@functools.cache
def ml_view_of_numpy(dtype: np.dtype) -> tuple[Any, np.dtype] | None:
    """``(torch dtype, NumPy integer view dtype)`` for an ``ml_dtypes`` dtype, else None."""
    entry = _ML_NUMPY.get(np.dtype(dtype))
    if entry is None:
        return None
    name, view = entry
    tdt = getattr(_backends.torch(), name, None)
    if tdt is None:
        raise UnsupportedDtypeError(
            f"expected a dtype the installed PyTorch supports (got {np.dtype(dtype)!r}: "
            f"torch {_backends.torch().__version__} has no torch.{name}); upgrade PyTorch"
        )
    return tdt, view


@functools.cache
def is_standard(dtype: np.dtype) -> bool:
    """True for NumPy dtypes that PyTorch has under the same name (bool, ints, floats, complex)."""
    return np.dtype(dtype).name in _STANDARD


@functools.cache
def torch_dtype_of_numpy(dtype: Any) -> Any:
    """The torch dtype for a NumPy (or ``ml_dtypes``) dtype, or UnsupportedDtypeError."""
    dtype = np.dtype(dtype)
    ml = ml_view_of_numpy(dtype)
    if ml is not None:
        return ml[0]
    if not is_standard(dtype):
        raise UnsupportedDtypeError(
            f"expected a dtype PyTorch supports (got {dtype!r}); "
            "convert first with a.astype(<a numeric dtype>)"
        )
    return getattr(_backends.torch(), dtype.name)


@functools.cache
def numpy_dtype_of_torch(dtype: Any) -> np.dtype:
    """The NumPy dtype holding a torch dtype's values bit for bit, or UnsupportedDtypeError."""
    ml = ml_view_of_torch(dtype)
    if ml is not None:
        return ml[0]
    name = _torch_name(dtype)
    if name in _STANDARD:
        return np.dtype(name)
    if name.startswith(("qint", "quint")):  # quantized: t.to() cannot leave the type
        hint = "take its values with t.dequantize(), or its stored integers with t.int_repr()"
    elif name == "complex32":
        hint = "convert first with t.to(torch.complex64)"
    else:
        hint = "convert first with t.to(<a standard dtype>)"
    raise UnsupportedDtypeError(
        f"expected a dtype NumPy or ml_dtypes can hold (got torch.{name}); {hint}"
    )


def check_cupy_dtype(dtype: Any) -> None:
    """Refuse, with the fix, a torch or NumPy dtype the installed CuPy cannot hold."""
    is_numpy = isinstance(dtype, np.dtype)
    name = dtype.name if is_numpy else _torch_name(dtype)
    if name == "bfloat16":
        if not _backends.cupy_supports_bfloat16():
            raise UnsupportedDtypeError(
                f"expected a CuPy that supports bfloat16 (got CuPy {_backends.cupy().__version__}"
                "); pip install -U 'cupy-cuda12x>=14' (or 'cupy-cuda13x>=14') with NumPy >= 2.1.2"
            )
    elif name.startswith("float8") or name == "complex32":
        raise UnsupportedDtypeError(
            f"expected a dtype CuPy can hold (got {name}); CuPy has no {name} arrays: "
            "view it as uint8 or convert it first"
        )
    elif not is_numpy:
        numpy_dtype_of_torch(dtype)  # quantized, sub-byte, float4: no NumPy/CuPy type
    elif not is_standard(dtype):
        raise UnsupportedDtypeError(
            f"expected a dtype CuPy can hold: bool, an integer, float or complex type "
            f"(got {dtype!r}); convert first with a.astype(<a numeric dtype>)"
        )


def mismatch_message(func: str, want: np.dtype, got: np.dtype, castable: bool = False) -> str:
    """The message, with the fix, for an ``out`` of dtype ``got`` where ``want`` was expected."""
    if want.newbyteorder("=") == got.newbyteorder("="):
        hint = f"the byte order differs: allocate out with dtype {want.str!r}"
    elif is_ml_dtype(want):
        hint = f"use the ml_dtypes dtype ml_dtypes.{want.name}"
    else:
        hint = f"allocate out with dtype {want}"
    if castable and _floating(want) and _floating(got):
        hint += f", or pass dtype=numpy.{got.name} to cast on the way"
    return f"{func} expected out of dtype {want} (got {got}); {hint}"


def _floating(dtype: np.dtype) -> bool:
    """float16/32/64, or an ``ml_dtypes`` floating type (bfloat16, float8...)."""
    return dtype.kind == "f" or (is_ml_dtype(dtype) and dtype.name.startswith(("bfloat", "float")))


def check_cast(have: np.dtype, want: Any, func: str) -> np.dtype | None:
    """The dtype to cast to on the way (floating dtypes only), or None for a bit copy."""
    if want is None:
        return None
    try:
        target = np.dtype(want)
    except TypeError as exc:
        raise InvalidTypeError(f"{func} expected dtype to be a NumPy dtype (got {want!r})") from exc
    if target == have:
        return None
    if not (_floating(have) and _floating(target)):
        raise InvalidValueError(
            f"{func} expected a cast between floating dtypes (got {have} to {target}); for "
            "other dtypes copy first and call .astype() on the result"
        )
    return target


def numpy_view_of_cpu_tensor(t: torch.Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a CPU tensor's memory, ignoring conj/neg bits."""
    ml = ml_view_of_torch(t.dtype)
    if ml is not None:
        return t.view(ml[1]).numpy().view(ml[0])
    numpy_dtype_of_torch(t.dtype)  # raises UnsupportedDtypeError
    return t.numpy()


def host_values(x: Any) -> np.ndarray:
    """A host chunk's values as NumPy (a tensor's conjugate/negative bit applied)."""
    if isinstance(x, np.ndarray):
        return x
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    return numpy_view_of_cpu_tensor(x)


def bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed with a same-sized integer dtype for ml_dtypes types."""
    view = int_view_of_numpy(a.dtype)
    return a if view == a.dtype else a.view(view)
