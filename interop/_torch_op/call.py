"""CuPy and NumPy functions as PyTorch operators: ``interop.torch_op``.

The decorator turns a function of arrays into a ``torch.library.custom_op``:

* its schema is the function's signature, array parameters as ``Tensor``;
* each call converts the tensors to arrays of their own library without a
  copy (CuPy for CUDA tensors, NumPy for CPU tensors), runs the function on
  PyTorch's current stream with CuPy allocating from PyTorch's caching
  allocator, and hands the returned arrays back as tensors;
* outputs that alias an input or each other, or that are not C-contiguous,
  are copied (PyTorch forbids the first, and compiled code assumes the
  layout the fake implementation promised);
* ``like=`` derives the fake implementation; without it, tracing the op
  raises :class:`~interop.errors.MissingFakeError` until one is registered.

Neither torch nor cupy is imported before the decorator is used.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _backends, dtypes
from ..allocator import StreamMismatchError, _thread_setting
from ..arrays import DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, describe, dlpack_device
from ..errors import CopyRequiredError, InvalidTypeError, InvalidValueError, MissingFakeError
from ..exchange import _torch_fast, to_cupy, to_numpy, to_torch
from ..streams import (
    LEGACY_DEFAULT,
    PER_THREAD_DEFAULT,
    cupy_consumer_handle,
    cupy_stream,
    torch_stream_handle,
)

__all__ = ["Array", "array_namespace", "torch_op"]


class Array:
    """Annotation marker: an array parameter (or return value) of a
    :func:`torch_op`.

    A parameter annotated ``interop.Array`` (or not annotated at all) is a
    ``Tensor`` in the operator's schema; the function receives it as an array
    of the tensor's own library: ``cupy.ndarray`` for a CUDA tensor,
    ``numpy.ndarray`` for a CPU tensor. ``Optional[interop.Array]`` is an
    optional tensor (``None`` passes through). A return annotation, if given,
    is ``interop.Array``, a ``tuple`` of them, or ``None``.

    The class has no instances: it only marks annotations.
    """

    def __new__(cls, *args: object, **kwargs: object) -> Array:
        raise InvalidTypeError(
            "expected interop.Array in an annotation (got a call interop.Array(...)); it marks "
            "array parameters of an interop.torch_op and has no instances"
        )


# --------------------------------------------------------------------------- array_namespace


def _namespace_of(x: Any) -> tuple[str, types.ModuleType]:
    if isinstance(x, np.ndarray | np.generic):
        return "numpy", np
    if _backends.is_cupy_array(x):
        return "cupy", sys.modules["cupy"]
    if _backends.is_torch_tensor(x):
        kind = x.device.type
        if kind == "cpu":
            return "numpy", np
        if kind == "cuda":
            return "cupy", _backends.cupy()
        raise InvalidValueError(
            f"array_namespace expected a CPU or CUDA tensor (got a tensor on {x.device}); "
            "move it first with t.cpu() or t.cuda()"
        )
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        kind, _ = dlpack_device(x, "array_namespace")
        if kind in (DL_CPU, DL_CUDA_HOST):
            return "numpy", np
        if kind in (DL_CUDA, DL_CUDA_MANAGED):
            return "cupy", _backends.cupy()
        raise InvalidValueError(
            f"array_namespace expected CPU or CUDA data (got DLPack device {kind!r})"
        )
    if hasattr(x, "__cuda_array_interface__"):
        return "cupy", _backends.cupy()
    raise InvalidTypeError(
        f"array_namespace expected a NumPy or CuPy array, a PyTorch tensor, or an object with "
        f"__dlpack__ or __cuda_array_interface__ (got {describe(x)})"
    )


def array_namespace(*arrays: object) -> types.ModuleType:
    """The array library of ``arrays``: ``cupy`` or ``numpy``.

    Inside a :func:`torch_op` this is how a function finds the module to
    call: ``xp = interop.array_namespace(x)`` gives ``cupy`` for the arrays
    of a CUDA tensor and ``numpy`` for those of a CPU tensor, so one body
    serves both devices.

    Parameters
    ----------
    *arrays : array
        One or more NumPy or CuPy arrays, PyTorch tensors (a CPU tensor's
        library is NumPy, a CUDA tensor's CuPy), or objects with
        ``__dlpack__`` or ``__cuda_array_interface__``.

    Returns
    -------
    module
        The ``numpy`` or the ``cupy`` module itself. CuPy is imported only
        for device data; nothing is imported for a NumPy array or a CuPy
        array. Nothing is copied or synchronised.

    Raises
    ------
    InvalidTypeError
        No argument, or an argument that is not an array (a ``TypeError``).
    InvalidValueError
        Arrays of both libraries (a ``ValueError``), or a tensor on a device
        other than CPU or CUDA.
    BackendUnavailableError
        A CUDA tensor or device object, and CuPy is not installed.
    """
    if not arrays:
        raise InvalidTypeError("array_namespace expected at least one array (got none)")
    name, xp = _namespace_of(arrays[0])
    for x in arrays[1:]:
        other, _ = _namespace_of(x)
        if other != name:
            raise InvalidValueError(
                f"array_namespace expected arrays of one library (got {name} and {other}); "
                "convert them first with interop.to_numpy or interop.to_cupy"
            )
    return xp


# --------------------------------------------------------------------------- the schema

_SCALARS: tuple[type, ...] = (int, float, bool, str)
_LISTS: tuple[type, ...] = (int, float, bool)

# What a parameter is: an array, an optional array, or a value passed as it is.
_ARRAY, _OPTIONAL_ARRAY, _VALUE = "array", "optional array", "value"


class _Param(typing.NamedTuple):
    name: str
    kind: str  # _ARRAY, _OPTIONAL_ARRAY or _VALUE
    position: int | None  # None: keyword-only
    torch_type: Any  # the annotation PyTorch's schema inference sees
    annotation: Any  # the user's, for messages


def _is_optional(hint: Any) -> Any | None:
    """``X`` for ``Optional[X]`` / ``X | None``, else None."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
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
        if item in _LISTS:
            return list[item]  # type: ignore[valid-type]
    return None


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return f"{hint.__module__}.{hint.__qualname__}".removeprefix("builtins.")
    return repr(hint)


_SUPPORTED = (
    "interop.Array (or no annotation), Optional[interop.Array], int, float, bool, str, "
    "list[int], list[float], list[bool], or Optional of those"
)


def _params(fn: Callable[..., Any], op: str) -> tuple[list[_Param], Any]:
    """The parameters of ``fn`` with their schema types, and its return hint
    (``inspect.Parameter.empty`` when not annotated)."""
    th = _backends.torch()
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # a string annotation naming something undefined
        raise InvalidTypeError(
            f"torch_op {op!r} expected annotations it can evaluate (got {type(exc).__name__}: "
            f"{exc}); import the names the annotations use at module level"
        ) from exc
    params: list[_Param] = []
    for position, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            names: dict[Any, str] = {p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}
            what = names.get(p.kind, "'/'")
            raise InvalidTypeError(
                f"torch_op {op!r} expected named parameters (got {what} in the signature of "
                f"{fn.__qualname__}); a PyTorch operator has a fixed list of parameters"
            )
        hint = hints.get(name, inspect.Parameter.empty)
        inner = _is_optional(hint)
        if hint is inspect.Parameter.empty or hint is Array:
            kind = _OPTIONAL_ARRAY if p.default is None else _ARRAY
        elif inner is Array:
            kind = _OPTIONAL_ARRAY
        elif (value := _value_type(hint)) is not None:
            kind, torch_type = _VALUE, value
        elif inner is not None and (value := _value_type(inner)) is not None:
            kind, torch_type = _VALUE, typing.Optional[value]  # noqa: UP045
        else:
            raise InvalidTypeError(
                f"torch_op {op!r} expected parameter {name!r} to be annotated {_SUPPORTED} "
                f"(got {_type_name(hint)}); PyTorch's schema has no such type: pass such "
                "values as tensors or scalars"
            )
        default = p.default
        if (
            kind == _VALUE
            and default is not p.empty
            and default is not None
            and not isinstance(default, _SCALARS)  # infer_schema takes scalar defaults only
        ):
            shown = _type_name(hint if inner is None else inner)
            raise InvalidTypeError(
                f"torch_op {op!r} expected parameter {name!r} to have no default or None (got "
                f"{default!r}); PyTorch's schema holds no list defaults: declare {name}: "
                f"Optional[{shown}] = None and begin the function with {name} = "
                f"{default!r} if {name} is None else {name}"
            )
        if kind == _ARRAY:
            torch_type = th.Tensor
            if p.default is not inspect.Parameter.empty:
                raise InvalidTypeError(
                    f"torch_op {op!r} expected array parameter {name!r} to have no default or "
                    f"None (got {p.default!r}); annotate it (e.g. {name}: float = "
                    f"{p.default!r}) if it is not an array"
                )
        elif kind == _OPTIONAL_ARRAY:
            torch_type = typing.Optional[th.Tensor]  # noqa: UP045
        if kind != _VALUE and p.kind == p.KEYWORD_ONLY:
            raise InvalidTypeError(
                f"torch_op {op!r} expected array parameter {name!r} before any '*' (got it "
                "keyword-only); PyTorch's custom operators take tensors as positional parameters"
            )
        params.append(
            _Param(name, kind, None if p.kind == p.KEYWORD_ONLY else position, torch_type, hint)
        )
    return params, hints.get("return", inspect.Parameter.empty)


def _outputs(ret: Any, like: tuple[int, ...] | None, single: bool, op: str) -> int | None:
    """How many arrays the function returns: None for one (not a tuple), 0 for
    none, n for a tuple of n."""
    if ret is inspect.Parameter.empty:
        if like is None or single:
            return None
        return len(like)
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
    if like is not None and (len(like) if not single else None) != count:
        said = "one array" if count is None else f"{count} arrays"
        wanted = f"like={like[0]!r}" if single else f"like= of {len(like)} entries"
        raise InvalidTypeError(
            f"torch_op {op!r} expected like= to describe each output (got {wanted} for a "
            f"function annotated to return {said}); give one entry per output"
        )
    return count


def _like_positions(like: Any, params: list[_Param], op: str) -> tuple[tuple[int, ...], bool]:
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
                f"torch_op {op!r} expected like= to be a parameter's index or name, or a tuple "
                f"of them (got {entry!r})"
            )
        if isinstance(entry, str):
            if entry not in names:
                raise InvalidValueError(
                    f"torch_op {op!r} expected like= to name a parameter, one of "
                    f"{sorted(names)} (got {entry!r})"
                )
            index = names[entry]
        else:
            if not 0 <= entry < len(params):
                raise InvalidValueError(
                    f"torch_op {op!r} expected like= to be an index between 0 and "
                    f"{len(params) - 1} (got {entry!r})"
                )
            index = entry
        if params[index].kind != _ARRAY:
            raise InvalidTypeError(
                f"torch_op {op!r} expected like={entry!r} to name an array parameter (got "
                f"{params[index].name!r}, {_type_name(params[index].annotation)}); outputs "
                "take the shape, dtype and device of a tensor input"
            )
        found.append(index)
    return tuple(found), single


