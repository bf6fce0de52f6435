"""Content that fits 1280 px: no `pre` (or its `code`) and no table of a built page is wider than its box.

    python .ci/overflow.py SITE_DIR [PAGE ...]

Serves the built site on 127.0.0.1, loads each page in a 1280 px wide frame of headless Chromium (Debian's
`chromium`, installed by .ci/run), and measures `scrollWidth > clientWidth` for every `pre`, `pre > code`, table and
table wrapper in the page's content. Exits 1 (never skips) when Chromium is missing or any element overflows.
Default pages: the home page, one guide, one API page and the results summary.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

PAGES = ["index.html", "guides/environments/index.html", "api/index.html", "results/index.html"]
WIDTH = 1280
PROBE = """<!doctype html><html><body style="margin:0">
<iframe id="f" src="/PAGE" style="width:WIDTHpx;height:900px;border:0"></iframe>
<pre id="result">pending</pre>
<script>
document.getElementById("f").onload = () => setTimeout(() => {
  const doc = document.getElementById("f").contentDocument;
  const out = [];
  const root = doc.querySelector("article.md-content__inner") || doc.body;
  for (const el of root.querySelectorAll("pre, pre > code, table, .md-typeset__table, .md-typeset__scrollwrap")) {
    if (el.closest("details:not([open])")) continue;  // collapsed: not on screen
    if (el.scrollWidth > el.clientWidth + 1) {
      out.push({tag: el.tagName.toLowerCase(), cls: el.className, scroll: el.scrollWidth, client: el.clientWidth,
                text: (el.innerText || "").split("\\n")[0].slice(0, 100)});
    }
  }
  const column = root.getBoundingClientRect().width;
  document.getElementById("result").textContent = JSON.stringify({column: column, overflow: out});
}, 300);
</script></body></html>"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # one line per request is noise here
        pass


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    sys.exit("overflow check: no chromium on PATH (.ci/run installs it: apt-get install -y chromium)")


def measure(site: Path, page: str, port: int, browser: str) -> dict:
    probe = site / "_overflow_probe.html"
    probe.write_text(PROBE.replace("PAGE", page).replace("WIDTH", str(WIDTH)))
    try:
        dom = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--window-size={WIDTH + 40},1000",
                "--virtual-time-budget=15000",
                "--dump-dom",
                f"http://127.0.0.1:{port}/_overflow_probe.html",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    finally:
        probe.unlink()
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, flags=re.S)
    if not found or found.group(1) == "pending":
        raise RuntimeError(f"{page}: the page did not load in Chromium")
    import html

    return json.loads(html.unescape(found.group(1)))


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    site = Path(sys.argv[1]).resolve()
    pages = sys.argv[2:] or PAGES
    browser = chromium()
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bad = 0
    try:
        for page in pages:
            if not (site / page).is_file():
                print(f"FAIL {page}: not in the built site")
                bad += 1
                continue
            result = measure(site, page, server.server_address[1], browser)
            status = "FAIL" if result["overflow"] else "ok  "
            print(f"{status} {page}: content column {result['column']:.0f} px at {WIDTH} px")
            for el in result["overflow"]:
                print(f"       {el['tag']}.{el['cls']}: {el['scroll']} > {el['client']} px: {el['text']!r}")
            bad += bool(result["overflow"])
    finally:
        server.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
