"""A tour of interop's exchange rules on the CPU (and the GPU when there is one).

Run: ``python examples/exchange_tour.py``. The tests run ``main()``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

import interop


def main() -> dict[str, object]:
    """Show each rule once; return what was seen (the tests check it)."""
    seen: dict[str, object] = {}

    t = torch.arange(6.0).reshape(2, 3)
    a = interop.to_numpy(t)
    a[0, 0] = 42.0  # shared memory: the tensor sees the write
    seen["shared"] = float(t[0, 0])

    z = torch.tensor([1 + 2j, 3 - 4j])
    seen["conj"] = interop.to_numpy(z.conj()).tolist()
    seen["neg"] = interop.to_numpy(z.conj().imag).tolist()

    r = interop.to_torch(np.arange(4.0)[::-1])  # torch.from_dlpack would abort here
    seen["reversed"] = r.tolist()

    b = interop.to_numpy(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    seen["bf16"] = (str(b.dtype), b.astype(np.float32).tolist())

    ro = np.arange(3.0)
    ro.flags.writeable = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interop.to_torch(ro)
    seen["readonly_warning"] = [w.category.__name__ for w in caught]

    try:
        interop.to_numpy(z.conj(), copy=False)
    except interop.CopyRequiredError as exc:
        seen["copy_false"] = type(exc).__name__

    if torch.cuda.is_available():
        c = interop.to_cupy(t.cuda())
        seen["cupy_sum"] = float(c.sum())

    for key, value in seen.items():
        print(f"{key:18} {value}")
    return seen


if __name__ == "__main__":
    main()