# --------------------------------------------------------------------------- the op class


@functools.cache
def _op_class() -> type:
    """``CustomOpDef`` with ``__call__`` that names the parameter a non-tensor
    was passed for (PyTorch raises a ``RuntimeError`` for it)."""
    from torch._library.custom_ops import CustomOpDef

    class TorchOp(CustomOpDef):
        """A ``torch.library.custom_op`` made by :func:`interop.torch_op`."""

        _interop_call: _Call

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return self._opoverload(*args, **kwargs)
            except RuntimeError as exc:
                better = self._interop_call.argument_error(args, kwargs)
                if better is None:
                    raise
                raise better from exc

    TorchOp.__module__ = __name__
    TorchOp.__qualname__ = TorchOp.__name__
    return TorchOp


# --------------------------------------------------------------------------- one call


class _TorchBlock:
    """The owner of CuPy memory served by PyTorch's caching allocator: a
    ``uint8`` tensor, freed (back to PyTorch's pool) when CuPy frees it."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


class _TorchMemory:
    """A CuPy allocator (``size -> MemoryPointer``) that allocates
    ``torch.empty(size, dtype=torch.uint8)`` on PyTorch's current stream of
    ``device``: ordinary PyTorch storage, which PyTorch's CUDA graphs and
    CUDA-graph trees account for like any tensor's."""

    __slots__ = ("cp", "device", "stream_ptr", "th", "torch_device")

    def __init__(self, th: Any, cp: Any, device: int, stream_ptr: int) -> None:
        self.th, self.cp, self.device, self.stream_ptr = th, cp, device, stream_ptr
        self.torch_device = th.device("cuda", device)

    def __call__(self, size: int) -> Any:
        cp = self.cp
        device = cp.cuda.runtime.getDevice()
        current = cp.cuda.get_current_stream().ptr
        if device != self.device or current != self.stream_ptr:
            raise StreamMismatchError(
                f"expected CuPy to allocate on PyTorch's current stream of cuda:{self.device} "
                f"inside an interop.torch_op (got stream {current:#x} of cuda:{device}); do not "
                "switch CuPy's device or stream inside the function: it already runs on "
                "PyTorch's current stream"
            )
        tensor = self.th.empty((size,), dtype=self.th.uint8, device=self.torch_device)
        memory = cp.cuda.UnownedMemory(tensor.data_ptr(), size, _TorchBlock(tensor), device)
        return cp.cuda.MemoryPointer(memory, 0)


