"""The documentation: the built site, and what its pages claim.

The site is built as CI builds it (``mkdocs build --strict``, into a temporary
directory); without mkdocs and its plugins (the ``docs`` extra) those tests
skip. The other tests check the docs' own statements against the code and
against the kept benchmark results: the speed table, the install names, the
snippets users copy.
"""

from __future__ import annotations

import html
import importlib.util
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import interop
from benchmarks import tables
from tests.helpers import NO_GPU, REPO_ROOT, child_env, run_python

DOCS = REPO_ROOT / "docs"
# A code block of the site's main column shows 80 characters a line in a 1280-pixel
# window (scripts/site_check.py measures it in Chromium); a longer line is cut off.
CODE_LINE_LIMIT = 80


# ------------------------------------------------------------------ the built site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with ``mkdocs build --strict`` (a warning fails the build)."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or (
            "." in module and importlib.util.find_spec(module) is None
        ):
            pytest.skip(
                f"the site tests need the docs extra, which the test extra leaves out: "
                f'pip install -e ".[test,docs]" ({module} is not installed)'
            )
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        env=child_env({"NO_MKDOCS_2_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


_PRE = re.compile(r"<pre\b[^>]*>(.*?)</pre>", re.S)
_TAG = re.compile(r"<[^>]+>")


def _code_lines(page: str) -> list[str]:
    """The text lines of every code block of a built page (signatures included)."""
    lines = []
    for block in _PRE.findall(page):
        lines += html.unescape(_TAG.sub("", block)).splitlines()
    return lines


def test_the_site_builds_and_every_code_line_fits(site):
    pages = sorted(site.rglob("*.html"))
    assert site / "index.html" in pages
    assert site / "api" / "index.html" in pages
    too_long = [
        f"{page.relative_to(site)}: {len(line)}: {line}"
        for page in pages
        for line in _code_lines(page.read_text())
        if len(line) > CODE_LINE_LIMIT
    ]
    assert too_long == []


def test_signatures_are_formatted(site):
    """A signature longer than the page is wrapped one parameter a line (ruff)."""
    api = (site / "api" / "index.html").read_text()
    start = api.index('id="interop.copy_to_host_async"')
    signature = _code_lines(api[start : api.index("</pre>", start) + len("</pre>")])
    assert signature[0] == "copy_to_host_async("
    assert signature[-1].startswith(")")
    assert len(signature) > 3


def _api_ids(site: Path) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', (site / "api" / "index.html").read_text()))


def test_every_public_name_is_in_the_api_reference(site):
    import interop.dask

    ids = _api_ids(site)
    public = [f"interop.{name}" for name in interop.__all__]
    public += [f"interop.dask.{name}" for name in interop.dask.__all__]
    assert [name for name in public if name not in ids] == []


_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


def _docstrings(obj: Any) -> str:
    """The docstring of ``obj`` and, for a class, of its public members."""
    text = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        for name, member in vars(obj).items():
            if not name.startswith("_"):
                text += "\n" + (inspect.getdoc(member) or "")
    return text


def test_references_to_public_names_are_links(site):
    """``:func:`copy_to_host_async``` in a docstring links to that entry."""
    import interop.dask

    api = (site / "api" / "index.html").read_text()
    sections = dict(re.findall(r'<h2 id="(interop\.[^"]+)"(.*?)(?=<h2 id=|\Z)', api, re.S))
    missing, seen = [], 0
    for module in (interop, interop.dask):
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            section = sections[f"{module.__name__}.{name}"]
            for target in _ROLE.findall(_docstrings(obj)):
                short = target.rsplit(".", 1)[-1]
                if module is interop.dask and short in interop.dask.__all__:
                    identifier = f"interop.dask.{short}"
                elif short == "config":  # the one instance of Config: the class's entry
                    identifier = "interop.config.Config"
                elif short in interop.__all__:
                    identifier = f"interop.{short}"
                else:
                    continue  # a private helper or another library: code, not a link
                seen += 1
                if f'href="#{identifier}"' not in section:
                    missing.append(f"{module.__name__}.{name} -> {identifier}")
    assert seen >= 5  # the docstrings do refer to each other
    assert missing == []


def test_the_home_page_opens_with_the_install_line_and_the_speed_table(site):
    page = (site / "index.html").read_text()
    article = page[page.index("<article") :]
    article = article[: article.index("<h2")]  # what comes before the first section
    table = article.index("<table")
    assert "pip install -e '.[torch,cuda12]'" in html.unescape(_TAG.sub("", article[:table]))
    assert "copy_to_host(x, out)" in article[table:]


# ------------------------------------------------------------ the speed table


def _newest_h100_run() -> dict[str, Any]:
    runs = [
        json.loads(p.read_text()) for p in (REPO_ROOT / "benchmarks" / "results").glob("*.json")
    ]
    runs = [run for run in runs if "H100" in run["device"]]
    assert runs, "no H100 run is kept in benchmarks/results/"
    return max(runs, key=lambda run: run["date"])


def _gbps(run: dict[str, Any], row: str, label: str) -> float:
    """GB/s of interop's call: bytes over the median of its timed repeats."""
    (found,) = [r for r in run["bench"]["rows"] if r["name"] == row]
    sample = found["samples"][label]
    return sample["bytes"] / statistics.median(sample["seconds"]) / 1e9


def _best_gbps(run: dict[str, Any], label: str, at: int = 1 << 30) -> float:
    """GB/s of another call at its best in the run: its fastest repeat of ``at`` bytes in any
    row, or the sweep's figure of it."""
    rows = run["bench"]["rows"] + [p for r in run["sweep"]["rows"] for p in r.get("points", [])]
    seconds = [
        min(sample["seconds"])
        for r in rows
        for name, sample in r.get("samples", {}).items()
        if label in (name, f"{r.get('name')} {name}".replace(" cudaMemcpyAsync", ""))
        and sample["bytes"] == at
    ]
    swept = [
        r["anchors"][f"{label} GB/s"]
        for r in run["sweep"]["rows"]
        if f"{label} GB/s" in r.get("anchors", {})
    ]
    return max([at / s / 1e9 for s in seconds] + swept)


# Each row of the table: (bench row, interop's call, the usual calls, the limit's row and call).
TABLE = [
    ("d2h_prealloc", "copy_to_host(x, out)", ["cupy.asnumpy(x, out=out)"], "d2h_limit"),
    ("d2h_prealloc", "copy_to_host(x, out=pinned)", ["cupy.asnumpy(x, out=pinned)"], "d2h_limit"),
    ("d2h_strided", "copy_to_host(x.T, out)", ["cupy.asnumpy(x.T, out=out)"], "d2h_limit"),
    ("d2h_fresh", "copy_to_host(x)", ["cupy.asnumpy(x)", "t.cpu().numpy()"], "d2h_limit"),
    (
        "h2d_pageable",
        "copy_to_device(host)",
        ["cupy.asarray(host)", "torch.from_numpy(host).cuda()"],
        "h2d_limit",
    ),
    ("save_npy", "save_npy(x, path)", [], "disk"),
]


def _table(path: Path) -> list[list[str]]:
    text = path.read_text()
    start = text.index("| you move |")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _numbers(cell: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+\.\d+", cell)]


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/benchmarks.md"])
def test_the_speed_table_gives_the_newest_h100_run(page):
    """Every figure of the table is the newest kept H100 run's, to the digit shown."""
    run = _newest_h100_run()
    path = REPO_ROOT / page
    rows = _table(path)
    assert len(rows) == len(TABLE)
    for cells, (row, ours, usual, limit) in zip(rows, TABLE, strict=True):
        _move, _call, figure, _instead, figures, link = cells
        assert _numbers(figure) == [pytest.approx(_gbps(run, row, ours), abs=0.051)], cells
        expected = [_best_gbps(run, label) for label in usual]  # the usual calls at their best
        assert all(e >= _gbps(run, row, label) for e, label in zip(expected, usual, strict=True))
        if usual:
            assert _numbers(figures) == pytest.approx(expected, abs=0.051), cells
        else:
            assert figures == "not measured", cells  # the run did not time it: said, not guessed
        if limit == "disk":
            assert _numbers(link) == [pytest.approx(_best_gbps(run, "file write"), abs=0.0051)]
        else:
            assert _numbers(link) == [pytest.approx(_best_gbps(run, limit), abs=0.051)]
    text = path.read_text()
    assert f"`{run['commit'][:7]}`" in text  # which run
    assert run["date"][:10] in text


def test_the_pages_tables_are_the_kept_runs_as_the_generator_writes_them(tmp_path, monkeypatch):
    """Regenerated into a copy of the pages: no difference. A figure edited by hand is found
    by --check (nothing written) and written back by the generator."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").symlink_to(REPO_ROOT / "benchmarks")
    for page in tables.PAGES:
        (tmp_path / page).write_text((REPO_ROOT / page).read_text())
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    assert tables.main(["--check"]) == 0
    readme, committed = tmp_path / "README.md", (REPO_ROOT / "README.md").read_text()
    readme.write_text(committed.replace("| 13.6 |", "| 8.4 |", 1))
    assert (tables.main(["--check"]), readme.read_text() == committed) == (1, False)
    assert (tables.main([]), readme.read_text() == committed) == (0, True)


#: A measured figure in a table row: a decimal with its unit (not a target's bound), or a
#: decimal alone in a cell.
_FIGURE = re.compile(
    r"(?<!at least )(?<!at most )(?<![\u2265\u2264] )\d+\.\d+ ?(\u00d7|GB/s|µs)"
    r"|\|\s*\**\d+\.\d+\**(\s*/\s*\d+\.\d+)*\**\s*(\(|\|)"
)


def test_no_figure_table_is_written_by_hand():
    """Every table row holding a measured figure lies between the markers that
    ``python -m benchmarks tables`` writes within (its test: regenerated, no difference)."""
    for path in [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = re.sub(r"<!-- table:.*?<!-- /table -->", "", path.read_text(), flags=re.S)
        rows = [row for row in text.splitlines() if row.startswith("|") and _FIGURE.search(row)]
        assert rows == [], f"{path.relative_to(REPO_ROOT)}: figures outside the generated tables"


# -------------------------------------------------------------- install hints


def _extras() -> set[str]:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    table = text.split("\n[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([a-z0-9]+) = \[", table, flags=re.MULTILINE))


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_first_install_line_works_in_a_fresh_clone(page):
    """``pip install torch-cupy-interop`` fails: the distribution is not on PyPI yet. The
    first line a newcomer copies installs the clone; the published name follows, marked."""
    lines = [line for line in (REPO_ROOT / page).read_text().splitlines()]
    first, second = [line for line in lines if line.startswith("pip install")][:2]
    command, comment = first.split("  #")
    assert command.split() == ["pip", "install", "-e", "'.[torch,cuda12]'"]
    assert "clone" in comment
    assert set(re.search(r"\[(.*)\]", command)[1].split(",")) <= _extras()
    assert second.startswith("pip install 'torch-cupy-interop[torch,cuda12]'")
    assert "once released" in second


_WRONG_INSTALL = re.compile(r"(?<![\w.-])interop\[")


def test_install_hints_name_the_distribution_not_the_unrelated_interop():
    """``pip install 'interop[dask]'`` installs Illumina's InterOp, not this library."""
    files = [REPO_ROOT / "README.md"]
    for folder in ("interop", "docs", "examples"):
        files += [p for p in (REPO_ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    wrong = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _WRONG_INSTALL.search(line)
    ]
    assert wrong == [], "say 'torch-cupy-interop[...]' instead"


# ----------------------------------------------------------- snippets users copy


_FENCE = re.compile(r"^( *)```python[^\n]*\n(.*?)^\1```", flags=re.S | re.M)
#: The first line of a block that cannot run without a GPU; no page opens with one.
NEEDS_CUDA = "# needs a CUDA device"


def _python_blocks(path: Path) -> list[str]:
    """The page's Python code blocks, in order, those in lists dedented."""
    return [textwrap.dedent(block) for _indent, block in _FENCE.findall(path.read_text())]


def _block_with(path: Path, text: str) -> str:
    (block,) = [b for b in _python_blocks(path) if text in b]
    return block


def _pages() -> list[Path]:
    """README.md and every page of the site (the strict build refuses a page left out of
    the navigation), those with a Python block."""
    pages = [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [page for page in pages if "_ext" not in page.parts and _python_blocks(page)]


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("page", _pages(), ids=lambda page: page.name)
def test_the_first_example_of_every_page_runs_on_a_cpu_as_pasted(page, where, tmp_path):
    """The first Python block a reader meets on a page runs, pasted alone into a fresh
    interpreter (warnings are errors) with every CUDA device hidden, and stays small;
    on a GPU runner, also with the device visible (the examples' GPU branches)."""
    first = _python_blocks(page)[0]
    assert not first.startswith(NEEDS_CUDA), "a page opens with an example any machine runs"
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", first],
        cwd=tmp_path, env=child_env(NO_GPU if where == "cpu" else None), capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    written = sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())
    assert written <= 64 << 20, f"the example wrote {written} bytes"


def test_the_home_page_sample_runs(tmp_path):
    source = _python_blocks(DOCS / "index.md")[0]
    source += "t[0, 0] = 7.0\nprint(a[0, 0], r.tolist(), b.dtype, host.tolist())\n"
    proc = subprocess.run(
        [sys.executable, "-c", source],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == (
        "7.0 [3.0, 2.0, 1.0, 0.0] bfloat16 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"
    )


def test_a_bfloat16_npy_file_needs_ml_dtypes_imported_before_numpy_load(tmp_path):
    """What docs/npy.md says, in fresh processes: refused without, read with."""
    import torch

    t = torch.arange(6, dtype=torch.bfloat16)
    interop.save_npy(t, tmp_path / "weights.npy")
    without = subprocess.run(
        [sys.executable, "-c", "import numpy as np; np.load('weights.npy')"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert without.returncode == 1
    assert "ValueError: descr is not a valid dtype descriptor: 'bfloat16'" in without.stderr
    snippet = _block_with(DOCS / "npy.md", "import ml_dtypes")
    with_it = subprocess.run(
        [sys.executable, "-c", snippet + "print(w.dtype, w32.dtype, w32.tolist())\n"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert with_it.returncode == 0, with_it.stderr
    assert with_it.stdout == "bfloat16 float32 [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]\n"


def test_matplotlib_draws_a_large_bfloat16_image_blank_and_its_float32_cast_right():
    """The plotting note of docs/coming-from-numpy-conversions.md. If matplotlib
    learns bfloat16, this fails: then the note should go."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def colours(image: np.ndarray) -> int:
        fig = Figure(figsize=(2, 2), dpi=100)  # 200 x 200 pixels for 512 x 512 values
        canvas = FigureCanvasAgg(fig)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        ax.imshow(image)
        canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba()).reshape(-1, 4)
        return len(np.unique(pixels, axis=0))

    import torch

    t = torch.linspace(0, 1, 512 * 512).reshape(512, 512).to(torch.bfloat16)
    a = interop.to_numpy(t)
    assert str(a.dtype) == "bfloat16"
    assert colours(a) <= 3  # blank: one colour, and the edge's blend
    assert colours(a.astype(np.float32)) > 100


def test_ctrl_c_gives_a_plain_keyboard_interrupt_and_bytes_done_says_how_far(tmp_path):
    """The Ctrl-C snippet of docs/coming-from-numpy-conversions.md, interrupted for real."""
    snippet = _block_with(DOCS / "coming-from-numpy-conversions.md", "except KeyboardInterrupt")
    code = f"""
import os, signal, threading, time
import numpy as np, interop
c = np.arange(1 << 21, dtype=np.float64)  # 256 chunks of 64 KiB, each slowed by the callback
out = np.zeros_like(c)
armed = []

def slowly(done, total):  # Ctrl-C a moment after the first chunk, while result() waits
    if not armed:
        armed.append(threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)))
        armed[0].start()
    time.sleep(0.01)

started = interop.copy_to_host_async
interop.copy_to_host_async = lambda x, o: started(x, o, chunk_bytes=1 << 16, progress=slowly)
try:
{"".join("    " + line + chr(10) for line in snippet.splitlines())}
except KeyboardInterrupt as e:
    print("re-raised", repr(e), e.__cause__, getattr(e, "__notes__", None))
n = transfer.bytes_done // 8
print("prefix", 0 < n < c.size, bool((out[:n] == c[:n]).all()))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"\d+ of 16777216 bytes of out are complete", lines[0]), lines
    assert lines[1:] == ["re-raised KeyboardInterrupt() None None", "prefix True True"]


@pytest.mark.parametrize(("name", "written"), [("d1", "d1.npy"), ("d1.npy", None), ("d1/", None)])
def test_the_directory_rows_of_the_npy_page_hold(tmp_path, monkeypatch, name, written):
    """docs/npy.md: a directory named without a suffix gets a file beside it,
    as numpy.save does; a directory named as it is, or a trailing '/', is refused."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("d1")
    os.mkdir("d1.npy")
    if written is None:
        with pytest.raises(IsADirectoryError):
            interop.save_npy(np.arange(3.0), name)
        assert sorted(os.listdir()) == ["d1", "d1.npy"]
        assert os.listdir("d1") == os.listdir("d1.npy") == []
    else:
        os.rmdir("d1.npy")
        assert str(interop.save_npy(np.arange(3.0), name)) == written
        assert np.load(written).tolist() == [0.0, 1.0, 2.0]
    table = (DOCS / "npy.md").read_text()
    assert '(`"d1"` where `d1/` exists)' in table
    assert '(`"d1.npy"` where `d1.npy/` exists) | `IsADirectoryError`' in table


def _paragraphs(text: str) -> list[str]:
    """A page's paragraphs and list items, each on one line."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n|\n(?=\* )", text)]


def test_every_page_says_a_progress_callbacks_error_comes_back_as_itself(tmp_path):
    """What the code does on every path that calls the callback (the device
    paths: tests/pipeline/test_schedule.py, io/test_npy_device.py), as concurrent.futures
    does with a function's error: the callback's exception as itself, with a
    note of the bytes done; so no page may say it becomes a TransferError."""

    def mine(done, total):
        raise KeyError("mine")

    a = np.arange(3 << 13, dtype=np.float64)  # 3 chunks of 64 KiB
    np.save(tmp_path / "a.npy", a)
    calls = [
        ("copy_to_host", lambda: interop.copy_to_host(a, chunk_bytes=1 << 16, progress=mine)),
        ("copy_to_host", lambda: interop.copy_to_host_async(
            a, chunk_bytes=1 << 16, progress=mine
        ).result(timeout=30)),
        ("save_npy", lambda: interop.save_npy(
            a, tmp_path / "b.npy", chunk_bytes=1 << 16, progress=mine
        )),
        ("load_npy", lambda: interop.load_npy(
            tmp_path / "a.npy", chunk_bytes=1 << 16, progress=mine
        )),
    ]  # fmt: skip
    for func, call in calls:
        with pytest.raises(KeyError, match="mine") as info:
            call()
        assert not isinstance(info.value, interop.InteropError)
        assert f"raised by the progress callback of {func}; bytes [0, {1 << 16})" in "".join(
            info.value.__notes__
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]  # no b.npy left

    pages = {page.name: page.read_text() for page in DOCS.rglob("*.md")}
    wrong = [
        f"{name}: {p[:120]}"
        for name, text in pages.items()
        for p in _paragraphs(text)
        if "progress" in p and "__cause__" in p  # today: errors.md, twice
    ]
    assert wrong == []
    (own,) = [p for p in _paragraphs(pages["errors.md"]) if "Errors of your own code" in p]
    assert "come back as themselves" in own
    assert "note" in own
