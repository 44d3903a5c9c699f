"""One call of a :func:`~interop.torch_op`: tensors in as arrays, arrays out as tensors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _backends, dtypes, streams
from ..allocator import TorchAllocator, thread_setting, torch_storage_of
from ..arrays import describe
from ..errors import CopyRequiredError, InvalidTypeError, InvalidValueError
from ..exchange import plain_torch_view, to_cupy, to_numpy, to_torch
from .schema import ARRAY, OPTIONAL_ARRAY, VALUE, Param

_graph_plans: list[Any] = []  # cuFFT plans first made in a graph capture: the graph replays them


def _plans_to_own_pool(cp: Any, th: Any, maker: TorchAllocator) -> None:
    """Move the cuFFT plans CuPy cached with work areas from ``maker`` to CuPy's own pool."""
    # CuPy's plan cache outlives the call: PyTorch's pool, or a graph's, must not hold it
    cufft = sys.modules.get("cupy.cuda.cufft")
    if cufft is None:  # no plan was ever made in this process
        return
    cache = cp.fft.config.get_plan_cache()
    if not cache.get_curr_size():
        return
    ours = [(key, node.plan) for key, node in cache if _made_by(maker, node.plan.work_area)]
    if not ours:
        return
    for key, _ in ours:
        del cache[key]  # the plan made here goes back to PyTorch's pool, as any temporary
    if th.cuda.is_current_stream_capturing():
        _graph_plans.extend(plan for _, plan in ours)  # destroying it would break the capture
        return
    try:
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            for key, plan in ours:  # under its key, so later calls find it
                if type(plan) is cufft.Plan1d and len(key) == 4:  # cupy.fft's key: no callbacks
                    cache[key] = cufft.Plan1d(*key[:3], devices=key[3])
                elif type(plan) is cufft.PlanNd and len(key) == 12:
                    cache[key] = cufft.PlanNd(*key)
    except cp.cuda.memory.OutOfMemoryError:
        pass  # no room to cache them: the op's result stands, the next call plans again


def _made_by(maker: TorchAllocator, area: Any) -> bool:
    """A plan's work area (a MemoryPointer, a list of them, or None) holds memory of ``maker``."""
    areas = area if isinstance(area, list) else [area]
    return any(torch_storage_of(a.mem, maker) is not None for a in areas if a is not None)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


_ABSENT = object()  # an argument not given