_graph_plans: list[Any] = []  # cuFFT plans first made in a graph capture: the graph replays them


def _plans_to_own_pool(cp: Any, th: Any) -> None:
    """After a call on the current device: the cuFFT plans CuPy cached during it, whose
    work areas came from the call's PyTorch-backed allocator, leave CuPy's plan cache
    (a cache outlives the call; PyTorch's pool, or a graph's, must not hold it). Outside
    a capture each is made again from CuPy's own pool under its key, so later calls find
    it; the one made here goes back to PyTorch's pool on the call's stream, as any
    temporary. In a capture it is kept for the process's life instead: the graph replays
    it, and destroying it now would break the capture."""
    cufft = sys.modules.get("cupy.cuda.cufft")
    if cufft is None:  # no plan was ever made in this process
        return
    cache = cp.fft.config.get_plan_cache()
    if not cache.get_curr_size():
        return
    ours = [(key, node.plan) for key, node in cache if _torch_backed(node.plan.work_area)]
    if not ours:
        return
    for key, _ in ours:
        del cache[key]
    if th.cuda.is_current_stream_capturing():
        _graph_plans.extend(plan for _, plan in ours)
        return
    try:
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            for key, plan in ours:
                if type(plan) is cufft.Plan1d and len(key) == 4:  # cupy.fft's key: no callbacks
                    cache[key] = cufft.Plan1d(*key[:3], devices=key[3])
                elif type(plan) is cufft.PlanNd and len(key) == 12:
                    cache[key] = cufft.PlanNd(*key)
    except cp.cuda.memory.OutOfMemoryError:
        pass  # no room to cache them: the op's result stands, the next call plans again


