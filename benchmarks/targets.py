"""The lab's targets and verdicts (the judgement the GPU runs need, in one place).

A target bounds the ratios whose ``of`` and ``to`` match its shell patterns; one that matches
no ratio is missed, so a renamed ratio cannot pass unseen. :class:`RunJudge` compares rows.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from typing import Any

from interop.bench.measure import Ratio
from interop.bench.rows import RING

D2H_BOUND = "min(d2h_limit, the ring's D2H ceiling)"
H2D_BOUND = "min(h2d_limit, the ring's H2D ceiling)"
PREALLOC = "copy_to_host(x, out) of d2h_prealloc"
DASK = "interop.dask.save_npy"
CKPT_SAVE = "min(sequential file write, d2h_limit)"
CKPT_LOAD = "min(sequential file read, h2d_limit)"
_SAVE, _LOAD = "interop.safetensors.save_file", "interop.safetensors.load_file"


@dataclasses.dataclass(frozen=True)
class Target:
    """A bound (``at_most`` or ``at_least``) on the ratios matching ``of`` and ``to``."""

    of: str
    to: str
    quantity: str
    at_most: float | None = None
    at_least: float | None = None

    @property
    def words(self) -> str:
        """``"<= 1.2x"`` or ``">= 0.9x"``."""
        return f"<= {self.at_most:g}x" if self.at_most is not None else f">= {self.at_least:g}x"

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


#: The targets of every judged row.
TARGETS: dict[str, tuple[Target, ...]] = {
    "to_numpy_us": (_le("to_numpy", "numpy.from_dlpack", 1.2),),
    "to_torch_us": (_le("to_torch", "torch.from_dlpack", 1.2),),
    "exchange_us": (
        _le("to_cupy(t)", "cupy.from_dlpack(t)", 1.2),
        _le("to_torch(c)", "torch.from_dlpack(c)", 1.2),
    ),
    "torch_op_us": (_le("interop.torch_op", "a hand-written torch.library.custom_op", 1.3),),
    "host_copy": (_ge("copy_to_host", "numpy.copyto", 1.0),),
    "host_fresh": (  # busy first: the other pattern would take its ratios too
        _ge("copy_to_host(t) * busy", "t.numpy().copy() * busy", 1.0),
        _ge("copy_to_host(t) *", "t.numpy().copy() *", 1.0),
    ),
    "d2h_prealloc": (_ge("copy_to_host(x, out)", D2H_BOUND, 0.90),),
    "d2h_pinned": (_ge("copy_to_host(x, out=pinned)", "d2h_limit", 0.90),),
    "d2h_fresh": (
        _ge("copy_to_host(x)", PREALLOC, 0.80),
        _ge("copy_to_host(x)", "cupy.asnumpy(x)", 2.0),
        _ge("copy_to_host(x)", "t.cpu().numpy()", 2.0),
    ),
    "d2h_strided": (
        _ge("copy_to_host(?.T, out)", "copy_to_host(x, out)", 0.80),
        _le("extra device memory of copy_to_host(?.T, out)", RING, 1.0, "memory"),
    ),
    "h2d_pageable": (
        _ge("copy_to_device(host)", H2D_BOUND, 0.90),
        _le("extra host RSS of copy_to_device(host)", RING, 1.0, "memory"),
    ),
    "h2d_pinned": (_ge("copy_to_device(pinned)", "h2d_limit", 0.90),),
    "save_npy": (_ge("save_npy(x, path)", "min(d2h_limit, sequential file write)", 0.80),),
    "save_npy_rss": (
        _le("extra host RSS of save_npy", "the bound 2 x num_buffers x chunk_bytes", 1.0, "memory"),
    ),
    "dask_save_npy": (
        _ge(DASK, "da.store(open_memmap)", 1.0),
        _ge(DASK, "da.to_npy_stack", 1.0),
        _le(f"peak extra RSS per worker of {DASK}", "the bound *", 1.0, "memory"),
    ),
    "ckpt_save_cpu": (
        _ge(_SAVE, "safetensors.torch.save_file", 1.0),
        _le(f"extra host RSS of {_SAVE}", RING, 1.0, "memory"),
    ),
    "ckpt_load_cpu": (_ge(f"{_LOAD} + touch", "safetensors.torch.load_file + touch", 1.0),),
    "ckpt_save": (
        _ge(_SAVE, CKPT_SAVE, 0.9),
        _ge(_SAVE, "safetensors.torch.save_file", 3.0),
        _le(f"extra host RSS of {_SAVE}", RING, 1.0, "memory"),
    ),
    "ckpt_load": (
        _ge(f"{_LOAD}(device='cuda')", CKPT_LOAD, 0.9),
        _ge(f"{_LOAD}(device='cuda')", "safetensors.torch.load_file(device='cuda')", 2.0),
        _le(f"extra host RSS of {_LOAD}(device='cuda')", RING, 1.0, "memory"),
    ),
    "dask_save_npy_cupy": (
        _ge(DASK, "*+numpy.save per block", 1.0),
        _le(f"peak extra RSS of the process of {DASK}", "the bound *", 1.0, "memory"),
    ),
}

#: Rows that are yardsticks for others: no target.
REFERENCES = ("d2h_limit", "h2d_limit", "host_limit", "emulated_overlap", "d2h_hybrid")


def target_words(name: str) -> str:
    """A row's targets in words, as its ratios read; ``none: a reference`` without any."""
    words = [
        f"{t.of}: {t.words} {t.to}"
        if t.quantity == "memory"
        else f"{t.of}: {t.words} the {t.quantity} of {t.to}"
        for t in TARGETS.get(name, ())
    ]
    return "; ".join(words) or "none: a reference"


