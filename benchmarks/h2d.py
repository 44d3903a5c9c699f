"""How fast is copy_to_device? ``python -m benchmarks.h2d [--quick] [--json PATH]``

The package's host-to-device rows (from pageable and from pinned memory) against the link
and the usual calls, ``h2d_pageable`` judged against the lower of the link and the ring's
H2D ceiling that ``host_limit`` measures in the same run, with its ring stages measured
alone and a traced run.
"""

from __future__ import annotations

import sys

from benchmarks import lab
from benchmarks.host_limit import HOST_LIMIT, stages_and_trace

ROWS = (
    HOST_LIMIT,
    lab.package_row("h2d_limit"),
    lab.diagnosed(
        lab.package_row("h2d_pageable"), lambda ctx, f: stages_and_trace(ctx, f, to_host=False)
    ),
    lab.package_row("h2d_pinned"),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
