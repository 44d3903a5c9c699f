"""python scripts/site_check.py SHOTS [--site DIR] [--width 1280] [--height 800]

Reads every page of the built site in headless Chromium at a 1280 x 800 window
and reports what a reader of that window meets:

  cut       a code line wider than its block (the reader must scroll sideways)
  broken    a word of a table cell split over two lines
  scroll    a table wider than the page (it scrolls sideways; said, not a failure)
  image     an image shown at under half its own width (said, not a failure)

First it builds the site (``mkdocs build --strict`` into DIR, default site/,
which git ignores; --no-build uses DIR as it is), then serves DIR on a free
localhost port. Closed <details> blocks are opened before measuring. SHOTS (a
folder, created) gets screenshots of the window: the top of a few pages and
their first image, and each page with a problem, scrolled to its first one.

Chromium is Debian's package (``apt-get install chromium``; CHROMIUM names
another binary), driven over its DevTools pipe (--remote-debugging-pipe), so
nothing beyond the standard library and the docs extra is needed. It never
reaches the network: the Google Fonts the theme asks for are not loaded, so
code is drawn in the system's monospace font (DejaVu Sans Mono, 0.6 em a
character, as Roboto Mono).

Exit status: 0 when no code line is cut and no table word is broken, 1 when
some are, 2 when the site or the browser could not be started. CI does not run
it; tests/test_docs.py keeps the character count of code lines in CI.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The top of these pages is always shot (when the site has them).
SHOTS = ["getting-started/", "torch-op/", "dask/", "benchmarks/"]
# The sweep plots are drawn at twice the column width (sharp text), shown at half.
SMALL_IMAGE = 0.5
# What typing each word into the search box must list first.
SEARCHES = {"torch_op": "torch-op/", "copy_to_host": "transfer/", "to_numpy": "exchange/"}

# Runs in each page: opens every <details>, then measures. Returns plain data.
MEASURE = r"""
(() => {
  for (const d of document.querySelectorAll("details")) d.open = true;
  const main = document.querySelector("article") || document.body;
  const where = (el) => {
    let h = el, heading = "";
    while (h && h !== main) {
      let s = h.previousElementSibling;
      while (s && !/^H[1-6]$/.test(s.tagName)) s = s.previousElementSibling;
      if (s) { heading = s.textContent.replace(/¶$/, "").trim(); break; }
      h = h.parentElement;
    }
    return heading;
  };
  const top = (el) => el.getBoundingClientRect().top + window.scrollY;
  const probe = (code) => {  // the width of one character of this block's font
    const s = document.createElement("span");
    s.textContent = "0".repeat(100);
    s.style.cssText = "position:absolute;visibility:hidden;white-space:pre";
    code.appendChild(s);
    const w = s.getBoundingClientRect().width / 100;
    s.remove();
    return w;
  };
  const out = {cut: [], broken: [], scroll: [], image: [], fit: []};
  for (const code of main.querySelectorAll("pre > code")) {
    const cs = getComputedStyle(code);
    const inner = code.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const fit = Math.floor(inner / probe(code) + 1e-6);
    out.fit.push(fit);
    if (code.scrollWidth <= code.clientWidth + 1) continue;
    const lines = code.textContent.split("\n").filter((l) => l.length > fit);
    out.cut.push({where: where(code.parentElement), fit, top: top(code),
                  lines: lines.map((l) => [l.length, l])});
  }
  for (const cell of main.querySelectorAll("td, th")) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode()); ) {
      for (const m of node.data.matchAll(/\S+/g)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        const first = r.getClientRects()[0];
        if (!first || r.getBoundingClientRect().height < 1.5 * first.height) continue;
        let at = 1;  // where the word's second line starts
        for (; at < m[0].length; at++) {
          r.setStart(node, m.index + at);
          r.setEnd(node, m.index + at + 1);
          if (r.getBoundingClientRect().top > first.top + first.height / 2) break;
        }
        const code = node.parentElement.closest("code");  // code breaks at spaces only
        if (code || !"-/\u2013\u2014".includes(m[0][at - 1]))  // text may break at a hyphen
          out.broken.push({where: where(cell.closest("table")), top: top(cell),
                           word: m[0].slice(0, at) + "|" + m[0].slice(at)});
      }
    }
  }
  for (const table of main.querySelectorAll("table")) {
    const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    if (box.scrollWidth > box.clientWidth + 1)
      out.scroll.push({where: where(table), width: box.scrollWidth, shown: box.clientWidth,
                       top: top(table)});
  }
  for (const img of main.querySelectorAll("img")) {
    if (!img.naturalWidth) continue;
    const shown = img.getBoundingClientRect().width;
    out.image.push({src: img.getAttribute("src"), natural: img.naturalWidth,
                    shown: Math.round(shown), top: top(img)});
  }
  return JSON.stringify(out);
})()
"""


# Types a query into the search box; the result pages, best first (their first links).
SEARCH = r"""
(async (query) => {
  const input = document.querySelector(".md-search__input");
  input.focus();
  input.value = query;
  for (const type of ["focus", "input", "keyup"]) input.dispatchEvent(new Event(type));
  for (let i = 0; i < 100; i++) {
    const items = document.querySelectorAll(".md-search-result__item > a");
    if (items.length) return [...items].map((a) => a.getAttribute("href"));
    await new Promise((r) => setTimeout(r, 100));
  }
  return [];
})
"""


class Browser:
    """One headless Chromium, one tab, spoken to over --remote-debugging-pipe."""

    def __init__(self, binary: str, width: int, height: int) -> None:
        self.profile = tempfile.mkdtemp(prefix="site-check-")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        # Chromium reads commands from fd 3 and writes replies to fd 4.
        high = (os.dup(to_child), os.dup(from_child))

        def fds() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--log-level=3",  # fatal only: no D-Bus complaints
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            close_fds=False,  # fds 3 and 4 (dup2 makes them inheritable), nothing else
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
        )
        for fd in (to_child, from_child, *high):
            os.close(fd)
        self._buffer = b""
        self._id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command; return its result (events met on the way are dropped)."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> None:
        """Load url and wait for its load event and its fonts."""
        self._id += 1
        message = {"id": self._id, "method": "Page.navigate", "params": {"url": url}}
        os.write(self._out, json.dumps({**message, "sessionId": self.session}).encode() + b"\0")
        while self._read().get("method") != "Page.loadEventFired":
            pass
        self.evaluate("document.fonts.ready.then(() => 1)")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            session=True,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def shot(self, path: Path, scroll_to: float = 0) -> None:
        self.evaluate(f"window.scrollTo(0, {max(0, scroll_to - 80)})")
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._in)
        os.close(self._out)
        shutil.rmtree(self.profile, ignore_errors=True)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def pages(site: Path) -> list[str]:
    """Every page of the site, as a path under its root ('' for the home page)."""
    found = [p.parent.relative_to(site).as_posix() for p in site.rglob("index.html")]
    return sorted("" if p == "." else p + "/" for p in found if not p.startswith("assets"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shots", type=Path, help="folder for the screenshots (created)")
    parser.add_argument("--site", type=Path, default=REPO / "site")
    parser.add_argument("--no-build", action="store_true", help="check --site as it is")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    args = parser.parse_args()
    if not args.no_build:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(args.site)]
        if subprocess.run(build, cwd=REPO, env=env, check=False).returncode != 0:
            print("site-check: mkdocs build --strict failed (output above)", file=sys.stderr)
            return 2
    binary = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if binary is None:
        print(
            "site-check: no chromium (apt-get install chromium, or set CHROMIUM)", file=sys.stderr
        )
        return 2
    args.shots.mkdir(parents=True, exist_ok=True)
    server, root = serve(args.site)
    browser = Browser(binary, args.width, args.height)
    failures = 0
    fits: list[int] = []
    try:
        for page in pages(args.site):
            browser.open(root + page)
            found = json.loads(browser.evaluate(MEASURE))
            fits += found["fit"]
            name = page.rstrip("/") or "index"
            for block in found["cut"]:
                for length, line in block["lines"]:
                    failures += 1
                    print(f"cut     {name} [{block['where']}] {length} > {block['fit']}: {line}")
            for cell in found["broken"]:
                failures += 1
                print(f"broken  {name} [{cell['where']}] {cell['word']}")
            for table in found["scroll"]:
                print(f"scroll  {name} [{table['where']}] {table['width']} px in {table['shown']}")
            for img in found["image"]:
                if img["shown"] < SMALL_IMAGE * img["natural"]:
                    print(f"image   {name} {img['src']}: {img['shown']} of {img['natural']} px")
            problems = found["cut"] + found["broken"]
            if page in SHOTS:
                browser.shot(args.shots / f"{name.replace('/', '-')}.png")
                if found["image"]:  # and at its first image, as shown
                    top = found["image"][0]["top"]
                    browser.shot(args.shots / f"{name.replace('/', '-')}-image.png", top)
            if problems:
                first = min(p["top"] for p in problems)
                browser.shot(args.shots / f"{name.replace('/', '-')}-problem.png", first)
        for query, expected in SEARCHES.items():
            browser.open(root)
            found = browser.evaluate(f"{SEARCH}({json.dumps(query)})")
            first = list(
                dict.fromkeys(p.split("#")[0].removeprefix(root) or "(home)" for p in found)
            )[:3]
            failures += not first or first[0] != expected
            print(f"search  {query!r}: {', '.join(first) or 'nothing'} (expected {expected} first)")
        print(
            f"site-check: {len(pages(args.site))} pages at {args.width} x {args.height}; "
            f"{failures} code lines cut or table words broken; code blocks show "
            f"{min(fits, default=0)} to {max(fits, default=0)} characters a line; "
            f"screenshots in {args.shots}"
        )
    finally:
        browser.close()
        server.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