def judge(row: dict[str, Any], judged: bool = True) -> dict[str, Any]:
    """``row`` (a JSON row) with ``target`` (in words) and ``met``, and each ratio's ``target``
    and ``met``: every target met, or None for a reference, a row that did not run or a smoke
    run (``judged`` False). Context ratios get None; a target no ratio matched is added as a
    ratio of value None, missed."""
    row = dict(row, target=target_words(row["name"]), met=None)
    if row["status"] != "ok":
        return row
    ratios = [dict(r, target=None, met=None) for r in row.get("ratios", [])]
    verdicts: list[bool] = []
    for target in TARGETS.get(row["name"], ()):
        matched = [r for r in ratios if target.matches(r) and r["target"] is None]
        if not matched:
            missing = {"of": target.of, "quantity": target.quantity, "to": target.to}
            ratios.append(missing | {"value": None})
            matched = ratios[-1:]
        for r in matched:
            r["target"] = target.words
            r["met"] = target.met(r["value"]) if judged else None
            verdicts.append(target.met(r["value"]))
    row["ratios"] = ratios
    if judged and verdicts:
        row["met"] = all(verdicts)
    return row


class RunJudge:
    """:func:`judge` for one run's rows, in order, adding the ratios that compare rows: the
    pageable transfers with min(the link beside them, ``host_limit``'s ceiling with the link
    busy), ``d2h_fresh`` with ``d2h_prealloc``. Where that row did not run, the value is
    None and the target missed."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def _bound(self, row: dict[str, Any], limit: str, side: str) -> float | None:
        link = row.get("anchors", {}).get(f"{limit} GB/s")
        ceiling = self.rows.get("host_limit", {}).get("anchors", {}).get(f"{side} ceiling GB/s")
        return None if link is None or ceiling is None else min(link, ceiling)

    def _compared(self, row: dict[str, Any]) -> tuple[str, str, float | None] | None:
        """What ``row``'s throughput is compared with from other rows: (of, to, GB/s)."""
        if row["name"] == "d2h_prealloc":
            bound = self._bound(row, "d2h_limit", "pinned->pageable")
            return "copy_to_host(x, out)", D2H_BOUND, bound
        if row["name"] == "h2d_pageable":
            bound = self._bound(row, "h2d_limit", "pageable->pinned")
            return "copy_to_device(host)", H2D_BOUND, bound
        if row["name"] == "d2h_fresh":
            return "copy_to_host(x)", PREALLOC, self.rows.get("d2h_prealloc", {}).get("gbps")
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
