"""How fast is copy_to_device? ``python -m benchmarks.h2d [--quick] [--json PATH]``"""

from __future__ import annotations

import sys
from functools import partial

from benchmarks import lab
from benchmarks.host_limit import HOST_LIMIT, stages_and_trace

ROWS = (
    HOST_LIMIT,
    lab.package_row("h2d_limit"),
    lab.diagnosed(lab.package_row("h2d_pageable"), partial(stages_and_trace, to_host=False)),
    lab.package_row("h2d_pinned"),
)

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
