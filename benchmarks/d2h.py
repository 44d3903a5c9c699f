"""How fast is copy_to_host? ``python -m benchmarks.d2h [--quick] [--json PATH]``"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import interop
from benchmarks import lab
from benchmarks.host_limit import HOST_LIMIT, stages_and_trace
from interop.bench.measure import Ratio
from interop.bench.rows import RING, BenchContext, ring_bytes, strided


def _strided(ctx: BenchContext, fields: dict[str, Any]) -> dict[str, Any]:
    """A traced ``copy_to_host(x.T, out)`` and each transposed copy's extra device memory."""
    g = ctx.gpu()
    x_t, t_t, _, out = strided(g)
    where = lab.traced(lambda: interop.copy_to_host(x_t, out))
    taken = {}
    for label, source in (("copy_to_host(x.T, out)", x_t), ("copy_to_host(t.T, out)", t_t)):
        g.release()
        with lab.DeviceGrowth(g.cp, g.th) as growth:
            interop.copy_to_host(source, out)
            g.sync()
        taken[label] = growth.extra_bytes
    ratios = [
        Ratio.between(f"extra device memory of {label}", "memory", RING, value, ring_bytes())
        for label, value in taken.items()
    ]
    x_extra, t_extra = taken.values()
    memory = fields["memory"] | {"extra_device_bytes": x_extra}
    memory["copy_to_host(t.T) extra_device_bytes"] = t_extra
    return fields | {"trace": where, "ratios": [*fields["ratios"], *ratios], "memory": memory}


ROWS = (
    HOST_LIMIT,
    lab.package_row("host_copy"),
    lab.package_row("host_fresh"),
    lab.package_row("d2h_limit"),
    lab.diagnosed(lab.package_row("d2h_prealloc"), partial(stages_and_trace, to_host=True)),
    lab.package_row("d2h_pinned"),
    lab.package_row("d2h_fresh"),
    lab.diagnosed(lab.package_row("d2h_strided"), _strided),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
