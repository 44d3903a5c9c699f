"""The printed report of a benchmark run, made from its results (the same data as the JSON).

Every ratio is printed with its direction ("1.29x the time of
numpy.from_dlpack", "1.14x the throughput of numpy.copyto"), memory rows
lead with memory, rows that did not run are grouped by reason (one line per
reason), and a smoke run says so and judges nothing.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from .sizes import GiB, MiB

__all__ = ["format_bytes", "format_table", "ratio_text", "stages_text", "trace_text"]

_MEMORY_WORDS = (
    ("extra_host_rss_bytes", "extra host RSS"),
    ("extra_device_bytes", "extra device memory"),
    ("ring_bytes", "ring"),
    ("bound_bytes", "bound"),
    ("out_bytes", "out"),
)


def format_bytes(n: int | float) -> str:
    """``n`` bytes in MiB (GiB from 1 GiB), e.g. ``"128 MiB"``, ``"1.00 GiB"``."""
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if 0 < n < 10 * MiB else f"{n / MiB:.0f} MiB"


WIDTH = 100


_NBSP = "\N{NO-BREAK SPACE}"


def _wrap(text: str, indent: str = "", hanging: str = "         ") -> list[str]:
    """``text`` wrapped to the report's width, later lines indented by ``hanging``.

    A "(target ...)" is kept on one line.
    """
    text = re.sub(r"\(target [^)]*\)", lambda m: m.group(0).replace(" ", _NBSP), text)
    lines = textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + hanging,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace(_NBSP, " ") for line in lines]


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def ratio_text(ratio: dict[str, Any], judged: bool = True) -> str:
    """One ratio of the JSON in words, with its direction and target.

    E.g. ``"to_numpy: 1.33x the time of numpy.from_dlpack (target <= 2x)"``.
    """
    value = "n/a" if ratio["value"] is None else f"{ratio['value']:.2f}x"
    if ratio["quantity"] == "memory":
        text = f"{ratio['of']}: {value} {ratio['to']}"
    else:
        text = f"{ratio['of']}: {value} the {ratio['quantity']} of {ratio['to']}"
    if ratio.get("target"):
        if not judged:
            text += f" (target {ratio['target']}, not judged)"
        elif ratio.get("met") is False:
            text += f" (target {ratio['target']}: MISSED)"
        else:
            text += f" (target {ratio['target']})"
    return text


def _memory_key(key: str) -> str:
    for raw, words in _MEMORY_WORDS:
        if key.endswith(raw):
            return key[: -len(raw)] + words
    return key.removesuffix("_bytes").replace("_", " ")


def _memory_text(memory: dict[str, Any]) -> str:
    parts = []
    for key, value in memory.items():
        if key == "rss_method":
            parts.append(f"peak RSS from {value}")
        elif value is None:
            parts.append(f"{_memory_key(key)} not measured")
        elif isinstance(value, (int, float)):
            parts.append(f"{_memory_key(key)} {format_bytes(value)}")
    return ", ".join(parts)


def _figure(row: dict[str, Any], figure: str) -> str:
    memory = row.get("memory", {})
    if figure == "memory" and memory.get("extra_host_rss_bytes") is not None:
        return f"{format_bytes(memory['extra_host_rss_bytes'])} extra host RSS"
    if "gbps" in row:
        return f"{row['gbps']:.2f} GB/s"
    us = row.get("us")
    if isinstance(us, dict):
        return ", ".join(f"{label} {_num(v)} us" for label, v in us.items())
    return f"{_num(us)} us per call" if us is not None else ""


def _verdict(row: dict[str, Any], judged: bool) -> str:
    if not judged:
        return "not judged"
    return {True: "met", False: "MISSED", None: "reference"}[row["met"]]


def _header(results: dict[str, Any]) -> list[str]:
    cfg, sizes = results["config"], results["sizes"]
    dirty = " (with uncommitted changes)" if results.get("commit_dirty") else ""
    if results.get("quick"):
        title = (
            "interop bench --quick: a smoke run with small sizes and few repeats; "
            "it checks that every row runs and judges no target"
        )
    else:
        title = "interop bench"
    fields = [
        f"device   {results['device']}",
        f"run      {results['date']}, commit {results['commit'][:12]}{dirty}",
        f"config   chunk_bytes {format_bytes(cfg['chunk_bytes'])}, num_buffers "
        f"{cfg['num_buffers']}, host_threads {cfg['host_threads']} (staging ring "
        f"{format_bytes(cfg['chunk_bytes'] * cfg['num_buffers'])})",
        f"sizes    scale {sizes['scale']:g} (INTEROP_BENCH_SCALE multiplies every size and loop "
        f"count): GPU arrays {format_bytes(sizes['gpu_bytes'])}, host_copy "
        f"{format_bytes(sizes['host_bytes'])}, save_npy_rss {format_bytes(sizes['rss_bytes'])}"
        + (f", dask_save_npy {format_bytes(sizes['dask_bytes'])}" if "dask_bytes" in sizes else "")
        + f"; {sizes['calls']} calls per repeat in per-call rows",
        f"timing   median of {sizes['repeats']} timed repeats after an untimed, checked first "
        "call; anchors measured in the same run, interleaved",
        "ratios   'Nx the time of A': lower is better; 'Nx the throughput of A': higher is "
        "better; memory: extra memory over a bound, at most 1x is within it",
    ]
    lines = _wrap(title, hanging="  ")
    for field in fields:
        lines += _wrap(field)
    return lines


def stages_text(stages: dict[str, Any]) -> str:
    """The DMA and host stages of a GPU row measured alone, or why they were not."""
    st = stages["settings"]
    at = (
        f"at chunk_bytes {format_bytes(st['chunk_bytes'])}, num_buffers {st['num_buffers']}, "
        f"host_threads {st['host_threads']}"
    )
    if "error" in stages:
        return f"not measured ({stages['error']}) {at}"
    text = f"DMA {stages['DMA GB/s']:.2f} GB/s, host copies {stages['host GB/s']:.2f} GB/s {at}"
    pinning = stages.get("registration")
    if pinning is None:
        return text
    if "error" in pinning:
        return f"{text}; pinning the array in place not measured ({pinning['error']})"
    return (
        f"{text}; pinning the array in place (cudaHostRegister + unregister) "
        f"{pinning['whole GB/s']:.2f} GB/s whole, {pinning['chunks GB/s']:.2f} GB/s by chunks"
    )


def trace_text(where: dict[str, Any]) -> str:
    """Where a traced run of a GPU row's transfer spent its time, or why it was not traced."""
    if "error" in where:
        return f"not traced ({where['error']})"

    def rate(gbps: float | None) -> str:
        return "-" if gbps is None else f"{gbps:.2f} GB/s"

    host = (
        f"{where['threads']} host threads {rate(where['host_gbps_per_thread'])} each "
        f"(busy {where['host_busy']:.0%})"
        if where["threads"]
        else "no host threads (DMAs straight to or from pinned memory)"
    )
    return (
        f"{rate(where['rate_gbps'])} in all; device copies {rate(where['device_gbps'])} "
        f"(busy {where['device_busy']:.0%}); {host}; "
        f"issuer waited {where['issuer_wait_seconds']:.3f} s"
        + (
            f"; the call took {where['call_seconds']:.3f} s, {where['outside_seconds']:.3f} s "
            "of it outside the transfer"
            if "call_seconds" in where
            else ""
        )
        + f": limited by {where['limited_by']}"
    )


