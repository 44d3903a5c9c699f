"""How fast and how lean is save_npy? ``python -m benchmarks.npy [--quick] [--json PATH]``"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import interop
from benchmarks import lab
from interop.bench.rows import BenchContext


def _traced_save(ctx: BenchContext, fields: dict[str, Any]) -> dict[str, Any]:
    g = ctx.gpu()
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
        return fields | {"trace": lab.traced(lambda: interop.save_npy(g.x, Path(tmp) / "t.npy"))}


ROWS = (lab.package_row("save_npy_rss"), lab.diagnosed(lab.package_row("save_npy"), _traced_save))

if __name__ == "__main__":
    sys.exit(lab.main(ROWS, __spec__.name, __doc__))
