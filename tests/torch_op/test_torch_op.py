"""``interop.torch_op`` on the CPU (NumPy path): values, zero-copy hand-overs,
PyTorch's own checks (``opcheck``, ``gradcheck``, ``torch.compile``) and every
error. The GPU path is in ``test_torch_op_gpu.py``.

Operators register for the whole process, so each test makes its own names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import re
import shutil
import sys
import types
from typing import Optional

import ml_dtypes
import numpy as np
import pytest

import interop
from interop import allocator
from interop._torch_op import call as _torch_op
from tests.helpers import REPO_ROOT, run_python

torch = pytest.importorskip("torch")

_COUNTER = itertools.count()


def name(what: str) -> str:
    """A process-unique operator name."""
    return f"interop_test::{what}_{next(_COUNTER)}"


def scale_op(*, backward=False):
    @interop.torch_op(name("scale"), like=0)
    def scale(x, factor: float = 2.0):
        xp = interop.array_namespace(x)
        return xp.multiply(x, x.dtype.type(factor))

    if backward:

        def setup_context(ctx, inputs, output):
            ctx.factor = inputs[1]

        def grad(ctx, g):
            return scale(g, ctx.factor), None

        scale.register_autograd(grad, setup_context=setup_context)
    return scale


def _cube_with_backward():
    """x**3 with its backward written as another torch_op."""

    @interop.torch_op(name("cube_backward"), like=(0,))
    def cube_backward(grad, x) -> tuple[interop.Array]:
        return (3 * x * x * grad,)

    @interop.torch_op(name("cube"), like=0)
    def cube(x):
        return x * x * x

    def setup_context(ctx, inputs, output):
        (ctx.x,) = inputs  # saved as a tensor: setup_context runs outside the op

    def backward(ctx, grad):
        (g,) = cube_backward(grad, ctx.x)
        return g

    cube.register_autograd(backward, setup_context=setup_context)
    return cube


# --------------------------------------------------------------------------- values


def test_the_decorated_function_is_pytorch_s_custom_op():
    op = scale_op()
    assert isinstance(op, torch._library.custom_ops.CustomOpDef)
    assert str(op._opoverload._schema).endswith("(Tensor x, float factor=2.) -> Tensor")
    namespace, opname = op._qualname.split("::")
    assert getattr(getattr(torch.ops, namespace), opname).default is op._opoverload


def test_values_with_defaults_keywords_and_scalars():
    op = scale_op()
    x = torch.arange(6.0).reshape(2, 3)
    assert op(x).tolist() == (x * 2).tolist()
    assert op(x, 3.5).tolist() == (x * 3.5).tolist()
    assert op(x, factor=-1.0).tolist() == (-x).tolist()
    assert op(x).dtype == torch.float32
    # through torch.ops too
    namespace, opname = op._qualname.split("::")
    assert getattr(getattr(torch.ops, namespace), opname)(x, 0.5).tolist() == (x / 2).tolist()


def test_inputs_and_outputs_cross_without_a_copy():
    seen = {}

    @interop.torch_op(name("zero_copy"), like=0)
    def twice(x):
        seen["type"] = type(x)
        seen["ptr"] = x.ctypes.data
        out = x * 2
        seen["out"] = out.ctypes.data
        return out

    x = torch.arange(4.0)
    y = twice(x)
    assert seen["type"] is np.ndarray
    assert seen["ptr"] == x.data_ptr()
    assert y.data_ptr() == seen["out"]  # the returned array itself, not a copy
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_pass_through_parameter_types():
    @interop.torch_op(name("kinds"), like=0)
    def kinds(
        x: interop.Array,
        bias: Optional[interop.Array],  # noqa: UP045 (the typing spelling works too)
        n: int,
        shift: list[float],
        mode: str = "add",
        flip: bool = False,
        limit: int | None = None,
    ) -> interop.Array:
        y = x + np.asarray(shift, dtype=x.dtype) * n
        if bias is not None:
            y = y + bias if mode == "add" else y - bias
        if flip:
            y = y[::-1]
        if limit is not None:
            y = np.minimum(y, limit)
        return y

    schema = str(kinds._opoverload._schema)
    assert '(Tensor x, Tensor? bias, SymInt n, float[] shift, str mode="add"' in schema
    x = torch.zeros(3)
    b = torch.ones(3)
    assert kinds(x, None, 2, [1.0, 2.0, 3.0]).tolist() == [2.0, 4.0, 6.0]
    assert kinds(x, b, 1, [0.0, 0.0, 5.0], mode="sub").tolist() == [-1.0, -1.0, 4.0]
    assert kinds(x, b, 1, [1.0, 2.0, 3.0], flip=True, limit=3).tolist() == [3.0, 3.0, 2.0]


def test_several_outputs():
    @interop.torch_op(name("split"), like=("x", "x"))
    def split(x):
        return np.floor(x), x - np.floor(x)

    whole, frac = split(torch.tensor([1.25, -0.5, 3.0], dtype=torch.float64))
    assert whole.tolist() == [1.0, -1.0, 3.0]
    assert frac.tolist() == [0.25, 0.5, 0.0]

    @interop.torch_op(name("stats"))
    def stats(x) -> tuple[interop.Array, interop.Array]:
        return x.min(keepdims=True), x.max(keepdims=True)

    @stats.register_fake
    def _(x):
        return x.new_empty(1), x.new_empty(1)

    lo, hi = stats(torch.tensor([3.0, -1.0, 2.0]))
    assert (lo.tolist(), hi.tolist()) == ([-1.0], [3.0])


def test_an_op_that_writes_into_its_argument():
    @interop.torch_op(name("fill"), mutates_args=("out",))
    def fill(x, out) -> None:
        np.add(x, 1, out=out)

    x = torch.arange(3.0)
    out = torch.zeros(3)
    assert fill(x, out) is None
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert "Tensor(a1!) out" in str(fill._opoverload._schema)
    torch.library.opcheck(fill, (x, out))


def test_a_scalar_result_and_a_tensor_result_are_taken():
    @interop.torch_op(name("total"))
    def total(x) -> interop.Array:
        return x.sum()  # a NumPy scalar: a 0-d tensor

    @total.register_fake
    def _(x):
        return x.new_empty(())

    t = total(torch.arange(4.0))
    assert t.shape == ()
    assert t.item() == 6.0

    @interop.torch_op(name("via_torch"), like=0)
    def via_torch(x):
        return torch.from_numpy(x) + 1  # a tensor is an array too

    assert via_torch(torch.zeros(2)).tolist() == [1.0, 1.0]


def _copy_into(what, mutates_args=("out",)):
    """An op that writes ``x`` into ``out``, and the list of its calls."""
    calls = []

    @interop.torch_op(name(what), mutates_args=mutates_args)
    def copy_into(x, out) -> None:
        calls.append(1)
        out[...] = x

    return copy_into, calls


@pytest.mark.parametrize("bit", ["conjugate", "negative"])
def test_a_mutated_argument_with_a_math_bit_is_copy_required(bit):
    op, calls = _copy_into(f"math_bit_{bit}")
    z = torch.tensor([1 + 2j, 3 - 4j])
    out = z.conj() if bit == "conjugate" else z.conj().imag  # x.conj().imag: the negative bit
    x = torch.ones_like(out)
    namespace, opname = op._qualname.split("::")
    for call in (op, getattr(getattr(torch.ops, namespace), opname)):
        with pytest.raises(interop.CopyRequiredError) as info:
            call(x, out)
        message = str(info.value)
        assert message.startswith(f"{op._qualname} expected parameter 'out', which it writes into")
        assert f"got a tensor with the {bit} bit set" in message
        assert "resolve_" in message
        assert isinstance(info.value, BufferError)
    assert calls == []
    assert z.tolist() == [1 + 2j, 3 - 4j]  # nothing written
    # read, not written: the bit resolved into a copy, as PyTorch does
    plain = torch.zeros(2, dtype=out.dtype)
    op(out, plain)
    assert plain.tolist() == out.tolist()


@pytest.mark.parametrize("mutates_args", [("out",), "unknown"])
def test_a_mutated_argument_that_is_expanded_is_refused_naming_it(mutates_args):
    op, calls = _copy_into("expanded", mutates_args)
    base = torch.zeros(1, 2)
    with pytest.raises(interop.InvalidValueError) as info:
        op(torch.arange(6.0).reshape(3, 2), base.expand(3, 2))
    message = str(info.value)
    assert message.startswith(f"{op._qualname} expected parameter 'out', which it writes into")
    assert "(got a tensor of shape (3, 2) and strides (0, 1)" in message
    assert "clone()" in message
    assert calls == []
    assert base.tolist() == [[0.0, 0.0]]  # nothing written
    if mutates_args != "unknown":  # an expanded argument that is only read is fine
        out = torch.zeros(3, 2)
        op(torch.ones(1, 2).expand(3, 2), out)
        assert out.tolist() == [[1.0, 1.0]] * 3


# --------------------------------------------------------------------------- aliasing


def test_an_output_that_is_an_input_is_copied():
    @interop.torch_op(name("identity"), like=0)
    def identity(x):
        return x

    x = torch.arange(4.0)
    y = identity(x)
    assert y.tolist() == x.tolist()
    assert y.data_ptr() != x.data_ptr()
    x[0] = 9.0
    assert y[0].item() == 0.0
    torch.library.opcheck(identity, (x,))


def test_outputs_that_overlap_an_input_or_each_other_are_copied():
    @interop.torch_op(name("overlap"), like=(0, 0, 0))
    def overlap(x):
        y = x * 2
        return x.reshape(x.shape), y, y  # a view of x, then y twice

    x = torch.arange(6.0).reshape(2, 3)
    a, b, c = overlap(x)
    ranges = [(t.data_ptr(), t.data_ptr() + t.nbytes) for t in (x, a, b, c)]
    for (s0, e0), (s1, e1) in itertools.combinations(ranges, 2):
        assert e0 <= s1 or e1 <= s0  # no two share a byte
    assert a.tolist() == x.tolist()
    assert b.tolist() == c.tolist() == (x * 2).tolist()
    torch.library.opcheck(overlap, (x,))


# --------------------------------------------------------------------------- opcheck


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_passes_for_ops_with_scalars_several_outputs_and_backward(requires_grad):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=requires_grad)
    y = torch.randn(3, 4, dtype=torch.float64, requires_grad=requires_grad)
    scale = scale_op(backward=True)
    torch.library.opcheck(scale, (x,), {"factor": 0.5})

    @interop.torch_op(name("sum_diff"), like=(0, 1))
    def sum_diff(x, y, alpha: float = 1.0):
        return x + alpha * y, x - alpha * y

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[2]

    def backward(ctx, g_sum, g_diff):
        a, b = sum_diff(g_sum, g_diff, 1.0)
        return a, b * ctx.alpha, None

    sum_diff.register_autograd(backward, setup_context=setup_context)
    torch.library.opcheck(sum_diff, (x, y, 2.0))
    torch.library.opcheck(_cube_with_backward(), (x,))


def test_opcheck_passes_on_non_contiguous_inputs():
    x = torch.randn(4, 6, dtype=torch.float64)
    scale = scale_op()
    for view in (x.T, x[:, ::2], x[1:3]):
        torch.library.opcheck(scale, (view, 3.0))


# --------------------------------------------------------------------------- autograd


def test_gradcheck_through_a_backward_that_is_a_torch_op():
    cube = _cube_with_backward()
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cube, (x,))
    cube(x).sum().backward()
    assert torch.allclose(x.grad, 3 * x.detach() ** 2)


def test_no_backward_registered_is_pytorch_s_error_at_backward():
    op = scale_op()
    x = torch.ones(2, requires_grad=True)
    y = op(x)
    with pytest.raises(RuntimeError, match="register_autograd"):
        y.sum().backward()


# --------------------------------------------------------------------------- torch.compile


def _model(op):
    def model(x, w):
        h = torch.tanh(x @ w)
        return op(h, 0.5).sum() + h.mean()

    return model


def test_torch_compile_fullgraph_aot_eager_forward_and_backward():
    cube = _cube_with_backward()
    scale = scale_op(backward=True)

    def model(x):
        return scale(cube(torch.sin(x)), 0.5).sum()

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for n in (5, 7):  # a second shape: recompiled or dynamic, same values
        x = torch.randn(n, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        got = compiled(x)
        want = model(x2)
        assert torch.allclose(got, want)
        got.backward()
        want.backward()
        assert torch.allclose(x.grad, x2.grad)


def _cpp_compiler() -> str | None:
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


@pytest.mark.skipif(
    _cpp_compiler() is None, reason="inductor needs a C++ compiler for the CPU (none found)"
)
# inductor itself warns while it compiles (torch 2.13)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_fullgraph_with_inductor():
    scale = scale_op()
    model = _model(scale)
    compiled = torch.compile(model, fullgraph=True)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    assert torch.allclose(compiled(x, w), model(x, w), atol=1e-5)


def test_without_like_tracing_raises_what_the_docs_say_with_the_fix():
    """What a user catches for a missing fake, in each case docs/torch-op.md lists."""

    @interop.torch_op(name("nofake"))
    def nofake(x):
        return x + 1

    fix = "pass like= to interop.torch_op"
    x = torch.arange(3.0)
    assert nofake(x).tolist() == [1.0, 2.0, 3.0]  # eager needs no fake
    # meta tensors and torch.export: MissingFakeError itself
    with pytest.raises(interop.MissingFakeError, match=fix):
        nofake(torch.empty(3, device="meta"))

    class Model(torch.nn.Module):
        def forward(self, x):
            return nofake(x)

    with pytest.raises(interop.MissingFakeError, match=fix):
        torch.export.export(Model(), (x,))
    # torch.compile: dynamo's TorchRuntimeError (a RuntimeError), the text kept,
    # the MissingFakeError in its chain
    compiled = torch.compile(nofake, fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=fix) as info:
        compiled(x)
    assert isinstance(info.value, RuntimeError)
    assert "register one with @nofake.register_fake" in str(info.value)
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert [type(e) for e in chain if isinstance(e, interop.MissingFakeError)] == [
        interop.MissingFakeError
    ]
    # opcheck: its OpCheckError (an Exception), the MissingFakeError as __cause__
    with pytest.raises(Exception, match=fix) as info:
        torch.library.opcheck(nofake, (x,))
    assert type(info.value).__name__ == "OpCheckError"
    assert not isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, interop.MissingFakeError)

    @nofake.register_fake
    def _(x):
        return torch.empty_like(x)

    torch._dynamo.reset()
    assert compiled(x).tolist() == [1.0, 2.0, 3.0]
    torch.library.opcheck(nofake, (x,))


def test_the_docs_say_what_to_catch_when_the_fake_is_missing():
    page = (REPO_ROOT / "docs" / "torch-op.md").read_text()
    _, _, rest = page.partition("\n### When the fake implementation is missing\n")
    section = re.split(r"\n#{1,3} ", rest)[0]
    for caught in (
        "interop.MissingFakeError",
        "torch._dynamo.exc.TorchRuntimeError",
        "OpCheckError",
        "__cause__",
        "torch.export",
        "opcheck",
    ):
        assert caught in section, caught


# --------------------------------------------------------------------------- dtypes, layouts


def test_bfloat16_inputs_reach_numpy_as_ml_dtypes_and_come_back():
    seen = {}

    @interop.torch_op(name("bf16"), like=0)
    def halve(x):
        seen["dtype"] = x.dtype
        return (x.astype(np.float32) / 2).astype(x.dtype)

    x = torch.tensor([1.0, -3.0, 0.5], dtype=torch.bfloat16)
    y = halve(x)
    assert seen["dtype"] == np.dtype(ml_dtypes.bfloat16)
    assert y.dtype == torch.bfloat16
    assert y.float().tolist() == [0.5, -1.5, 0.25]
    torch.library.opcheck(halve, (x,))


def test_non_contiguous_inputs_are_strided_views():
    seen = {}

    @interop.torch_op(name("strided"), like=0)
    def plus_one(x):
        seen["strides"] = x.strides
        seen["ptr"] = x.ctypes.data
        return x + 1

    base = torch.arange(24.0).reshape(4, 6)
    for view in (base.T, base[:, 1::2], base[::2]):
        y = plus_one(view)
        assert seen["ptr"] == view.data_ptr()  # the view itself, no copy
        assert seen["strides"] == tuple(s * 4 for s in view.stride())
        assert y.tolist() == (view + 1).tolist()
        assert y.is_contiguous()  # as the fake implementation says


def test_outputs_in_other_layouts_become_contiguous():
    @interop.torch_op(name("layouts"), like=(0, 0, 0))
    def layouts(x):
        fresh = x + 0
        return (
            fresh.T.copy().T,
            fresh[::-1, ::-1].copy()[::-1, ::-1],
            np.broadcast_to(x[:1], x.shape),
        )

    x = torch.arange(6.0).reshape(2, 3)
    for t in layouts(x):
        assert t.is_contiguous()
        assert t.stride() == (3, 1)
    a, b, c = layouts(x)
    assert a.tolist() == b.tolist() == x.tolist()
    assert c.tolist() == [[0.0, 1.0, 2.0]] * 2
    torch.library.opcheck(layouts, (x,))


def test_size_one_axes_get_pytorch_s_contiguous_strides():
    @interop.torch_op(name("column"), like=0)
    def column(x):
        return np.ascontiguousarray(np.arange(3.0, dtype=x.dtype)[:, None][::1])

    x = torch.zeros(3, 1)
    y = column(x)
    assert y.stride() == x.new_empty(x.shape).stride() == (1, 1)
    torch.library.opcheck(column, (x,))


def test_a_read_only_result_is_shared_with_the_warning_to_torch_gives():
    data = np.arange(3.0)
    data.flags.writeable = False

    @interop.torch_op(name("readonly"), like=0)
    def constant(x):
        return data

    with pytest.warns(interop.ReadOnlyWarning):
        y = constant(torch.zeros(3, dtype=torch.float64))
    assert y.tolist() == [0.0, 1.0, 2.0]


def test_a_big_endian_output_with_like_becomes_a_native_tensor():
    @interop.torch_op(name("big_endian"), like=0)
    def swapped(x):
        return (x + 1).astype(x.dtype.newbyteorder(">"))

    y = swapped(torch.arange(3.0))
    assert y.dtype == torch.float32
    assert y.is_contiguous()
    assert y.tolist() == [1.0, 2.0, 3.0]

    @interop.torch_op(name("big_endian_wider"), like=0)
    def wider(x):
        return x.astype(">f8")

    with pytest.raises(interop.InvalidValueError, match=r"\(\(2,\), torch.float32\).*got \(2,\), "):
        wider(torch.ones(2))


# --------------------------------------------------------------------------- errors at a call


@pytest.mark.parametrize("bad", [np.ones(3), [1.0, 2.0], 3.0, None])
def test_a_non_tensor_for_an_array_parameter_is_a_type_error(bad):
    op = scale_op()
    with pytest.raises(TypeError, match=r"expected a torch.Tensor for parameter 'x'") as info:
        op(bad)
    assert isinstance(info.value, interop.InvalidTypeError)
    assert op._qualname in str(info.value)
    if isinstance(bad, np.ndarray):
        assert "interop.to_torch(x)" in str(info.value)


def test_a_wrong_scalar_is_still_pytorch_s_error():
    op = scale_op()
    with pytest.raises(RuntimeError, match="Expected a value of type 'float'"):
        op(torch.ones(2), "big")


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        (1.5, "expected its function to return a NumPy array .got builtins.float"),
        ([1.0, 2.0], "return a NumPy array .got builtins.list"),
        (None, "return a NumPy array .got builtins.NoneType"),
        ((np.ones(2),), "return a NumPy array .got builtins.tuple"),
    ],
    ids=["float", "list", "None", "tuple"],
)
def test_a_function_that_returns_no_array_is_a_type_error_naming_the_op(returned, match):
    @interop.torch_op(name("returns"), like=0)
    def returns(x):
        return returned

    with pytest.raises(TypeError, match=match) as info:
        returns(torch.ones(2))
    assert isinstance(info.value, interop.InvalidTypeError)
    assert str(info.value).startswith(returns._qualname)


def test_a_wrong_number_of_outputs_is_a_type_error():
    @interop.torch_op(name("pair"), like=(0, 0))
    def pair(x):
        return x + 1

    with pytest.raises(TypeError, match=r"return a tuple of 2 arrays \(got numpy.ndarray"):
        pair(torch.ones(2))

    @interop.torch_op(name("nothing"), mutates_args=("x",))
    def nothing(x) -> None:
        return x

    with pytest.raises(TypeError, match="return None, as annotated"):
        nothing(torch.ones(2))


def test_an_output_that_contradicts_like_is_a_value_error():
    @interop.torch_op(name("promotes"), like=0)
    def promotes(x):
        return x.astype(np.float64)

    with pytest.raises(ValueError, match=r"expected output 0 to have the shape and dtype of input"):
        promotes(torch.ones(2))

    @interop.torch_op(name("shrinks"), like=0)
    def shrinks(x):
        return x[:1] + 0

    with pytest.raises(interop.InvalidValueError, match=r"\(\(2,\), torch.float32\).*got \(1,\)"):
        shrinks(torch.ones(2))


def test_meta_tensors_get_the_fake_implementation_s_result():
    scale = scale_op()
    y = scale(torch.empty(2, 5, device="meta"), 3.0)
    assert (y.device.type, tuple(y.shape), y.dtype) == ("meta", (2, 5), torch.float32)


def test_inputs_on_different_devices_are_a_value_error():
    @interop.torch_op(name("two_devices"), like=0)
    def add(x, y):
        return x + y

    x, meta = torch.ones(3), torch.ones(3, device="meta")
    match = r"expected its tensors on one device \(got 'x' on cpu, 'y' on meta\)"
    # eager: PyTorch picks the fake implementation for the meta tensor
    with pytest.raises(ValueError, match=match) as info:
        add(x, meta)
    assert isinstance(info.value, interop.InvalidValueError)
    # the kernel itself, as PyTorch calls it for a CPU tensor
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    with pytest.raises(ValueError, match=match):
        add._opoverload.redispatch(keys, x, meta)


# --------------------------------------------------------------------------- errors at decoration


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (dict, "dict"),
        (tuple[int, int], "tuple"),
        (np.ndarray, "numpy.ndarray"),
        (complex, "complex"),
        (list[str], "list"),
    ],
)
def test_an_annotation_pytorch_s_schema_cannot_hold_is_a_type_error(annotation, shown):
    def fn(x, option):
        return x

    fn.__annotations__ = {"option": annotation}
    with pytest.raises(TypeError, match=rf"parameter 'option' to be annotated .*\(got .*{shown}"):
        interop.torch_op(name("bad_type"), like=0)(fn)


def test_a_torch_tensor_annotation_says_to_use_interop_array():
    def fn(x: torch.Tensor):
        return x

    with pytest.raises(interop.InvalidTypeError, match=r"interop.Array .or no annotation."):
        interop.torch_op(name("tensor_annotation"))(fn)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("def f(*xs): return xs[0]", r"got \*args"),
        ("def f(x, **kw): return x", r"got \*\*kw"),
        ("def f(x, /): return x", "got '/'"),
        ("def f(x, *, y): return x", "array parameter 'y' before any"),
        ("def f(x=1.5): return x", "no default or None .got 1.5.; annotate it"),
        ("def f(x) -> int: return x", "return annotation to be interop.Array"),
        ("def f(x) -> tuple[interop.Array, ...]: return x", "return annotation"),
        ("def f(x: 'Undefined'): return x", "annotations it can evaluate .got NameError"),
    ],
)
def test_signatures_pytorch_cannot_take_are_type_errors(source, match):
    scope = {"interop": interop}
    exec(source, scope)
    with pytest.raises(TypeError, match=match):
        interop.torch_op(name("signature"))(scope["f"])


@pytest.mark.parametrize(
    ("like", "error", "match"),
    [
        (1, TypeError, "like=1 to name an array parameter .got 'gamma', float"),
        ("gamma", TypeError, "to name an array parameter"),
        (5, ValueError, "an index between 0 and 1 .got 5"),
        ("y", ValueError, r"one of \['gamma', 'x'\] .got 'y'"),
        (True, TypeError, "parameter's index or name"),
        ((), TypeError, "at least one input"),
        ([0], TypeError, "a tuple of them, or None .got \\[0\\]"),
    ],
)
def test_a_like_that_names_no_array_parameter_is_refused(like, error, match):
    def f(x, gamma: float = 2.0):
        return x

    with pytest.raises(error, match=match):
        interop.torch_op(name("like"), like=like)(f)


def test_like_and_the_return_annotation_must_agree():
    def f(x) -> tuple[interop.Array, interop.Array]:
        return x, x

    with pytest.raises(TypeError, match="like= to describe each output"):
        interop.torch_op(name("disagree"), like=0)(f)


@pytest.mark.parametrize(
    "bad",
    ["nonamespace", "mylib::has space", "my lib::op", "mylib::", "::op", "a::b::c", "mylib::op-1"],
)
def test_an_operator_name_pytorch_cannot_take_is_a_value_error(bad):
    with pytest.raises(interop.InvalidValueError) as info:
        interop.torch_op(bad)
    message = str(info.value)
    assert message.startswith(f"torch_op expected a name 'namespace::name' (got {bad!r})")
    assert "letters, digits and underscores" in message


def test_an_operator_name_that_is_not_a_string_is_a_type_error():
    with pytest.raises(interop.InvalidTypeError, match=r"expected a name 'namespace::name' .got 3"):
        interop.torch_op(3)


@pytest.mark.parametrize(
    ("annotation", "default"),
    [("list[int]", "[1, 2]"), ("list[float]", "(0.5,)"), ("Optional[list[bool]]", "[True]")],
)
def test_a_list_parameter_with_a_list_default_says_to_default_to_none(annotation, default):
    scope = {"Optional": Optional}
    exec(f"def f(x, sizes: {annotation} = {default}): return x", scope)
    with pytest.raises(interop.InvalidTypeError) as info:
        interop.torch_op(name("list_default"), like=0)(scope["f"])
    message = str(info.value)
    assert f"expected parameter 'sizes' to have no default or None (got {default})" in message
    assert "Optional[list" in message
    assert "sizes is None" in message


def test_a_second_function_under_a_taken_name_is_refused():
    taken = name("taken")

    def plus_one(x):
        return x + 1

    first = interop.torch_op(taken, like=0)(plus_one)

    def second(x):
        return x + 100

    with pytest.raises(interop.InvalidValueError) as info:
        interop.torch_op(taken, like=0)(second)
    message = str(info.value)
    assert message.startswith(f"torch_op {taken!r} expected a name no operator has yet")
    assert "test_a_second_function_under_a_taken_name_is_refused.<locals>.plus_one" in message
    assert first(torch.zeros(2)).tolist() == [1.0, 1.0]  # still the first function
    namespace, opname = taken.split("::")
    assert getattr(getattr(torch.ops, namespace), opname)(torch.zeros(1)).tolist() == [1.0]
    # the same function object, with other options, is another operator
    with pytest.raises(interop.InvalidValueError, match="expected a name no operator has yet"):
        interop.torch_op(taken, mutates_args="unknown")(plus_one)

    # a name PyTorch has from elsewhere
    plain = name("plain")

    @torch.library.custom_op(plain, mutates_args=())
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(interop.InvalidValueError, match=r"not made by interop\.torch_op"):
        interop.torch_op(plain, like=0)(second)


def test_the_same_function_re_imported_is_the_same_op_running_it(tmp_path):
    op_name = name("reimported")
    source = f"""
