"""A tour of interop's exchange rules: each edge case once, with what you get.

Where ``torch.from_dlpack``, ``numpy.from_dlpack`` and ``Tensor.numpy()`` crash,
return wrong values or refuse, ``interop.to_numpy`` / ``to_torch`` /
``to_cupy`` give the right values (sharing memory where that is correct) or
a clear error. The CPU cases run anywhere; with a CUDA device the tour also
hands a CUDA tensor to CuPy and back.

Run::

    python examples/exchange_tour.py
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np

import interop
from interop.info import install_command

try:
    import torch
except ImportError as exc:  # an optional dependency: say what to install
    sys.stderr.write(
        f"{__file__}: this example needs PyTorch ({exc}).\n"
        f"Install it with: {install_command('examples')}\n"
    )
    raise SystemExit(2) from None


def cuda_status() -> str | None:
    """None when PyTorch and CuPy both see a CUDA device, else the reason."""
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # not installed, or no driver
        return f"CuPy is not usable ({type(exc).__name__})"
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Show each rule once; return what was seen, by case (the tests check it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="skip the GPU cases")
    args = parser.parse_args(argv)

    seen: dict[str, Any] = {}
    rows: list[tuple[str, str, str]] = []

    def show(key: str, call: str, value: Any, shown: str | None = None) -> None:
        seen[key] = value
        rows.append((key, call, shown if shown is not None else str(value)))

    t = torch.arange(6.0).reshape(2, 3)
    a = interop.to_numpy(t)
    a[0, 0] = 42.0  # shared memory: the tensor sees the write
    show("shared", "to_numpy(t); a[0, 0] = 42", float(t[0, 0]), f"t[0, 0] is now {float(t[0, 0])}")

    z = torch.tensor([1 + 2j, 3 - 4j])
    show("conj", "to_numpy(z.conj())", interop.to_numpy(z.conj()).tolist())
    show("neg", "to_numpy(z.conj().imag)", interop.to_numpy(z.conj().imag).tolist())

    r = interop.to_torch(np.arange(4.0)[::-1])  # torch.from_dlpack would abort the process
    show("reversed", "to_torch(np.arange(4.0)[::-1])", r.tolist())

    b = interop.to_numpy(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    show("bf16", "to_numpy(bfloat16 tensor)", (str(b.dtype), b.astype(np.float32).tolist()))

    ro = np.arange(3.0)
    ro.flags.writeable = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interop.to_torch(ro)
    show("readonly_warning", "to_torch(read-only array)", [w.category.__name__ for w in caught])

    e = interop.to_numpy(torch.ones(3).expand(2, 3))
    show("broadcast_readonly", "to_numpy(t.expand(2, 3))", not e.flags.writeable)

    try:
        interop.to_numpy(z.conj(), copy=False)
    except interop.CopyRequiredError as exc:
        show("copy_false", "to_numpy(z.conj(), copy=False)", type(exc).__name__)

    try:
        interop.to_numpy([1, 2, 3])
    except TypeError as exc:
        show("not_an_array", "to_numpy([1, 2, 3])", isinstance(exc, TypeError), f"TypeError: {exc}")

    why_not = "--cpu given" if args.cpu else cuda_status()
    if why_not is None:
        c = interop.to_cupy(t.cuda())  # zero-copy, ordered on CuPy's current stream
        show("cupy_sum", "float(to_cupy(t.cuda()).sum())", float(c.sum()))
        back = interop.to_torch(c[:, ::-1])  # negative strides on the device: copied
        show("cupy_reversed", "to_torch(c[:, ::-1]).tolist()", back.tolist())
    else:
        print(f"GPU cases left out: {why_not}.")

    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    print(f"{'case':{widths[0]}}  {'call':{widths[1]}}  result")
    print(f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 6}")
    for key, call, shown in rows:
        print(f"{key:{widths[0]}}  {call:{widths[1]}}  {shown}")
    return seen


if __name__ == "__main__":
    main()
