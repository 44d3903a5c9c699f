"""The table ``python -m interop bench`` prints from its results (the same data as the JSON)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .measure import GiB, MiB

#: How the table names each fact of the JSON's ``machine``.
_MACHINE = (
    "cpu_model={}, cpus={} CPUs, cpus_usable={} usable, numa_nodes=NUMA nodes {}, gpu_numa_node="
    "the GPU on node {}, l3_bytes=L3 {}, transparent_hugepages=transparent huge pages {}, "
    "glibc=glibc {}, memory_bytes=memory {}"
)
_MACHINE_WORDS = dict(pair.split("=") for pair in _MACHINE.split(", "))


def format_bytes(n: float) -> str:
    """``n`` bytes in MiB (GiB from 1 GiB), e.g. ``"128 MiB"``, ``"1.00 GiB"``."""
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if 0 < n < 10 * MiB else f"{n / MiB:.0f} MiB"


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def ratio_text(ratio: dict[str, Any]) -> str:
    """One ratio of the JSON in words, with its direction:
    ``"to_numpy: 1.33x the time of numpy.from_dlpack"``."""
    value = "n/a" if ratio["value"] is None else f"{ratio['value']:.2f}x"
    if ratio["quantity"] == "memory":
        return f"{ratio['of']}: {value} {ratio['to']}"
    return f"{ratio['of']}: {value} the {ratio['quantity']} of {ratio['to']}"


def figure_text(row: dict[str, Any], memory_first: bool = False) -> str:
    """A measured row's figure: extra host RSS (``memory_first``), GB/s or us per call."""
    memory = row.get("memory", {}).get("extra_host_rss_bytes")
    if memory_first and memory is not None:
        return f"{format_bytes(memory)} extra host RSS"
    if "gbps" in row:
        return f"{row['gbps']:.2f} GB/s"
    us = row.get("us")
    if isinstance(us, dict):
        return ", ".join(f"{label} {_num(v)} us" for label, v in us.items())
    return f"{_num(us)} us per call" if us is not None else ""


def memory_text(memory: dict[str, Any]) -> str:
    """A row's ``memory`` in words: ``"extra host RSS 12 MiB, ring 128 MiB"``."""
    words = {"extra_host_rss": "extra host RSS", "extra_device": "extra device memory"}
    parts = []
    for key, value in memory.items():
        prefix, _, last = key.removesuffix("_bytes").rpartition(" ")
        name = f"{prefix} {words.get(last, last.replace('_', ' '))}".strip()
        if key == "rss_method":
            parts.append(f"peak RSS from {value}")
        elif value is None:
            parts.append(f"{name} not measured")
        elif isinstance(value, (int, float)):
            parts.append(f"{name} {format_bytes(value)}")
    return ", ".join(parts)


def machine_text(machine: dict[str, Any]) -> str:
    """The JSON's ``machine`` in words, facts that could not be read left out."""
    facts = {k: format_bytes(v) if k.endswith("_bytes") else v for k, v in machine.items()}
    words = _MACHINE_WORDS
    return ", ".join(words[k].format(v) for k, v in facts.items() if v is not None and k in words)


def not_run_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per reason the rows that did not run share: ``"skipped (2 rows: a, b): why"``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row["status"] != "ok":
            groups.setdefault((row["status"], row["reason"]), []).append(row["name"])
    return [
        f"{status} ({len(names)} row{'s' * (len(names) > 1)}: {', '.join(names)}): {reason}"
        for (status, reason), names in groups.items()
    ]


def format_table(
    results: dict[str, Any],
    title: str = "interop bench",
    row_lines: Callable[[dict[str, Any], bool], list[str]] | None = None,
) -> str:
    """The printed table of a run: ``title``, the run's header, then per measured row its
    figure and :func:`row_lines` (or the given function of the row and whether its figure
    is memory), then the rows that did not run, grouped by reason."""
    from .rows import ROWS

    memory_rows = {spec.name for spec in ROWS if spec.figure == "memory"}
    cfg, sizes = results["config"], results["sizes"]
    quick = " --quick: a smoke run (small sizes, few repeats)" if results.get("quick") else ""
    lines = [
        title + quick,
        f"device   {results['device']}",
        f"machine  {machine_text(results.get('machine') or {})}",
        f"run      {results['date']}, commit {results['commit'][:12]}",
        f"config   chunk_bytes {format_bytes(cfg['chunk_bytes'])}, num_buffers "
        f"{cfg['num_buffers']}, host_threads {cfg['host_threads']}",
        f"timing   median of {sizes['repeats']} repeats, scale {sizes['scale']:g} "
        "(INTEROP_BENCH_SCALE); anchors measured in the same run, interleaved",
        "ratios   'the time of': lower is better; 'the throughput of': higher is better; "
        "memory: extra over a bound",
        "",
    ]
    width = max([14] + [len(row["name"]) for row in results["rows"]])
    for row in results["rows"]:
        if row["status"] == "ok":
            more = (row_lines or _row_lines)(row, row["name"] in memory_rows)
            lines += [f"{row['name']:<{width}} {more[0]}".rstrip()]
            lines += [" " * (width + 1) + line for line in more[1:]]
    lines += not_run_lines(results["rows"])
    if results.get("notes", {}).get("pinned_pages_in_rss") is False:
        lines.append("note: this driver does not count pinned pages in RSS")
    return "\n".join(lines)


def _row_lines(row: dict[str, Any], memory_first: bool) -> list[str]:
    """A measured row's figure, then its ratios and memory, one a line."""
    lines = [figure_text(row, memory_first), *map(ratio_text, row.get("ratios", []))]
    return lines + ([f"memory: {memory_text(row['memory'])}"] if row.get("memory") else [])