class Call:
    """Everything a call of one op needs, worked out at decoration."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        params: list[Param],
        outputs: int | None,
        like: tuple[int, ...] | None,
        mutated: set[str],
    ) -> None:
        self.fn, self.name, self.outputs = fn, name, outputs
        self.arrays = [p for p in params if p.kind != VALUE]
        # like= as indices into self.arrays
        self.like = None if like is None else tuple(self.arrays.index(params[i]) for i in like)
        # a mutated argument is handed over without a copy or refused: a copy's writes are lost
        self.copies = tuple(False if p.name in mutated else None for p in self.arrays)
        # the common case, answered first: every array parameter required and positional
        plain = [p.position for p in self.arrays if p.kind == ARRAY and p.position is not None]
        self.positions = tuple(plain) if len(plain) == len(self.arrays) else ()
        self.needed = max(self.positions, default=-1) + 1
        self.default_stream: int | None = None  # CuPy's handle of PyTorch's, once CUDA is checked

    def argument_error(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
        """The error to raise for arguments PyTorch refused, or None to keep PyTorch's."""
        tensor = _backends.torch().Tensor
        for p, v in zip(self.arrays, self._given(args, kwargs, _ABSENT), strict=True):
            # an absent argument keeps PyTorch's own error
            allowed = v is _ABSENT or (v is None and p.kind == OPTIONAL_ARRAY)
            if not allowed and not isinstance(v, tensor):
                return self._not_a_tensor(p, v)
        return None

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any], absent: Any) -> list[Any]:
        """The argument of each array parameter (``absent`` where not given)."""
        return [
            args[p.position]
            if p.position is not None and p.position < len(args)
            else kwargs.get(p.name, absent)
            for p in self.arrays
        ]

    def _not_a_tensor(self, p: Param, value: Any) -> InvalidTypeError:
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
        values = self._given(args, kwargs, None)
        for p, v in zip(self.arrays, values, strict=True):
            if v is None and p.kind == ARRAY:  # PyTorch passes None on for a Tensor
                raise self._not_a_tensor(p, v)
        return values

    def device(self, values: list[Any]) -> int | None:
        """The CUDA device of the tensors (None: the CPU), or the error."""
        self.check_one_device(values)
        first = next((v for v in values if v is not None), None)
        if first is None or first.is_cpu:
            return None  # no tensor: NumPy
        if first.is_cuda:
            return first.get_device()
        raise InvalidValueError(
            f"{self.name} expected CPU or CUDA tensors (got {first.device}); move them first"
        )

    def check_one_device(self, values: list[Any]) -> None:
        """Raise unless the tensors (None: absent) are on one device."""
        given = [(p, v) for p, v in zip(self.arrays, values, strict=True) if v is not None]
        first = given[0][1].device if given else None
        if any(v.device != first for _, v in given):
            where = ", ".join(f"{p.name!r} on {v.device}" for p, v in given)
            moved = next(p.name for p, v in given if v.device != first)
            raise InvalidValueError(
                f"{self.name} expected its tensors on one device (got {where}); move them "
                f"first, e.g. {moved}.to({str(first)!r})"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.positions and len(args) >= self.needed:
            # the common case first, without tensors()'s checks (saves about 1 us of 17)
            values = [args[i] for i in self.positions]
            for v in values:
                if v is None or not v.is_cpu:
                    break
            else:
                return self._run(args, kwargs, values, to_numpy, None)
        values = self.tensors(args, kwargs)
        index = self.device(values)
        if index is None:
            return self._run(args, kwargs, values, to_numpy, None)
        return self._run_cuda(args, kwargs, values, index)

    def _run_cuda(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], values: list[Any], index: int
    ) -> Any:
        """:meth:`_run` with CuPy on PyTorch's device, stream and pool (this thread only)."""
        null = self.default_stream
        if null is None:
            cp = _backends.require_cupy_device()
            # PyTorch's default is the legacy stream, CuPy's null not always (per-thread)
            per_thread = (
                streams.cupy_consumer_handle(cp.cuda.Stream.null) == streams.PER_THREAD_DEFAULT
            )
            null = self.default_stream = streams.LEGACY_DEFAULT if per_thread else 0
        cp, th = sys.modules["cupy"], sys.modules["torch"]
        previous_device = cp.cuda.runtime.getDevice()
        if previous_device != index:
            cp.cuda.runtime.setDevice(index)
        torch_device = th.cuda.current_device()
        if torch_device != index:
            th.cuda.set_device(index)
        try:
            stream = streams.cupy_stream(streams.torch_stream_handle(index) or null, index)
            get_allocator, set_allocator = thread_setting(cp)
            previous = get_allocator()
            maker = TorchAllocator((index, stream.ptr))
            set_allocator(maker)
            try:
                with stream:
                    try:
                        return self._run(args, kwargs, values, to_cupy, index)
                    finally:  # a function that failed may have cached a plan first
                        _plans_to_own_pool(cp, th, maker)
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
        """Tensors to arrays, the function, arrays to tensors (``index``: CUDA device or None)."""
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
        if self.outputs == 0 and result is not None:
            raise InvalidTypeError(
                f"{self.name} expected its function to return None, as annotated (got "
                f"{describe(result)})"
            )
        if self.outputs == 0:
            return None
        if not isinstance(result, tuple | list) or len(result) != self.outputs:
            raise InvalidTypeError(
                f"{self.name} expected its function to return a tuple of {self.outputs} "
                f"arrays (got {describe(result)})"
            )
        done: list[Any] = []
        return tuple(self._output(r, i, inputs, done, index) for i, r in enumerate(result))

    def _refuse_unwritable(self, p: Param, v: Any) -> None:
        """Raise unless the function can write tensor ``v`` of mutated parameter ``p``."""
        if v.is_conj() or v.is_neg():
            bit, fix = ("conjugate", "resolve_conj") if v.is_conj() else ("negative", "resolve_neg")
            raise CopyRequiredError(
                f"{self.name} expected parameter {p.name!r}, which it writes into, without a "
                f"copy (got a tensor with the {bit} bit set); pass t = {p.name}.{fix}() and "
                "read the results from t"
            )
        if any(n > 1 and s == 0 for n, s in zip(v.shape, v.stride(), strict=True)):
            raise InvalidValueError(
                f"{self.name} expected parameter {p.name!r}, which it writes into, with memory "
                f"of its own for each element (got a tensor of shape {tuple(v.shape)} and "
                f"strides {v.stride()}: an expanded view); pass t = {p.name}.clone()"
            )

    def _output(
        self, r: Any, i: int, inputs: list[Any], done: list[Any] | None, index: int | None
    ) -> Any:
        """Output ``i`` as a tensor, C-contiguous and sharing no memory with ``inputs``/``done``."""
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
        if self.like is not None:
            like = inputs[self.like[i]]
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
        if not isinstance(r, np.ndarray) and not _backends.is_cupy_array(r):
            which = "" if self.outputs is None else f" as output {i}"
            raise InvalidTypeError(
                f"{self.name} expected its function to return "
                f"{'a NumPy' if index is None else 'a CuPy'} array{which} (got {describe(r)}); "
                "return arrays of xp = interop.array_namespace(x)"
            )
        where = None if isinstance(r, np.ndarray) else r.device.id
        if where != index:
            which = "its output" if self.outputs is None else f"output {i}"
            want = "a NumPy array" if index is None else f"a CuPy array on cuda:{index}"
            got = "a NumPy array" if where is None else f"a CuPy array on cuda:{where}"
            raise InvalidValueError(
                f"{self.name} expected {which} on its inputs' device, {want} (got {got}); "
                "compute with xp = interop.array_namespace(x)"
            )
        return r

    def _tensor(self, r: Any, index: int | None) -> Any:
        """A C-contiguous array as a tensor with PyTorch's contiguous strides (as the fake's)."""
        if index is not None:
            base = torch_storage_of(r.data.mem)
            offset = -1 if base is None else r.data.ptr - base.data_ptr()
            if base is not None and offset >= 0 and offset % r.itemsize == 0:
                # a view of PyTorch's storage: an ordinary tensor (CUDA-graph trees need it)
                tdtype = dtypes.torch_dtype_of_numpy(r.dtype)
                out = sys.modules["torch"].empty((0,), dtype=tdtype, device=base.device)
                strides = _contiguous_strides(r.shape)
                return out.set_(base.untyped_storage(), offset // r.itemsize, r.shape, strides)
        t = plain_torch_view(r) if index is None else None  # the common case, answered first
        if t is None:
            t = to_torch(r)
        if 1 in r.shape or 0 in r.shape:
            want = _contiguous_strides(r.shape)
            if t.stride() != want:
                t = t.as_strided(r.shape, want)
        return t

    def _unlike(self, i: int, r: Any, like: Any) -> InvalidValueError:
        assert self.like is not None

        def shown(a: Any) -> str:
            try:
                dtype = str(dtypes.torch_dtype_of_numpy(a.dtype))
            except Exception:
                dtype = str(a.dtype)
            return f"{tuple(a.shape)}, {dtype}"

        return InvalidValueError(
            f"{self.name} expected output {i} to have the shape and dtype of input "
            f"{self.arrays[self.like[i]].name!r} ({shown(like)}), as like= says (got "
            f"{shown(r)}); or drop like= and use .register_fake"
        )