import interop

OFFSET = 1


@interop.torch_op({op_name!r}, like=0)
def plus(x):
    return x + OFFSET
"""
    path = tmp_path / "reimported_ops.py"
    path.write_text(source)

    def load():
        spec = importlib.util.spec_from_file_location("reimported_ops", path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    x = torch.zeros(2)
    first = load()
    assert first.plus(x).tolist() == [1.0, 1.0]
    path.write_text(source.replace("OFFSET = 1", "OFFSET = 20"))  # the code is the same
    second = load()  # a re-import makes a new function object: the op runs it
    assert second.plus is first.plus
    assert first.plus(x).tolist() == second.plus(x).tolist() == [20.0, 20.0]
    namespace, opname = op_name.split("::")
    assert getattr(getattr(torch.ops, namespace), opname)(x).tolist() == [20.0, 20.0]
    # the same module and name with another body is another function
    path.write_text(source.replace("x + OFFSET", "x + OFFSET * 2"))
    with pytest.raises(interop.InvalidValueError, match="expected a name no operator has yet"):
        load()
    assert first.plus(x).tolist() == [20.0, 20.0]


def test_interop_array_is_only_a_marker():
    with pytest.raises(TypeError, match="has no instances"):
        interop.Array()


# --------------------------------------------------------------------------- array_namespace


class _CudaProducer:
    """A foreign object that says it holds CUDA data (never exported here)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("not exported")

    def __dlpack_device__(self):
        return (2, 0)


