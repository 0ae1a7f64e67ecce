"""Local prefill attention's kernels against the dense causal kernel and their keys-read ideal (issue 57, item 2).

method/local_kernel.py's two kernels, `placeholder` (one causal call per 256-query block with placeholder queries in
front: the first kernel) and `split` (every block's window prefix and causal diagonal, each one call over all blocks,
merged by log-sum-exp: the library's kernel since issue 57), and torch's causal SDPA over the whole prompt, on random
bfloat16 q/k/v of a full-attention layer's shape in the attention module's layout, batch 1, one thread, timed in
interleaved rounds. Per length: each kernel's time as a fraction of the causal kernel's (median of per-round ratios,
bootstrap interval over rounds), the keys-read ideal (the share of query-key pairs the pattern reads), the split
kernel's time against that ideal, and both kernels' largest error against the float32 masked reference.

    .venv/bin/python scripts/local_kernel.py --out studies/long-prompt/speed/local-kernel.json
    .venv/bin/python scripts/local_kernel.py --render studies/long-prompt/speed/local-kernel.json \\
        --md studies/long-prompt/speed/local-kernel.md     # the table docs/long-prompts.md quotes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.reports.speed import paired_ratio  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import interleaved_rounds  # noqa: E402
from orthorank.method.local_attention import LocalAttention, local_allowed, local_attention, mean_keys_read  # noqa: E402

SHAPES = {"smollm2-135m": (9, 3, 64), "gemma3-270m": (4, 1, 256)}  # query heads, KV heads, head dim
KERNELS = ("placeholder", "split")


def _interval(num: list[float], den: list[float]) -> dict[str, float]:
    mid, lo, hi = paired_ratio(num, den)
    return {"median": round(mid, 4), "low": round(lo, 4), "high": round(hi, 4)}


def measure(model: str, N: int, rounds: int, cfg: LocalAttention) -> dict:
    H, Hkv, d = SHAPES[model]
    g = torch.Generator().manual_seed(N)
    # the attention module's layout: [B, N, heads, d] seen as [B, heads, N, d]
    q = torch.randn(1, N, H, d, generator=g).bfloat16().transpose(1, 2)
    k, v = (torch.randn(1, N, Hkv, d, generator=g).bfloat16().transpose(1, 2) for _ in range(2))
    s = d ** -0.5
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=s, enable_gqa=H != Hkv,
                                         attn_mask=local_allowed(torch.ones(1, N, dtype=torch.bool), cfg))
    error = {kern: float((local_attention(q, k, v, scale=s, cfg=cfg, kernel=kern).float() - ref).abs().max())
             for kern in KERNELS}
    fns = {"causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s, enable_gqa=H != Hkv)}
    fns.update({kern: (lambda kern=kern: local_attention(q, k, v, scale=s, cfg=cfg, kernel=kern)) for kern in KERNELS})

    def time_one(name: str) -> float:
        start = time.perf_counter()
        fns[name]()
        return time.perf_counter() - start

    times = interleaved_rounds(list(fns), time_one, rounds, warmup=1)
    ideal = mean_keys_read(N, cfg) / ((N + 1) / 2)
    row = {"model_shape": model, "seq_len": N, "causal_ms": round(float(np.median(times["causal"])) * 1e3, 2),
           "keys_read_ideal_fraction": round(ideal, 4),
           "fraction_of_causal": {kern: _interval(times[kern], times["causal"]) for kern in KERNELS},
           "split_over_placeholder": _interval(times["split"], times["placeholder"]),
           "max_abs_error_vs_float32": error}
    row["split_over_ideal"] = {key: round(val / ideal, 3) for key, val in row["fraction_of_causal"]["split"].items()}
    return row


def render(data: dict) -> str:
    env = data["environment"]
    lines = [f"Local attention's kernels as a fraction of the causal kernel's time (median of {data['rounds']} "
             f"interleaved paired rounds, bootstrap 95% interval; random {data['dtype']} q/k/v, batch 1, "
             f"{data['threads']} thread; torch {env.get('torch')}, commit {str(env['git_commit'])[:8]})", "",
             "| shape | tokens | first kernel (placeholders) | split kernel | keys-read ideal | split / ideal |",
             "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        f = r["fraction_of_causal"]
        p, sp = f["placeholder"], f["split"]
        lines.append(f"| {r['model_shape']} | {r['seq_len']} | {p['median']:.3f} [{p['low']:.3f}, {p['high']:.3f}] | "
                     f"{sp['median']:.3f} [{sp['low']:.3f}, {sp['high']:.3f}] | {r['keys_read_ideal_fraction']:.3f} | "
                     f"{r['split_over_ideal']['median']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--render", type=Path, default=None, metavar="JSON", help="only write --md from a result file")
    p.add_argument("--md", type=Path, default=None)
    args = p.parse_args()
    if args.render:
        atomic_write_text(args.md, render(json.loads(args.render.read_text())))
        return 0
    torch.set_num_threads(1)
    cfg = LocalAttention()
    load_before = os.getloadavg()
    rows = []
    for model in SHAPES:
        for N in (int(x) for x in args.lengths.split(",")):
            row = measure(model, N, args.rounds, cfg)
            rows.append(row)
            f = row["fraction_of_causal"]
            print(f"{model} {N:5d}: causal {row['causal_ms']:.1f} ms; placeholder {f['placeholder']['median']:.3f}, "
                  f"split {f['split']['median']:.3f} [{f['split']['low']:.3f}, {f['split']['high']:.3f}] of causal; "
                  f"ideal {row['keys_read_ideal_fraction']:.3f}; split / ideal {row['split_over_ideal']['median']:.2f}",
                  flush=True)
    if args.out:
        body = {"command": " ".join(["scripts/local_kernel.py", *sys.argv[1:]]), "rounds": args.rounds, "threads": 1,
                "dtype": "bfloat16", "config": cfg.to_dict(), "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows, "environment": environment("cpu")}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