def _torch_backed(area: Any) -> bool:
    """A plan's work area (a MemoryPointer, a list of them, or None) holds memory of
    the call's allocator."""
    areas = area if isinstance(area, list) else [area]
    return any(
        isinstance(getattr(a.mem, "_owner", None), _TorchBlock) for a in areas if a is not None
    )


_STREAMS: dict[tuple[int, int], Any] = {}  # (device, handle) -> CuPy stream object
_STREAMS_LOCK = threading.Lock()


def _cupy_stream_for(cp: Any, handle: int, device: int) -> Any:
    """A CuPy stream object for PyTorch's stream ``handle`` (cached: making
    one costs microseconds). PyTorch's default stream is the legacy one,
    which CuPy's null stream is not under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM."""
    key = (device, handle)
    found = _STREAMS.get(key)
    if found is not None:
        return found
    if handle == 0 and cupy_consumer_handle(cp.cuda.Stream.null) == PER_THREAD_DEFAULT:
        made = cupy_stream(LEGACY_DEFAULT, device)
    else:
        made = cupy_stream(handle, device)
    with _STREAMS_LOCK:
        if len(_STREAMS) > 256:  # streams come and go: keep the cache small
            _STREAMS.clear()
        _STREAMS[key] = made
    return made


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _Call:
    """Everything a call of one op needs, worked out at decoration."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        params: list[_Param],
        outputs: int | None,
        like: tuple[int, ...] | None,
        mutated: set[str],
    ) -> None:
        self.fn = fn
        self.name = name
        self.params = params
        self.outputs = outputs
        self.like = like  # indices into params
        self.arrays = [p for p in params if p.kind != _VALUE]
        # like= as indices into self.arrays
        self.like_arrays = (
            None if like is None else tuple(self.arrays.index(params[i]) for i in like)
        )
        # a mutated argument is handed over without a copy or refused: a copy's writes are lost
        self.copies = tuple(False if p.name in mutated else None for p in self.arrays)
        # the common case, answered first: every array parameter required and positional
        plain = all(p.kind == _ARRAY and p.position is not None for p in self.arrays)
        self.positions: tuple[int, ...] | None = (
            tuple(p.position for p in self.arrays if p.position is not None)
            if plain and self.arrays
            else None
        )
        self.needed = max(self.positions) + 1 if self.positions else 0
        self.cuda_checked = False

    # ------------------------------------------------------------------ arguments

    def argument_error(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
        """The error to raise for arguments PyTorch refused, or None to keep PyTorch's."""
        th = _backends.torch()
        values = dict(kwargs)
        for p, value in zip(self.params, args, strict=False):
            values[p.name] = value
        for p in self.arrays:
            if p.name not in values:
                continue
            value = values[p.name]
            if value is None and p.kind == _OPTIONAL_ARRAY:
                continue
            if not isinstance(value, th.Tensor):
                return self._not_a_tensor(p, value)
        return None

    def _not_a_tensor(self, p: _Param, value: Any) -> InvalidTypeError:
        if value is None:
            hint = "; annotate it Optional[interop.Array] if None is allowed"
        elif isinstance(value, int | float | complex | str):
            hint = ""
        else:
            hint = "; convert it first with interop.to_torch(x)"
        return InvalidTypeError(
            f"{self.name} expected a torch.Tensor for parameter {p.name!r} (got "
            f"{describe(value)}){hint}"
        )

    def tensors(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The tensor of each array parameter (None for an absent optional one)."""
        positions = self.positions
        if positions is not None and len(args) >= self.needed:
            values = [args[i] for i in positions]
        else:
            values = []
            for p in self.arrays:
                if p.position is not None and p.position < len(args):
                    values.append(args[p.position])
                else:
                    values.append(kwargs.get(p.name))
        for p, v in zip(self.arrays, values, strict=True):
            if v is None and p.kind == _ARRAY:  # PyTorch passes None on for a Tensor
                raise self._not_a_tensor(p, v)
        return values

    def device(self, values: list[Any]) -> tuple[str, int]:
        """``("cpu", -1)`` or ``("cuda", index)`` of the tensors.

        Raises
        ------
        InvalidValueError
            Tensors on different devices, or on a device other than CPU or CUDA.
        """
        present = [v for v in values if v is not None]
        if not present:
            return "cpu", -1  # nothing to tell: NumPy
        first = present[0]
        if first.is_cpu:
            if all(v.is_cpu for v in present):
                return "cpu", -1
        elif first.is_cuda:
            index = first.get_device()
            if all(v.is_cuda and v.get_device() == index for v in present):
                return "cuda", index
        self.check_one_device(values)
        raise InvalidValueError(
            f"{self.name} expected CPU or CUDA tensors (got {first.device}); move them first "
            "with t.cpu() or t.cuda()"
        )

    def check_one_device(self, values: list[Any]) -> None:
        """Raise unless the tensors (None: absent) are on one device."""
        present = [v for v in values if v is not None]
        if len(present) < 2:
            return
        first = present[0]
        if any(v.device != first.device for v in present):
            where = ", ".join(
                f"{p.name!r} on {v.device}"
                for p, v in zip(self.arrays, values, strict=True)
                if v is not None
            )
            moved = next(
                p.name
                for p, v in zip(self.arrays, values, strict=True)
                if v is not None and v.device != first.device
            )
            raise InvalidValueError(
                f"{self.name} expected its tensors on one device (got {where}); move them "
                f"first, e.g. {moved}.to({str(first.device)!r})"
            )

    # ------------------------------------------------------------------ running

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The operator's kernel: tensors in, tensors out."""
        positions = self.positions
        if positions is not None and len(args) >= self.needed:
            # the common case first, without tensors()'s checks: every array
            # parameter given positionally, every tensor on the CPU (a per-call
            # cost: about 1 us of 17 on a 2-core CPU)
            values = [args[i] for i in positions]
            for v in values:
                if v is None or not v.is_cpu:
                    break
            else:
                return self._run(args, kwargs, values, to_numpy, None)
        values = self.tensors(args, kwargs)
        kind, index = self.device(values)
        if kind == "cpu":
            return self._run(args, kwargs, values, to_numpy, None)
        return self._run_cuda(args, kwargs, values, index)

    def _run_cuda(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], values: list[Any], index: int
    ) -> Any:
        if not self.cuda_checked:
            _backends.require_cupy_device()
            self.cuda_checked = True
        cp = sys.modules["cupy"]
        th = sys.modules["torch"]
        # Both libraries on the inputs' device; CuPy on PyTorch's current stream
        # there, allocating from PyTorch's caching allocator: this thread only,
        # for the call.
        previous_device = cp.cuda.runtime.getDevice()
        if previous_device != index:
            cp.cuda.runtime.setDevice(index)
        torch_device = th.cuda.current_device()
        if torch_device != index:
            th.cuda.set_device(index)
        try:
            stream = _cupy_stream_for(cp, torch_stream_handle(index), index)
            get_allocator, set_allocator = _thread_setting(cp)
            previous = get_allocator()
            set_allocator(_TorchMemory(th, cp, index, stream.ptr))
            try:
                with stream:
                    try:
                        return self._run(args, kwargs, values, to_cupy, index)
                    finally:  # a function that failed may have cached a plan first
                        _plans_to_own_pool(cp, th)
            finally:
                set_allocator(previous)
        finally:
            if torch_device != index:
                th.cuda.set_device(torch_device)
            if previous_device != index:
                cp.cuda.runtime.setDevice(previous_device)

    def _run(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        values: list[Any],
        convert: Callable[..., Any],
        index: int | None,
    ) -> Any:
        """Convert the tensors, call the function, hand its arrays back as
        tensors (``index``: the CUDA device, None on the CPU)."""
        call_args = list(args)
        inputs: list[Any] = []
        for p, v, copy in zip(self.arrays, values, self.copies, strict=True):
            if v is None:
                inputs.append(None)
                continue
            if copy is False:
                self._refuse_unwritable(p, v)
            a = convert(v) if copy is None else convert(v, copy=copy)
            inputs.append(a)
            if p.position is not None and p.position < len(call_args):
                call_args[p.position] = a
            else:
                kwargs[p.name] = a
        result = self.fn(*call_args, **kwargs)
        if self.outputs is None:
            return self._output(result, 0, inputs, None, index)
        if self.outputs == 0:
            if result is not None:
                raise InvalidTypeError(
                    f"{self.name} expected its function to return None, as annotated (got "
                    f"{describe(result)})"
                )
            return None
        if not isinstance(result, tuple | list) or len(result) != self.outputs:
            raise InvalidTypeError(
                f"{self.name} expected its function to return a tuple of {self.outputs} "
                f"arrays (got {describe(result)})"
            )
        done: list[Any] = []
        return tuple(self._output(r, i, inputs, done, index) for i, r in enumerate(result))

    def _refuse_unwritable(self, p: _Param, v: Any) -> None:
        """Raise unless the function can write tensor ``v`` of mutated parameter ``p``."""
        if v.is_conj() or v.is_neg():
            bit, fix = ("conjugate", "resolve_conj") if v.is_conj() else ("negative", "resolve_neg")
            raise CopyRequiredError(
                f"{self.name} expected parameter {p.name!r}, which it writes into (mutates_args), "
                f"without a copy (got a tensor with the {bit} bit set: its memory holds other "
                f"values); writes into a copy would be lost: pass t = {p.name}.{fix}() and read "
                "the results from t"
            )
        if any(n > 1 and s == 0 for n, s in zip(v.shape, v.stride(), strict=True)):
            raise InvalidValueError(
                f"{self.name} expected parameter {p.name!r}, which it writes into (mutates_args), "
                f"with memory of its own for each element (got a tensor of shape "
                f"{tuple(v.shape)} and strides {v.stride()}: an expanded view, whose elements "
                f"share memory); pass t = {p.name}.clone() and read the results from t"
            )

    def _output(
        self, r: Any, i: int, inputs: list[Any], done: list[Any] | None, index: int | None
    ) -> Any:
        """Output ``i`` as a tensor: C-contiguous, not sharing memory with
        ``inputs`` or the outputs ``done`` before it (it joins them)."""
        if type(r) is not np.ndarray or index is not None:
            r = self._array(r, i, index)
        xp: Any = np if index is None else sys.modules["cupy"]
        copy = not r.flags.c_contiguous
        if not copy and r.size:
            for other in inputs if done is None else (*inputs, *done):
                if other is not None and xp.may_share_memory(r, other):
                    copy = True  # PyTorch forbids outputs that alias
                    break
        if copy:
            r = r.copy(order="C")
        if done is not None:
            done.append(r)
        if self.like_arrays is not None:
            like = inputs[self.like_arrays[i]]
            if r.shape != like.shape or (
                r.dtype != like.dtype and r.dtype.newbyteorder("=") != like.dtype
            ):  # another byte order is converted by _tensor (a copy)
                raise self._unlike(i, r, like)
        return self._tensor(r, index)

    def _array(self, r: Any, i: int, index: int | None) -> Any:
        """``r`` as an array of the op's library, or the error."""
        if _backends.is_torch_tensor(r):
            r = to_cupy(r) if r.is_cuda else to_numpy(r)
        if isinstance(r, np.generic):
            r = np.asarray(r)
        if isinstance(r, np.ndarray):
            if index is not None:
                raise self._wrong_device(i, "a NumPy array", index)
            return r
        if _backends.is_cupy_array(r):
            if index is None or r.device.id != index:
                raise self._wrong_device(i, f"a CuPy array on cuda:{r.device.id}", index)
            return r
        which = "" if self.outputs is None else f" as output {i}"
        raise InvalidTypeError(
            f"{self.name} expected its function to return "
            f"{'a NumPy' if index is None else 'a CuPy'} array{which} (got {describe(r)}); "
            "return arrays of xp = interop.array_namespace(x)"
        )

    def _tensor(self, r: Any, index: int | None) -> Any:
        """A C-contiguous array as a tensor with PyTorch's contiguous strides
        (size-1 axes included, as the fake implementation says)."""
        if index is not None:
            owner = getattr(r.data.mem, "_owner", None)
            base = owner.tensor if isinstance(owner, _TorchBlock) else None
            offset = -1 if base is None else r.data.ptr - base.data_ptr()
            if base is not None and offset >= 0 and offset % r.itemsize == 0:
                # Memory PyTorch allocated during the call: a view of its storage,
                # so the output is an ordinary PyTorch tensor (CUDA-graph trees
                # checkpoint such storages).
                th = sys.modules["torch"]
                tdtype = dtypes.torch_dtype_of_numpy(r.dtype)
                out = th.empty((0,), dtype=tdtype, device=base.device)
                return out.set_(
                    base.untyped_storage(),
                    offset // r.itemsize,
                    r.shape,
                    _contiguous_strides(r.shape),
                )
        t = _torch_fast(r) if index is None else None  # the common case, answered first
        if t is None:
            t = to_torch(r)
        shape = r.shape
        if 1 in shape or 0 in shape:
            want = _contiguous_strides(shape)
            if t.stride() != want:
                t = t.as_strided(shape, want)
        return t

    def _unlike(self, i: int, r: Any, like: Any) -> InvalidValueError:
        assert self.like is not None
        p = self.params[self.like[i]]

        def shown(a: Any) -> str:
            try:
                dtype = str(dtypes.torch_dtype_of_numpy(a.dtype))
            except Exception:
                dtype = str(a.dtype)
            return f"{tuple(a.shape)}, {dtype}"

        return InvalidValueError(
            f"{self.name} expected output {i} to have the shape and dtype of input {p.name!r} "
            f"({shown(like)}), as like= says (got {shown(r)}); return arrays of that shape and "
            "dtype, or drop like= and register the fake implementation with .register_fake"
        )

    def _wrong_device(self, i: int, got: str, index: int | None) -> InvalidValueError:
        which = "its output" if self.outputs is None else f"output {i}"
        want = "a NumPy array" if index is None else f"a CuPy array on cuda:{index}"
        return InvalidValueError(
            f"{self.name} expected {which} on its inputs' device, {want} (got {got}); compute "
            "with xp = interop.array_namespace(x) so the arrays stay where the inputs are"
        )


