"""How fast and how lean is save_npy? ``python -m benchmarks.npy [--quick] [--json PATH]``

The package's ``.npy`` rows: ``save_npy_rss``, the peak extra RSS of a fresh process saving
a CPU tensor, against twice the ring; ``save_npy``, a device array saved against the link
and a plain file write of the same bytes, with a traced run that shows the time spent
outside the transfer (creating, renaming, replacing the file).
"""

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
