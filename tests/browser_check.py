"""Open an `orthorank analyze` report in headless Chromium and check that every figure really renders.

A copy of the report gets a small script that, after the page's load event, marks each <img> with its
naturalWidth/naturalHeight (0 for an image the browser could not decode); Chromium's --dump-dom then returns the
marked DOM. The report itself stays script-free. Usage:

    python tests/browser_check.py results/analysis/report.html [--screenshot shot.png]

Exit status 0 when every figure rendered, 1 otherwise, 2 when Chromium is missing.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

# $CHROMIUM, else Debian's /usr/bin/chromium, else whatever `chromium` is on PATH.
CHROMIUM = os.environ.get("CHROMIUM") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else shutil.which("chromium") or "/usr/bin/chromium")

_MARKER = """<script>
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img');
  for (var i = 0; i < imgs.length; i++) {
    var img = imgs[i], r = img.getBoundingClientRect();
    img.setAttribute('data-natural-width', String(img.naturalWidth));
    img.setAttribute('data-natural-height', String(img.naturalHeight));
    img.setAttribute('data-box-width', String(Math.round(r.width)));
    img.setAttribute('data-rendered', img.complete && img.naturalWidth > 0 ? 'yes' : 'no');
  }
  document.body.setAttribute('data-browser-check', 'done');
});
</script>"""

_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
          "--virtual-time-budget=10000"]


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.body: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "img":
            a.pop("src", None)  # base64 data, not needed
            self.images.append(a)
        elif tag == "body":
            self.body = a


def chromium_available() -> bool:
    return Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def _chromium(args: list[str], profile: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=timeout)


def check_report(report: str | Path, screenshot: str | Path | None = None, timeout: float = 120.0) -> dict:
    """Returns {"images": [...attrs...], "problems": [...]}: problems is empty when every figure rendered at the
    size of its embedded PNG."""
    report = Path(report).resolve()
    html = report.read_text(encoding="utf-8")
    expected: dict[str, tuple[int, int] | None] = {}
    problems = []
    for m in re.finditer(r'<img[^>]*data-figure="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"', html):
        try:
            expected[m.group(1)] = png_size(base64.b64decode(m.group(2)))
        except (ValueError, binascii.Error, struct.error):
            expected[m.group(1)] = None
            problems.append(f"figure {m.group(1)}: the embedded data is not a valid PNG")
    with tempfile.TemporaryDirectory(prefix="orthorank-browser-") as tmp:
        page = Path(tmp) / "report-checked.html"
        if "</body>" not in html:
            return {"images": [], "problems": ["the report has no </body>"]}
        page.write_text(html.replace("</body>", _MARKER + "</body>", 1), encoding="utf-8")
        profile = tempfile.mkdtemp(prefix="profile-", dir=tmp)
        proc = _chromium(["--dump-dom", page.as_uri()], profile, timeout)
        if screenshot is not None:
            _chromium([f"--screenshot={Path(screenshot).resolve()}", "--window-size=1280,4000", report.as_uri()],
                      tempfile.mkdtemp(prefix="profile-", dir=tmp), timeout)
    parser = _Images()
    parser.feed(proc.stdout)
    if proc.returncode != 0 or parser.body.get("data-browser-check") != "done":
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        problems.append(f"chromium did not finish the page (exit {proc.returncode}): {' | '.join(tail)}")
    if not expected:
        problems.append("the report holds no embedded figures")
    seen = {}
    for img in parser.images:
        name = img.get("data-figure", "?")
        seen[name] = img
        if img.get("data-rendered") != "yes":
            problems.append(f"figure {name} did not render (naturalWidth {img.get('data-natural-width')})")
            continue
        size = (int(img["data-natural-width"]), int(img["data-natural-height"]))
        if expected.get(name) is not None and size != expected[name]:
            problems.append(f"figure {name} rendered at {size}, its PNG is {expected[name]}")
        if int(img.get("data-box-width", "0")) < 100:
            problems.append(f"figure {name} is laid out only {img.get('data-box-width')} px wide")
    for name in expected:
        if name not in seen:
            problems.append(f"figure {name} is missing from the rendered page")
    return {"images": parser.images, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("--screenshot", default=None, help="also save a full-page screenshot here")
    args = p.parse_args(argv)
    if not chromium_available():
        print(f"{CHROMIUM} not found; install it with: apt-get install -y chromium", file=sys.stderr)
        return 2
    result = check_report(args.report, args.screenshot)
    for img in result["images"]:
        print(f"{img.get('data-figure', '?'):>16}: rendered={img.get('data-rendered')} "
              f"{img.get('data-natural-width')}x{img.get('data-natural-height')} px, "
              f"box {img.get('data-box-width')} px wide")
    for problem in result["problems"]:
        print("PROBLEM: " + problem)
    print("ok" if not result["problems"] else f"{len(result['problems'])} problem(s)")
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
