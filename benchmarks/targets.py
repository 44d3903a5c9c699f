"""The targets of the benchmark rows, and the verdicts.

``python -m interop bench`` reports ratios measured in one run; the lab says
which of them are targets and judges them. A target names a ratio by its
``of`` and ``to`` (shell patterns, :func:`fnmatch.fnmatchcase`) and bounds
its value. A row meets its target when every target of the row matched at
least one ratio and every matched ratio is within its bound; a target that
matches no ratio is missed (a renamed ratio cannot pass unseen). Rows without
targets (the link's limits, ``host_limit``) are references: ``met`` is None.
A smoke run (``--quick``) carries the targets but judges none.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from typing import Any

from benchmarks.dask_save import MEMMAP, OURS, STACK
from interop.bench.results import Ratio

RING = "the ring size (num_buffers x chunk_bytes)"
#: What the pageable transfers are judged against: the link, or the ring's
#: host side where that is lower (``host_limit``'s copies while the link is busy).
D2H_BOUND = "min(d2h_limit, the ring's D2H ceiling)"
H2D_BOUND = "min(h2d_limit, the ring's H2D ceiling)"
PREALLOC = "copy_to_host(x, out) of d2h_prealloc"
#: The recipe the CuPy dask row compares with (``cupy.asnumpy`` + ``numpy.save`` per block).
RECIPE = "*+numpy.save per block"


@dataclasses.dataclass(frozen=True)
class Target:
    """A bound on the ratios whose ``of`` and ``to`` match these patterns.

    Attributes
    ----------
    of, to : str
        Patterns of the ratio's ``of`` and ``to``.
    quantity : str
        ``"time"``, ``"throughput"`` or ``"memory"`` (what the ratio compares).
    at_most, at_least : float, optional
        The bound (one of them).
    """

    of: str
    to: str
    quantity: str
    at_most: float | None = None
    at_least: float | None = None

    @property
    def words(self) -> str:
        """``"<= 2x"`` or ``">= 0.9x"``."""
        if self.at_most is not None:
            return f"<= {self.at_most:g}x"
        return f">= {self.at_least:g}x"

    def matches(self, ratio: dict[str, Any]) -> bool:
        """Whether ``ratio`` (a JSON ratio) is one this target bounds."""
        return fnmatchcase(ratio["of"], self.of) and fnmatchcase(ratio["to"], self.to)

    def met(self, value: float | None) -> bool:
        """Whether ``value`` is within the bound (a ratio not measured is not)."""
        if value is None:
            return False
        if self.at_most is not None:
            return value <= self.at_most
        return self.at_least is None or value >= self.at_least


def _le(of: str, to: str, bound: float, quantity: str = "time") -> Target:
    return Target(of, to, quantity, at_most=bound)


def _ge(of: str, to: str, bound: float) -> Target:
    return Target(of, to, "throughput", at_least=bound)


#: Per row: its target in words, and the targets that judge it.
TARGETS: dict[str, tuple[str, tuple[Target, ...]]] = {
    "to_numpy_us": (
        "at most 1.2x the time of numpy.from_dlpack",
        (_le("to_numpy", "numpy.from_dlpack", 1.2),),
    ),
    "to_torch_us": (
        "at most 1.2x the time of torch.from_dlpack",
        (_le("to_torch", "torch.from_dlpack", 1.2),),
    ),
    "host_copy": (
        "at least 1.0x the throughput of one numpy.copyto",
        (_ge("copy_to_host", "numpy.copyto", 1.0),),
    ),
    "host_fresh": (
        "at least 1.0x the throughput of t.numpy().copy() at every size, also with every core busy",
        (  # busy first: the other pattern would take its ratios too
            _ge("copy_to_host(t) * busy", "t.numpy().copy() * busy", 1.0),
            _ge("copy_to_host(t) *", "t.numpy().copy() *", 1.0),
        ),
    ),
    "save_npy_rss": (
        "extra RSS at most 2 x num_buffers x chunk_bytes",
        (
            _le(
                "extra host RSS of save_npy",
                "the bound 2 x num_buffers x chunk_bytes",
                1.0,
                "memory",
            ),
        ),
    ),
    "dask_save_npy": (
        "at least 1x the throughput of da.store into an open_memmap and of da.to_npy_stack; "
        "peak extra RSS per worker at most one block + 2 x num_buffers x chunk_bytes",
        (
            _ge(OURS, MEMMAP, 1.0),
            _ge(OURS, STACK, 1.0),
            _le(f"peak extra RSS per worker of {OURS}", "the bound *", 1.0, "memory"),
        ),
    ),
    "d2h_prealloc": (
        f"at least 0.90x the throughput of {D2H_BOUND} (the ratio to d2h_limit is shown too)",
        (_ge("copy_to_host(x, out)", D2H_BOUND, 0.90),),
    ),
    "d2h_pinned": (
        "at least 0.90x the throughput of d2h_limit",
        (_ge("copy_to_host(x, out=pinned)", "d2h_limit", 0.90),),
    ),
    "d2h_fresh": (
        "at least 0.80x the throughput of d2h_prealloc, "
        "and 2x that of cupy.asnumpy(x) and of t.cpu().numpy()",
        (
            _ge("copy_to_host(x)", PREALLOC, 0.80),
            _ge("copy_to_host(x)", "cupy.asnumpy(x)", 2.0),
            _ge("copy_to_host(x)", "t.cpu().numpy()", 2.0),
        ),
    ),
    "d2h_strided": (
        "at least 0.80x the throughput of d2h_prealloc; "
        "extra device memory at most num_buffers x chunk_bytes",
        (
            _ge("copy_to_host(?.T, out)", "copy_to_host(x, out)", 0.80),
            _le("extra device memory of copy_to_host(?.T, out)", RING, 1.0, "memory"),
        ),
    ),
    "h2d_pageable": (
        f"at least 0.90x the throughput of {H2D_BOUND} (the ratio to h2d_limit is shown "
        "too); extra host memory at most num_buffers x chunk_bytes",
        (
            _ge("copy_to_device(host)", H2D_BOUND, 0.90),
            _le("extra host RSS of copy_to_device(host)", RING, 1.0, "memory"),
        ),
    ),
    "h2d_pinned": (
        "at least 0.90x the throughput of h2d_limit",
        (_ge("copy_to_device(pinned)", "h2d_limit", 0.90),),
    ),
    "exchange_us": (
        "at most 1.2x the time of cupy.from_dlpack(t) / torch.from_dlpack(c)",
        (
            _le("to_cupy(t)", "cupy.from_dlpack(t)", 1.2),
            _le("to_torch(c)", "torch.from_dlpack(c)", 1.2),
        ),
    ),
    "torch_op_us": (
        "at most 1.3x the time of a hand-written torch.library.custom_op",
        (_le("interop.torch_op", "a hand-written torch.library.custom_op", 1.3),),
    ),
    "save_npy": (
        "at least 0.80x the throughput of min(d2h_limit, sequential file write)",
        (_ge("save_npy(x, path)", "min(d2h_limit, sequential file write)", 0.80),),
    ),
    "dask_save_npy_cupy": (
        "at least 1x the throughput of cupy.asnumpy + numpy.save per block; "
        "extra host RSS at most 2 threads x 2 x num_buffers x chunk_bytes",
        (
            _ge(OURS, RECIPE, 1.0),
            _le(f"peak extra RSS of the process of {OURS}", "the bound *", 1.0, "memory"),
        ),
    ),
}

#: Rows that are references (no target), in words.
REFERENCES = {
    "d2h_limit": "none: the link's device-to-host limit, a reference for other rows",
    "h2d_limit": "none: the link's host-to-device limit, a reference for other rows",
    "host_limit": "none: the ring's ceilings (host copies by 1-16 threads, pinning rates)",
    "emulated_overlap": "none: the pipeline's overlap of DMA and host copies on a CPU",
}


def target_words(name: str) -> str:
    """A row's target in words (``"none: ..."`` for a reference row)."""
    if name in TARGETS:
        return TARGETS[name][0]
    return REFERENCES.get(name, "none")