# --------------------------------------------------------------------------- fakes


def _like_fake(call: _Call, single: bool) -> Callable[..., Any]:
    """The fake implementation ``like=`` describes: each output a new
    contiguous tensor with the shape, dtype and device of its input."""
    assert call.like_arrays is not None
    chosen = call.like_arrays

    def fake(*args: Any, **kwargs: Any) -> Any:
        values = call.tensors(args, kwargs)
        call.check_one_device(values)  # the error eager calls give (meta tensors are fine)
        outs = tuple(values[k].new_empty(values[k].shape) for k in chosen)
        return outs[0] if single else outs

    return fake


def _missing_fake(name: str, fn_name: str) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        raise MissingFakeError(
            f"{name} has no fake implementation, which torch.compile, torch.export and "
            "opcheck need to know its outputs' shapes and dtypes without running it; pass "
            "like= to interop.torch_op (outputs shaped like an input), or register one with "
            f"@{fn_name}.register_fake"
        )

    return fake


# --------------------------------------------------------------------------- registration

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*")

# name -> (op, options) of each operator torch_op registered: a name is taken for the
# whole process, but the same function may register it again (a re-import)
_REGISTERED: dict[str, tuple[Any, tuple[Any, ...]]] = {}


def _same_function(a: Any, b: Any) -> bool:
    """Whether ``b`` is ``a`` or ``a`` re-imported: same module, qualified name,
    code, signature, and the same objects in its closure."""
    if a is b:
        return True
    try:
        return (
            (a.__module__, a.__qualname__, a.__code__) == (b.__module__, b.__qualname__, b.__code__)
            and inspect.signature(a) == inspect.signature(b)
            and all(
                x.cell_contents is y.cell_contents
                for x, y in zip(a.__closure__ or (), b.__closure__ or (), strict=True)
            )
        )
    except (AttributeError, TypeError, ValueError):  # not a function, an empty cell
        return False


