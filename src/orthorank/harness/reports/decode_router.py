"""The decode-router study's summary (issue 58), from its committed files: per model and level, the causal router's
quality against SLEB (the worst-domain perplexity ratio of `compare`, with its interval and verdict) and its decode
speed against SLEB's and dense's (paired per-round ratios of `bench --mode decode`, bootstrap intervals over rounds),
with the share of decoded tokens its selection layers updated.

    python -m orthorank.harness.reports.decode_router studies/decode-router --out studies/decode-router/summary.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from orthorank.harness.reports.speed import paired_ratio
from orthorank.harness.results import atomic_write_text

CAUSAL = ("router-searched-causal", "router-causal")


def _cell(value: float, low: float, high: float, unit: str = "") -> str:
    return f"{value:.3f}{unit} [{low:.3f}, {high:.3f}]"


def _speed(run: dict[str, Any], row: str, reference: str) -> str:
    """Throughput row / reference: reference's times over row's, paired by round."""
    by = {m["method"]: m for m in run["methods"]}
    if row not in by or reference not in by:
        return "-"
    mid, lo, hi = paired_ratio(by[reference]["timing"]["times_s"], by[row]["timing"]["times_s"])
    verdict = "faster" if lo > 1 else "slower" if hi < 1 else "level"
    return f"{_cell(mid, lo, hi, 'x')} {verdict}"


def _decode_rows(folder: Path, level: str) -> list[str]:
    out = []
    for path in sorted(folder.glob(f"bench-decode-{level}-b*-n*.json")):
        data = json.loads(path.read_text())
        for run in data.get("runs", []):
            if run.get("mode") != "decode":
                continue
            row = next((m for m in run["methods"] if m["method"] in CAUSAL), None)
            if row is None:
                continue
            share = row.get("decoded_tokens_updated")
            out.append(f"| batch {run['batch']}, {run['new_tokens']} new tokens | {_speed(run, row['method'], 'sleb')} | "
                       f"{_speed(run, row['method'], 'dense')} | {_speed(run, 'sleb', 'dense')} | "
                       f"{'-' if share is None else f'{share:.3f}'} |")
    return out


def summarize(root: Path) -> str:
    lines = ["Causal router decoding against SLEB (issue 58). Quality: worst-domain perplexity ratio to SLEB over the "
             "domains compared (windows no fit or search saw; below 1 = better; a causal plan's teacher-forced "
             "perplexity is its generation's). Speed: decode throughput ratios, median of paired interleaved rounds "
             "with a bootstrap 95% interval (faster / slower: the whole interval above / below 1), on prompts of "
             "calibration text; share: decoded tokens its selection layers updated.", ""]
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for cmp in sorted(folder.glob("compare-*/compare.json")):
            level = re.sub(r"^compare-", "", cmp.parent.name)
            data = json.loads(cmp.read_text())
            worst = next((w for w in data.get("worst_domain", []) if w["method"] in CAUSAL and w["vs"] == "sleb"), None)
            if worst is None:
                continue
            lo, hi = worst["ci95"]
            windows = data["windows"]
            sizes = sorted(set(windows.values())) if isinstance(windows, dict) else [windows]
            lines += [f"**{folder.name} at {level}** ({worst['method']}, {len(worst['datasets'])} domains x "
                      f"{'/'.join(map(str, sizes))} windows of {data['seq_len']} tokens): worst-domain ratio to SLEB "
                      f"{_cell(worst['ratio'], lo, hi)} on {worst['worst_dataset']}: {worst['verdict']}.", ""]
            decode = _decode_rows(folder, level)
            if decode:
                lines += ["| decode | causal vs SLEB | causal vs dense | SLEB vs dense | share updated |",
                          "|---|---|---|---|---|", *decode, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    atomic_write_text(args.out, summarize(args.root))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
