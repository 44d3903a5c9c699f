"""A :func:`~interop.torch_op`'s schema from its annotations, and :func:`array_namespace`."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _backends
from ..arrays import dlpack_device, not_an_array
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["Array", "array_namespace"]


class Array:
    """Annotation marker (no instances): an array parameter or return of a :func:`torch_op`.

    Unannotated or ``Array``: a tensor, received as a CuPy or NumPy array (``Optional``:
    optional); ``int``, ``float``, ``bool``, ``str`` and ``list``/``Optional`` of them
    pass through. Returns: ``Array``, a ``tuple`` of them, or ``None``.
    """

    def __new__(cls, *args: object, **kwargs: object) -> Array:
        raise InvalidTypeError(
            "expected interop.Array in an annotation (got a call interop.Array(...)); it "
            "has no instances"
        )


def _namespace_of(x: Any) -> types.ModuleType:
    if isinstance(x, np.ndarray | np.generic):
        return np
    if _backends.is_cupy_array(x):
        return sys.modules["cupy"]
    if _backends.is_torch_tensor(x):
        if x.device.type in ("cpu", "cuda"):
            return np if x.device.type == "cpu" else _backends.cupy()
        raise InvalidValueError(
            f"array_namespace expected a CPU or CUDA tensor (got a tensor on {x.device}); "
            "move it with t.cpu() or t.cuda()"
        )
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        on_host, _ = dlpack_device(x, "array_namespace")
        return np if on_host else _backends.cupy()
    if hasattr(x, "__cuda_array_interface__"):
        return _backends.cupy()
    raise not_an_array("array_namespace", x)


def array_namespace(*arrays: object) -> types.ModuleType:
    """The array library of ``arrays``, ``cupy`` or ``numpy`` (``xp = interop.array_namespace(x)``).

    Parameters
    ----------
    *arrays : array
        Arrays or tensors (CPU: NumPy, CUDA: CuPy), as :func:`interop.to_numpy` takes.

    Returns
    -------
    module
        ``numpy`` or ``cupy``; nothing is copied.

    Raises
    ------
    InvalidTypeError
        No argument, or one that is not an array.
    InvalidValueError
        Arrays of both libraries, or a tensor on a device other than CPU or CUDA.
    BackendUnavailableError
        Device data, and CuPy is not installed.
    """
    if not arrays:
        raise InvalidTypeError("array_namespace expected at least one array (got none)")
    xp = _namespace_of(arrays[0])
    for x in arrays[1:]:
        if (other := _namespace_of(x)) is not xp:
            raise InvalidValueError(
                f"array_namespace expected arrays of one library (got {xp.__name__} and "
                f"{other.__name__}); convert them first with interop.to_numpy or interop.to_cupy"
            )
    return xp


_SCALARS: tuple[type, ...] = (int, float, bool, str)

# What a parameter is: an array, an optional array, or a value passed as it is.
ARRAY, OPTIONAL_ARRAY, VALUE = "array", "optional array", "value"


class Param(typing.NamedTuple):
    name: str
    kind: str  # ARRAY, OPTIONAL_ARRAY or VALUE
    position: int | None  # None: keyword-only
    torch_type: Any  # the annotation PyTorch's schema inference sees
    annotation: Any  # the user's, for messages


def _is_optional(hint: Any) -> Any | None:
    """``X`` for ``Optional[X]`` / ``X | None``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def _value_type(hint: Any) -> Any | None:
    """The schema type of a pass-through annotation, or None if not one."""
    if hint in _SCALARS:
        return hint
    if typing.get_origin(hint) in (list, Sequence):
        (item,) = typing.get_args(hint) or (None,)
        if item in (int, float, bool):
            return list[item]  # type: ignore[valid-type]
    return None


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return f"{hint.__module__}.{hint.__qualname__}".removeprefix("builtins.")
    return repr(hint)