def profile_text(top: list[dict[str, Any]], shown: int = 4) -> str:
    """The largest own times per call of a profiled call (see ``profile_per_call``)."""
    parts = [f"{entry['function']} {entry['own_us']:.1f} us" for entry in top[:shown]]
    return "; ".join(parts) + " (own time per call under cProfile, which inflates it)"


def format_table(results: dict[str, Any]) -> str:
    """The printed report of a run's results (as returned by the run or read from its JSON).

    Parameters
    ----------
    results : dict
        A bench results dict (schema 2).

    Returns
    -------
    str
        The header (device, commit, config, sizes, how to read ratios), one
        block per measured row (figure, verdict, every ratio with its
        direction, memory), one line per group of rows that did not run with
        their shared reason, notes, and a summary line.
    """
    from .rows import ROWS

    figures = {spec.name: spec.figure for spec in ROWS}
    judged = not results.get("quick")
    lines = _header(results)
    # the name column fits the longest name of a row that ran
    width = max([14] + [len(row["name"]) for row in results["rows"] if row["status"] == "ok"])
    lines += ["", f"{'row':<{width}} {'result':<32} verdict"]
    not_run: dict[tuple[str, str], list[str]] = {}
    counts: dict[str, int] = {}
    for row in results["rows"]:
        if row["status"] != "ok":
            not_run.setdefault((row["status"], row["reason"]), []).append(row["name"])
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            continue
        verdict = _verdict(row, judged)
        key = verdict.lower() if judged else "measured (not judged: a smoke run)"
        counts[key] = counts.get(key, 0) + 1
        figure = _figure(row, figures.get(row["name"], "gbps"))
        lines.append(f"{row['name']:<{width}} {figure:<32} {verdict}")
        indent = " " * (width + 1)
        if not row.get("ratios"):
            lines.append(f"{indent}target: {row['target']}")
        for r in row.get("ratios", []):
            lines += _wrap(ratio_text(r, judged), indent, "    ")
        if row.get("memory"):
            lines += _wrap(f"memory: {_memory_text(row['memory'])}", indent, "    ")
        if row.get("stages"):
            lines += _wrap(f"ring stages alone: {stages_text(row['stages'])}", indent, "    ")
        if row.get("trace"):
            lines += _wrap(f"where the time went: {trace_text(row['trace'])}", indent, "    ")
        for label, top in row.get("profile", {}).items():
            lines += _wrap(f"profile of {label}: {profile_text(top)}", indent, "    ")
    for (status, reason), names in not_run.items():
        rows = f"{len(names)} rows" if len(names) > 1 else "1 row"
        lines += _wrap(f"{status} ({rows}: {', '.join(names)}): {reason}", hanging="    ")
    notes = results.get("notes", {})
    if notes.get("pinned_pages_in_rss") is False:
        lines.append(
            "note: this driver does not count pinned pages in RSS; "
            "extra host memory of GPU rows is pageable memory only"
        )
    for error in notes.get("release_errors", []):
        lines.append(f"note: releasing caches failed {error}")
    if notes.get("close_error"):
        lines.append(f"note: closing the GPU arrays failed: {notes['close_error']}")
    lines.append("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return "\n".join(lines)