def _registered(th: Any, name: str, fn: Any, options: tuple[Any, ...]) -> Any:
    """None if ``name`` is free, the op torch_op made under it from the same function
    ``fn`` (re-imported), or the error."""
    previous = _REGISTERED.get(name)
    if previous is None:
        if not th._C._dispatch_has_kernel(name):
            return None
        got = "the name of an operator PyTorch already has, not made by interop.torch_op"
    elif previous[1] == options and _same_function(previous[0]._interop_call.fn, fn):
        return previous[0]
    else:
        made = previous[0]._interop_call.fn
        where = f"{getattr(made, '__module__', '?')}.{getattr(made, '__qualname__', made)}"
        got = f"the name of the operator interop.torch_op made from {where}"
    raise InvalidValueError(
        f"torch_op {name!r} expected a name no operator has yet (got {got}); an operator "
        "is registered for the whole process and another function would take it over from "
        "the first op object: choose another name (the same function, re-imported, may "
        "register again)"
    )


def _math_bits_to_kernel(th: Any, op: Any) -> None:
    """Send tensors with the conjugate or negative bit on to ``op``'s kernel, which
    refuses them for a mutated argument (PyTorch's fallback for these bits fails
    there: "Expected Tensor but got None", or an internal assert) and resolves them
    into a copy for the others."""
    keys = th._C.DispatchKey

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset.remove(keys.Conjugate).remove(keys.Negative)
        return op._opoverload.redispatch(below, *args, **kwargs)

    for key in ("Conjugate", "Negative"):
        op._lib.impl(op._name, kernel, key, with_keyset=True)


