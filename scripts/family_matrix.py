"""The family x attention implementation x check matrix (issue: reach), from the test suite itself.

Runs tests/method/test_families.py with a JUnit report and writes a Markdown table: pass, FAIL, or n/a (the family
refuses the implementation, or the check does not run under it). One file per transformers version.

    .venv/bin/python scripts/family_matrix.py            # -> scripts/results/family-matrix-<transformers>.md
    .venv-lower/bin/python scripts/family_matrix.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]
CHECKS = {
    "test_ratio_one_equals_dense_logits_and_hidden_states": "ratio 1.0 = dense (logits, all hidden states)",
    "test_selective_layer_equals_naive_reference": "selective layer = naive reference",
    "test_cached_generation_equals_uncached": "cached = uncached generation",
    "test_left_padded_rows_equal_single_rows": "left-padded = single rows",
    "test_search_runner_agrees_with_the_model": "search runner = model",
}
IMPLS = ["sdpa", "eager", "flex_attention"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/method/test_families.py",
                        f"--junitxml={report}"], cwd=ROOT, env={**__import__("os").environ,
                                                               "PYTHONPATH": str(ROOT / "src")})
        tree = ET.parse(report)
    cells: dict[tuple[str, str, str], list[str]] = {}
    families: list[str] = []
    for case in tree.iter("testcase"):
        m = re.match(r"(test_\w+)\[(.+)\]", case.get("name", ""))
        if not m:
            continue
        test, params = m.groups()
        parts = params.split("-")
        impl = next(p for p in parts if p in IMPLS)
        family = next(p for p in parts if p not in IMPLS and not p.startswith(("orthorank", "prune", "1.0")))
        if family not in families:
            families.append(family)
        status = "FAIL" if case.find("failure") is not None or case.find("error") is not None else \
            "n/a" if case.find("skipped") is not None else "pass"
        cells.setdefault((family, impl, test), []).append(status)
    lines = [f"# Family x attention implementation x check (transformers {transformers.__version__})", "",
             "Tiny random models from transformers' own config classes (tests/conftest.py ZOO); "
             "`n/a`: the family refuses the implementation or the check is not run under it "
             "(cached generation: sdpa and eager).", "",
             "| family | implementation | " + " | ".join(CHECKS.values()) + " |",
             "|---|---|" + "---|" * len(CHECKS)]
    fails = 0
    for family in families:
        for impl in IMPLS:
            row = []
            for test in CHECKS:
                got = cells.get((family, impl, test))
                s = "n/a" if not got else "FAIL" if "FAIL" in got else "n/a" if all(g == "n/a" for g in got) \
                    else "pass"
                fails += s == "FAIL"
                row.append(s)
            lines.append(f"| {family} | {impl} | " + " | ".join(row) + " |")
    out = ROOT / f"scripts/results/family-matrix-{transformers.__version__}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