def parameters(fn: Callable[..., Any], op: str) -> tuple[list[Param], Any]:
    """The parameters of ``fn`` with their schema types, and its return hint (or ``empty``)."""
    th = _backends.torch()
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # a string annotation naming something undefined
        raise InvalidTypeError(
            f"torch_op {op!r} expected annotations it can evaluate (got {type(exc).__name__}: "
            f"{exc}); import the names the annotations use at module level"
        ) from exc
    params: list[Param] = []
    for position, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            names: dict[Any, str] = {p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}
            what = names.get(p.kind, "'/'")
            raise InvalidTypeError(
                f"torch_op {op!r} expected named parameters (got {what} in the signature of "
                f"{fn.__qualname__}); name each parameter"
            )
        hint = hints.get(name, p.empty)
        inner = _is_optional(hint)
        if hint is p.empty or hint is Array or inner is Array:
            optional = inner is Array or p.default is None
            kind = OPTIONAL_ARRAY if optional else ARRAY
            torch_type = typing.Optional[th.Tensor] if optional else th.Tensor  # noqa: UP045
            if not optional and p.default is not p.empty:
                raise InvalidTypeError(
                    f"torch_op {op!r} expected array parameter {name!r} to have no default or "
                    f"None (got {p.default!r}); annotate it (e.g. {name}: float = "
                    f"{p.default!r}) if it is not an array"
                )
            if p.kind == p.KEYWORD_ONLY:
                raise InvalidTypeError(
                    f"torch_op {op!r} expected array parameter {name!r} before any '*' (got it "
                    "keyword-only); move it before the '*'"
                )
        elif (value := _value_type(hint if inner is None else inner)) is not None:
            kind, torch_type = VALUE, value if inner is None else typing.Optional[value]  # noqa: UP045
            default = p.default
            # PyTorch's schema inference takes scalar defaults only
            if default is not p.empty and default is not None and not isinstance(default, _SCALARS):
                raise InvalidTypeError(
                    f"torch_op {op!r} expected parameter {name!r} to have no default or None "
                    f"(got {default!r}); declare {name}: Optional[{_type_name(value)}] = None "
                    f"and begin with {name} = {default!r} if {name} is None else {name}"
                )
        else:
            raise InvalidTypeError(
                f"torch_op {op!r} expected parameter {name!r} to be annotated interop.Array (or "
                "no annotation), int, float, bool, str, list[int], list[float], list[bool], or "
                f"Optional of those (got {_type_name(hint)}); pass other values as tensors"
            )
        keyword_only = p.kind == p.KEYWORD_ONLY
        params.append(Param(name, kind, None if keyword_only else position, torch_type, hint))
    return params, hints.get("return", inspect.Parameter.empty)


def output_count(ret: Any, like: tuple[int, ...] | None, single: bool, op: str) -> int | None:
    """How many arrays the function returns: None for one (not a tuple), or a tuple's length."""
    if ret is inspect.Parameter.empty:
        return None if like is None or single else len(like)
    if ret is Array:
        count: int | None = None
    elif ret is None or ret is type(None):
        count = 0
    elif typing.get_origin(ret) is tuple and all(a is Array for a in typing.get_args(ret)):
        count = len(typing.get_args(ret))
        if not count:
            raise InvalidTypeError(f"torch_op {op!r} expected at least one output (got tuple[()])")
    else:
        raise InvalidTypeError(
            f"torch_op {op!r} expected the return annotation to be interop.Array, a tuple of "
            f"them, or None (got {_type_name(ret)})"
        )
    if like is not None and (None if single else len(like)) != count:
        said = "one array" if count is None else f"{count} arrays"
        wanted = f"like={like[0]!r}" if single else f"like= of {len(like)} entries"
        raise InvalidTypeError(
            f"torch_op {op!r} expected like= to describe each output (got {wanted} for a "
            f"function annotated to return {said})"
        )
    return count


def like_positions(like: Any, params: list[Param], op: str) -> tuple[tuple[int, ...], bool]:
    """``like`` as positions of array parameters, and whether it was a single entry."""
    single = not isinstance(like, tuple)
    entries = (like,) if single else like
    if not entries:
        raise InvalidTypeError(
            f"torch_op {op!r} expected like= to name at least one input (got ())"
        )
    names = {p.name: i for i, p in enumerate(params)}
    found = []
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, int | str):
            raise InvalidTypeError(
                f"torch_op {op!r} expected like= to be a parameter's index or name, a tuple of "
                f"them, or None (got {entry!r})"
            )
        if isinstance(entry, str) and entry not in names:
            raise InvalidValueError(
                f"torch_op {op!r} expected like= to name a parameter, one of {sorted(names)} "
                f"(got {entry!r})"
            )
        if isinstance(entry, int) and not 0 <= entry < len(params):
            raise InvalidValueError(
                f"torch_op {op!r} expected like= to be an index between 0 and "
                f"{len(params) - 1} (got {entry!r})"
            )
        index = names[entry] if isinstance(entry, str) else entry
        if params[index].kind != ARRAY:
            raise InvalidTypeError(
                f"torch_op {op!r} expected like={entry!r} to name an array parameter (got "
                f"{params[index].name!r}, {_type_name(params[index].annotation)})"
            )
        found.append(index)
    return tuple(found), single