# --------------------------------------------------------------------------- the decorator


def torch_op(
    name: str,
    /,
    *,
    mutates_args: Sequence[str] | str = (),
    like: int | str | tuple[int | str, ...] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Turn a function of CuPy or NumPy arrays into a PyTorch operator.

    ::

        @interop.torch_op("mylib::scale", like=0)
        def scale(x, factor: float = 2.0):
            xp = interop.array_namespace(x)  # cupy for CUDA tensors, numpy for CPU
            return xp.multiply(x, factor)

        y = scale(torch.ones(3, device="cuda"))  # a tensor

    Parameters
    ----------
    name : str
        The operator's name, ``"namespace::name"`` (``torch.ops.namespace.name``),
        each part ASCII letters, digits and underscores. Operators are
        registered for the whole process: each name once, except that the
        same function re-imported (same module, qualified name, code,
        signature, closure and options) gets the op made the first time,
        which then runs it.
    mutates_args : sequence of str or "unknown"
        The array parameters the function writes into, as in
        ``torch.library.custom_op``. These are handed over without a copy or
        refused before the function runs: a copy would lose the writes.
    like : int, str, tuple of them, or None
        The fake implementation: output ``k`` has the shape, dtype and
        device of the input that ``like[k]`` names (a parameter's index or
        name; one entry for a function that returns one array). Each call
        checks that the outputs match. ``None``: register one yourself with
        ``op.register_fake`` before tracing the op.

    Returns
    -------
    callable
        A decorator. It returns the ``torch.library.custom_op`` object
        itself (a ``CustomOpDef``): call it with tensors; use
        ``.register_autograd``, ``.register_fake``, ``.register_kernel`` and
        ``torch.library.opcheck`` as with any custom op.

    Notes
    -----
    Parameters without an annotation, or annotated ``interop.Array``, are
    tensors; ``Optional[interop.Array]`` (or a default of ``None``) is an
    optional tensor. Parameters annotated ``int``, ``float``, ``bool``,
    ``str``, ``list[int]``, ``list[float]``, ``list[bool]`` or ``Optional``
    of those pass through. A return annotation, if given, is
    ``interop.Array``, a ``tuple`` of them, or ``None``; without one the
    function returns one array, or as many as ``like`` has entries when it
    is a tuple.

    Copy semantics: inputs reach the function without a copy, as
    :func:`interop.to_cupy` (CUDA tensors) and :func:`interop.to_numpy` (CPU
    tensors) give them (``bfloat16`` as ``ml_dtypes.bfloat16`` in NumPy,
    non-contiguous tensors as strided views). Returned arrays become tensors
    without a copy, as :func:`interop.to_torch` gives them, except: an
    output that shares memory with an input or an earlier output, or that
    is not C-contiguous, is copied into a new C-contiguous array, since
    PyTorch forbids outputs that alias and compiled code relies on the
    layout of the fake implementation (contiguous).

    Stream order: a CUDA call runs on PyTorch's current stream of the
    inputs' device, which is CuPy's current stream (and device) for the
    duration of the call; CuPy allocates from PyTorch's caching allocator on
    that stream meanwhile. Nothing is synchronised, so the op works inside
    ``torch.cuda.graph`` capture and ``torch.compile(mode="reduce-overhead")``.
    The function must not switch CuPy's stream or device.

    Raises
    ------
    InvalidTypeError
        At decoration: a name that is not a ``str``; a parameter annotation
        PyTorch's schema cannot hold, a list parameter with a list default,
        ``*args``/``**kwargs``, a keyword-only array parameter, a return
        annotation other than arrays, or a ``like`` that names no array
        parameter. At a call: a non-tensor for an array parameter; a
        function that returns something other than an array (or the
        annotated number of them), naming the op.
    InvalidValueError
        A name not ``"namespace::name"``; at decoration, a name another
        operator (or another function) already has. At a call: tensors on
        different devices; an expanded view (a stride of 0) for a mutated
        argument; an output on another device than the inputs; an output
        whose shape or dtype (byte order aside) differs from what ``like``
        says.
    CopyRequiredError
        At a call: a tensor with the conjugate or negative bit set for a
        mutated argument.
    MissingFakeError
        Tracing an op without ``like`` and without a registered fake
        implementation (``torch.export``, meta tensors; ``torch.compile`` and
        ``opcheck`` raise their own error with it as the cause).
    BackendUnavailableError
        PyTorch is not installed (at decoration), or CuPy is not and a CUDA
        tensor is passed.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        error = InvalidValueError if isinstance(name, str) else InvalidTypeError
        raise error(
            f"torch_op expected a name 'namespace::name' (got {name!r}), each part letters, "
            "digits and underscores, not starting with a digit: e.g. 'mylib::scale'"
        )
    th = _backends.torch()
    if like is not None and not isinstance(like, int | str | tuple):
        raise InvalidTypeError(
            f"torch_op {name!r} expected like= to be a parameter's index or name, a tuple of "
            f"them, or None (got {like!r})"
        )

    def decorate(fn: Callable[..., Any]) -> Any:
        if not callable(fn):
            raise InvalidTypeError(f"torch_op {name!r} expected a function (got {describe(fn)})")
        params, ret = _params(fn, name)
        positions, single = (None, True) if like is None else _like_positions(like, params, name)
        outputs = _outputs(ret, positions, single, name)
        if isinstance(mutates_args, str):
            mutated = (
                {p.name for p in params if p.kind != _VALUE} if mutates_args == "unknown" else set()
            )
        else:
            mutated = set(mutates_args)
        call = _Call(fn, name, params, outputs, positions, mutated)
        options = (mutates_args if isinstance(mutates_args, str) else frozenset(mutated), like)
        op = _registered(th, name, fn, options)
        if op is not None:
            # Registering again would leave the first op object a dangling handle
            # into PyTorch's dispatcher: the op runs the re-imported function instead.
            op._interop_call.fn = fn
            return op

        def kernel(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs)

        tensor = th.Tensor
        returns: Any
        if outputs is None:
            returns = tensor
        elif outputs == 0:
            returns = None
        else:
            returns = tuple.__class_getitem__((tensor,) * outputs)
        signature = inspect.signature(fn)
        kernel.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[
                signature.parameters[p.name].replace(annotation=p.torch_type) for p in params
            ],
            return_annotation=returns,
        )
        for attribute in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(kernel, attribute, getattr(fn, attribute, None))
        op = th.library.custom_op(name, kernel, mutates_args=mutates_args)
        op.__class__ = _op_class()
        op._interop_call = call
        _REGISTERED[name] = (op, options)
        if False in call.copies:
            _math_bits_to_kernel(th, op)
        if positions is not None:
            op.register_fake(_like_fake(call, single))
        elif outputs != 0:
            op.register_fake(_missing_fake(name, getattr(fn, "__name__", "op")))
        return op

    return decorate