class RunJudge:
    """:func:`judge` for one run, adding the ratios that compare rows.

    A row's own ratios compare calls measured together; a few targets compare
    with another row of the same run. The ring's ceilings come from
    ``host_limit`` (each side's best host-copy rate while the link is busy),
    ``d2h_prealloc``'s rate is what ``d2h_fresh`` is judged against. The rows
    run in order (``host_limit`` and ``d2h_prealloc`` first), so each derived
    ratio is added to its row before that row is judged; where the other row
    did not run, the ratio's value is None and its target is missed.
    """

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def _gbps(self, name: str) -> float | None:
        row = self.rows.get(name)
        value = None if row is None else row.get("gbps")
        return value if isinstance(value, int | float) else None

    def _bound(self, row: dict[str, Any], limit: str, ceiling: str) -> float | None:
        """min(the link, as measured beside ``row``; the ring's ``ceiling``)."""
        link = row.get("anchors", {}).get(f"{limit} GB/s")
        host_limit = self.rows.get("host_limit", {})
        ring = host_limit.get("anchors", {}).get(f"{ceiling} ceiling GB/s")
        return None if link is None or ring is None else min(link, ring)

    def _compared(self, row: dict[str, Any]) -> tuple[str, str, float | None] | None:
        """What ``row``'s throughput is compared with from other rows: (of, to, GB/s)."""
        name = row["name"]
        if name == "d2h_prealloc":
            bound = self._bound(row, "d2h_limit", "pinned->pageable")
            return "copy_to_host(x, out)", D2H_BOUND, bound
        if name == "h2d_pageable":
            bound = self._bound(row, "h2d_limit", "pageable->pinned")
            return "copy_to_device(host)", H2D_BOUND, bound
        if name == "d2h_fresh":
            return "copy_to_host(x)", PREALLOC, self._gbps("d2h_prealloc")
        return None

    def __call__(self, row: dict[str, Any], judged: bool = True) -> dict[str, Any]:
        if row.get("status") == "ok":
            compared = self._compared(row)
            if compared is not None:
                of, to, reference = compared
                ratio = Ratio.between(of, "throughput", to, row.get("gbps"), reference)
                row = dict(row, ratios=[*row.get("ratios", []), ratio.record()])
            self.rows[row["name"]] = row
        return judge(row, judged)


def judge(row: dict[str, Any], judged: bool = True) -> dict[str, Any]:
    """``row`` (a JSON row) with its target in words, each targeted ratio's ``target`` and
    ``met``, and the row's ``met``: every target met (None for a reference row, a row
    that did not run, or a smoke run, ``judged=False``). Context ratios get ``target``
    and ``met`` None. A target no ratio matched adds a ratio of value None, missed.
    """
    row = dict(row, target=target_words(row["name"]), met=None)
    if row["status"] != "ok":
        return row
    targets = TARGETS.get(row["name"], ("", ()))[1]
    ratios = [dict(r, target=None, met=None) for r in row.get("ratios", [])]
    verdicts: list[bool] = []
    for target in targets:
        matched = [r for r in ratios if target.matches(r) and r["target"] is None]
        if not matched:
            missing = {"of": target.of, "quantity": target.quantity, "to": target.to}
            ratios.append(missing | {"value": None, "target": None, "met": None})
            matched = ratios[-1:]
        for r in matched:
            r["target"] = target.words
            r["met"] = target.met(r["value"]) if judged else None
            verdicts.append(target.met(r["value"]))
    row["ratios"] = ratios
    if judged and verdicts:
        row["met"] = all(verdicts)
    return row
