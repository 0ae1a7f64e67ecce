"""Numbers in the README and docs come from committed results: a marked block is a copy of a committed file.

    <!-- generated: scripts/results/domains-smollm2-135m-committed-plans/compare.md -->
    ...the file's text...
    <!-- end generated -->

`python -m tools.docs_blocks` rewrites every block from its file (paths from the repository root);
`--check` changes nothing and exits 1 naming each stale block. The test suite runs the check, so a page cannot
quote a table that is not the committed one.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from orthorank.harness.results import atomic_write_text

BLOCK = re.compile(r"(<!-- generated: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)
PAGES = ("README.md", "docs/*.md")


def pages(root: Path) -> list[Path]:
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


def render(page: Path, root: Path) -> tuple[str, list[str]]:
    """The page with every block rewritten, and the source files of the blocks that changed."""
    text = page.read_text()
    stale: list[str] = []

    def fill(m: re.Match) -> str:
        source = root / m["path"]
        if not source.is_file():
            raise FileNotFoundError(f"{page.relative_to(root)}: generated block from {m['path']}, which does not exist")
        body = source.read_text().rstrip("\n") + "\n"
        if body != m["body"]:
            stale.append(m["path"])
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), stale


def sync(root: Path, check: bool) -> list[str]:
    """Rewrite (or, with check, only find) stale blocks; returns 'page: source' for each."""
    found = []
    for page in pages(root):
        text, stale = render(page, root)
        found += [f"{page.relative_to(root)}: {s}" for s in stale]
        if stale and not check:
            atomic_write_text(page, text)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    args = p.parse_args(argv)
    try:
        found = sync(Path(args.root), args.check)
    except FileNotFoundError as exc:
        print(f"docs_blocks: error: {exc}", file=sys.stderr)
        return 2
    for f in found:
        print(("stale: " if args.check else "rewrote: ") + f)
    return 1 if (found and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
