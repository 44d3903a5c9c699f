"""The decorator :func:`torch_op`: the operator registered with PyTorch, and its fake."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from .. import _backends
from ..arrays import describe
from ..errors import InvalidTypeError, InvalidValueError, MissingFakeError
from .call import Call
from .schema import VALUE, like_positions, output_count, parameters

__all__ = ["torch_op"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*")

# name -> (op, options) of each operator made here (only a re-import may register it again)
_REGISTERED: dict[str, tuple[Any, tuple[Any, ...]]] = {}


@functools.cache
def _op_class() -> type:
    """``CustomOpDef`` whose call names the parameter a non-tensor was passed for."""
    from torch._library.custom_ops import CustomOpDef

    class TorchOp(CustomOpDef):
        """A ``torch.library.custom_op`` made by :func:`interop.torch_op`."""

        _interop_call: Call

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


def _like_fake(call: Call, single: bool) -> Callable[..., Any]:
    """The fake ``like=`` describes: new contiguous tensors shaped like the inputs it names."""
    chosen = call.like or ()

    def fake(*args: Any, **kwargs: Any) -> Any:
        values = call.tensors(args, kwargs)
        call.check_one_device(values)  # the error eager calls give (meta tensors are fine)
        outs = tuple(values[k].new_empty(values[k].shape) for k in chosen)
        return outs[0] if single else outs

    return fake


def _missing_fake(name: str, fn_name: str) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        raise MissingFakeError(
            f"{name} has no fake implementation, which tracing needs; pass like= to "
            f"interop.torch_op, or register one with @{fn_name}.register_fake"
        )

    return fake


def _same_function(a: Any, b: Any) -> bool:
    """Whether ``b`` is ``a`` or ``a`` re-imported (the same code, signature and closure)."""
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
    """None if ``name`` is free, the op made under it from ``fn`` (re-imported), or the error."""
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
        f"torch_op {name!r} expected a name no operator has yet (got {got}); choose another "
        "name (only the same function, re-imported, may register it again)"
    )


def _math_bits_to_kernel(th: Any, op: Any) -> None:
    """Send tensors with the conjugate or negative bit on to ``op``'s kernel."""
    # the kernel refuses them for a mutated argument, resolves them into a copy otherwise
    keys = th._C.DispatchKey

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset.remove(keys.Conjugate).remove(keys.Negative)
        return op._opoverload.redispatch(below, *args, **kwargs)

    for key in ("Conjugate", "Negative"):
        op._lib.impl(op._name, kernel, key, with_keyset=True)


def torch_op(
    name: str,
    /,
    *,
    mutates_args: Sequence[str] | str = (),
    like: int | str | tuple[int | str, ...] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Turn a function of CuPy or NumPy arrays into a PyTorch operator.

    Parameters
    ----------
    name : str
        ``"namespace::name"`` (``torch.ops.namespace.name``), taken for the process.
    mutates_args : sequence of str or "unknown"
        The array parameters the function writes into, as in ``torch.library.custom_op``.
    like : int, str, tuple of them, or None
        The fake: output ``k`` like input ``like[k]``; else use ``op.register_fake``.

    Returns
    -------
    callable
        A decorator returning the ``torch.library.custom_op`` (see :class:`interop.Array`).

    Notes
    -----
    Copy semantics: inputs arrive as :func:`interop.to_cupy` / :func:`interop.to_numpy`
    give them; outputs are copied only if not C-contiguous or aliasing another array.
    Stream order: a CUDA call runs on PyTorch's current stream and caching allocator.

    Raises
    ------
    InvalidTypeError
        A bad signature or ``like``; at a call, a non-tensor argument or a wrong return.
    InvalidValueError
        A bad or taken ``name``; at a call, tensors on two devices, a wrong output.
    CopyRequiredError
        At a call: a conjugate or negative bit on a mutated argument.
    StreamMismatchError
        At a call: the function allocated on another CuPy stream or device.
    MissingFakeError
        Tracing an op that has no fake implementation.
    BackendUnavailableError
        No PyTorch (at decoration), or no CuPy for a CUDA tensor.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        error = InvalidValueError if isinstance(name, str) else InvalidTypeError
        raise error(
            f"torch_op expected a name 'namespace::name' (got {name!r}), each part letters, "
            "digits and underscores, not starting with a digit: e.g. 'mylib::scale'"
        )
    th = _backends.torch()

    def decorate(fn: Callable[..., Any]) -> Any:
        if not callable(fn):
            raise InvalidTypeError(f"torch_op {name!r} expected a function (got {describe(fn)})")
        params, ret = parameters(fn, name)
        positions, single = (None, True) if like is None else like_positions(like, params, name)
        outputs = output_count(ret, positions, single, name)
        if isinstance(mutates_args, str):  # "unknown": every array parameter
            mutated = {p.name for p in params if p.kind != VALUE and mutates_args == "unknown"}
        else:
            mutated = set(mutates_args)
        call = Call(fn, name, params, outputs, positions, mutated)
        options = (mutates_args if isinstance(mutates_args, str) else frozenset(mutated), like)
        op = _registered(th, name, fn, options)
        if op is not None:
            # registering again would leave the first op object dangling: it runs fn instead
            op._interop_call.fn = fn
            return op

        def kernel(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs)

        returns = tuple.__class_getitem__((th.Tensor,) * outputs) if outputs else None
        if outputs is None:
            returns = th.Tensor
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