def test_array_namespace():
    assert interop.array_namespace(np.ones(2)) is np
    assert interop.array_namespace(np.float32(1.0)) is np
    assert interop.array_namespace(torch.ones(2)) is np
    assert interop.array_namespace(np.ones(2), torch.ones(2)) is np
    import cupy

    assert interop.array_namespace(_CudaProducer()) is cupy


def test_array_namespace_errors():
    with pytest.raises(TypeError, match="at least one array"):
        interop.array_namespace()
    with pytest.raises(interop.InvalidTypeError, match=r"got builtins.list"):
        interop.array_namespace([1, 2])
    with pytest.raises(ValueError, match=r"arrays of one library .got numpy and cupy"):
        interop.array_namespace(np.ones(2), _CudaProducer())
    with pytest.raises(ValueError, match=r"CPU or CUDA tensor .got a tensor on meta"):
        interop.array_namespace(torch.ones(2, device="meta"))


def test_array_namespace_and_decorating_import_no_more_than_needed():
    proc = run_python(
        """
        import sys
        import numpy as np, interop
        assert interop.array_namespace(np.ones(2)) is np
        print(sorted(m for m in ("torch", "cupy") if m in sys.modules))
        import torch

        @interop.torch_op("lazy::plus_one", like=0)
        def plus_one(x):
            return x + 1

        print(plus_one(torch.ones(2)).tolist(), "cupy" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "[2.0, 2.0] False"]


# --------------------------------------------------------------------------- docs, benchmark


def test_the_docs_focal_loss_runs_and_matches_pytorch():
    """The ElementwiseKernel example of docs/torch-op.md, on the CPU (its NumPy
    branch): the loss of torchvision's sigmoid focal loss, and its gradient."""
    page = (REPO_ROOT / "docs" / "torch-op.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "FORWARD" in b]
    check = """
import torch.nn.functional as F

def reference(x, t, gamma=2.0):
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    return ce * (1 - p_t) ** gamma

x = torch.randn(4, 5, dtype=torch.float64) * 3
t = (torch.rand(4, 5, dtype=torch.float64) > 0.5).double()
print(torch.allclose(focal_loss(x, t, 1.5), reference(x, t, 1.5)))
x.requires_grad_(True)
print(torch.autograd.gradcheck(lambda x: focal_loss(x, t, 2.0), (x,)))
print(logits.grad.shape == logits.shape, bool(torch.isfinite(logits.grad).all()))
torch.library.opcheck(focal_loss, (x, t, 2.0))
print("opcheck")
"""
    proc = run_python(block + check)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True", "True", "opcheck"]


def test_the_overhead_benchmark_runs():
    """benchmarks/torch_op_overhead.py at a small size (figures, not speed)."""
    spec = importlib.util.spec_from_file_location(
        "torch_op_overhead", REPO_ROOT / "benchmarks" / "torch_op.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.measure(20, repeats=2)
    assert result["row"] == "torch_op_us"
    assert result["device"] == "cpu"
    assert len(result["samples"]["interop.torch_op"]) == len(result["samples"]["custom_op"]) == 2
    assert result["interop_us"] > 0
    assert result["custom_op_us"] > 0
    assert result["ratio"] == result["interop_us"] / result["custom_op_us"]
    with pytest.raises(ValueError, match="n_calls >= 1"):
        module.measure(0)


# ----------------------------------------------------------------- cuFFT plans made in a call
# CuPy's plan cache outlives a call: the plans made while the op ran (their work areas
# from the call's PyTorch-backed allocator) leave it after the call. Real plans need
# cuFFT (tests/torch_op/test_torch_op_gpu.py); here the cache and the plans are stand-ins.


class _FakePlan:
    def __init__(self, *key, devices=None):
        self.key = (*key, devices) if len(key) == 3 else key
        owner = None if _FAKE_ALLOCATOR else allocator.TorchBlock(object(), 0, _MAKER)
        self.work_area = types.SimpleNamespace(mem=types.SimpleNamespace(_owner=owner))


class _Plan1d(_FakePlan):
    pass


class _PlanNd(_FakePlan):
    pass


_FAKE_ALLOCATOR: list[object] = []  # CuPy's own pool's malloc while using_allocator runs
_MAKER = allocator.TorchAllocator()  # the call's allocator


class _FakeCache(dict):
    def __iter__(self):  # CuPy's PlanCache yields (key, node)
        return iter([(k, types.SimpleNamespace(plan=p)) for k, p in self.items()])

    def get_curr_size(self):
        return len(self)


@contextlib.contextmanager
def _using_allocator(malloc):
    _FAKE_ALLOCATOR.append(malloc)
    yield
    _FAKE_ALLOCATOR.pop()


def _move_plans(cache: dict, capturing: bool) -> None:
    """``_plans_to_own_pool`` over stand-ins of CuPy (``cache``, its pool) and PyTorch."""
    cp = types.SimpleNamespace(
        fft=types.SimpleNamespace(config=types.SimpleNamespace(get_plan_cache=lambda: cache)),
        cuda=types.SimpleNamespace(using_allocator=_using_allocator),
        get_default_memory_pool=lambda: types.SimpleNamespace(malloc="pool"),
    )
    th = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: capturing)
    )
    _torch_op._plans_to_own_pool(cp, th, _MAKER)


@pytest.mark.parametrize("capturing", [False, True])
def test_plans_made_in_a_call_leave_the_cache_and_are_made_again_from_cupys_pool(
    monkeypatch, capturing
):
    monkeypatch.setitem(sys.modules, "cupy.cuda.cufft", types.SimpleNamespace(
        Plan1d=_Plan1d, PlanNd=_PlanNd))  # fmt: skip
    monkeypatch.setattr(_torch_op, "_graph_plans", [])
    one, nd, callback = (8, 41, 1, None), tuple(range(12)), (8, 41, 1, None, "cb", 0, 0, 0)
    cache = _FakeCache({one: _Plan1d(*one[:3]), nd: _PlanNd(*nd), callback: _Plan1d(*one[:3])})
    with _using_allocator("pool"):
        kept = cache[(9, 41, 1, None)] = _Plan1d(9, 41, 1)  # made outside any call
    made = dict(cache)
    _move_plans(cache, capturing)
    assert cache[(9, 41, 1, None)] is kept
    if capturing:  # out of the cache, alive for the graph; nothing made during the capture
        assert set(cache.keys()) == {(9, 41, 1, None)}
        assert _torch_op._graph_plans == [made[one], made[nd], made[callback]]
        return
    assert set(cache.keys()) == {one, nd, (9, 41, 1, None)}  # a callback plan is not remade
    for key in (one, nd):
        assert cache[key] is not made[key]
        assert type(cache[key]) is type(made[key])
        assert cache[key].key == key
        assert cache[key].work_area.mem._owner is None  # from CuPy's pool
    assert _torch_op._graph_plans == []


def test_plans_of_another_pytorch_backed_allocator_stay_in_the_cache(monkeypatch):
    """A plan cached under interop.use_torch_allocator before the call (its work
    area from that allocator, not the call's) is not the call's to move."""
    monkeypatch.setitem(sys.modules, "cupy.cuda.cufft", types.SimpleNamespace(
        Plan1d=_Plan1d, PlanNd=_PlanNd))  # fmt: skip
    monkeypatch.setattr(_torch_op, "_graph_plans", [])
    key = (8, 41, 1, None)
    plan = _Plan1d(*key[:3])
    plan.work_area.mem._owner = allocator.TorchBlock(object(), 0, allocator.TorchAllocator())
    cache = _FakeCache({key: plan})
    _move_plans(cache, False)
    assert cache == {key: plan}
    assert _torch_op._graph_plans == []
