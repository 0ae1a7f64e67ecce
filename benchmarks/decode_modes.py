"""Measure the decode-time choices the paper leaves open, on the embedded model with a stored OrthoRank plan.

Each window is split: the first half is the prompt (one prefill with token selection), the second half is fed one
token at a time through the KV cache. We report the perplexity of the second half and the share of decoded tokens
that the selection layers updated, for
  - prefill:   the whole window in one forward (selection over all tokens; the reference the paper evaluates),
  - dense:     decode mode "dense" (every new token updated: ceil(ratio * 1) = 1),
  - threshold: decode mode "threshold" (a new token updated only if as orthogonal as the prefill's K-th token),
next to the dense model.

    .venv/bin/python benchmarks/decode_modes.py --windows 8 --seq-len 512 --json benchmarks/results/decode-modes.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import torch
import torch.nn.functional as F

from orthorank.evaluation.data import load_eval_text
from orthorank.evaluation.perplexity import make_windows, tokenize_text
from orthorank.method import Plan, apply_plan, restore_dense
from orthorank.method.layer import OrthoRankLayer
from orthorank.models import load_model
from orthorank.results import write_json


@torch.no_grad()
def second_half_nll(model, windows: torch.Tensor, mode: str) -> tuple[float, float | None]:
    """Mean NLL over the second half of each window; share of decoded tokens updated (selection layers)."""
    total, count, updated, seen = 0.0, 0, 0, 0
    half = windows.shape[1] // 2
    for w in windows:
        ids = w.unsqueeze(0)
        if mode == "prefill":
            logits = model(ids, use_cache=False).logits[0, half - 1 : -1]
        else:
            out = model(ids[:, :half], use_cache=True)
            cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache
            steps = [out.logits[0, -1]]
            for t in range(half, ids.shape[1] - 1):
                out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache
                steps.append(out.logits[0, -1])
                for layer in model.model.layers:
                    if isinstance(layer, OrthoRankLayer):
                        keep = layer.last_keep
                        updated += 1 if keep is None else int(keep.sum())
                        seen += 1
            logits = torch.stack(steps)
        nll = F.cross_entropy(logits.float(), ids[0, half:], reduction="sum")
        total, count = total + float(nll), count + ids.shape[1] - half
    return total / count, (updated / seen if seen else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", default="plans/smollm2-135m/orthorank-0.2.json")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu")
    plan = Plan.load(args.plan)
    plan.check_model(lm.name, lm.signature())
    windows = make_windows(tokenize_text(lm.tokenizer, load_eval_text("wikitext2")), args.seq_len, args.windows)
    rows = []
    start = time.perf_counter()
    nll, _ = second_half_nll(lm.model, windows, "prefill")
    rows.append({"setting": "dense model", "ppl": math.exp(nll), "updated_share": 1.0})
    for mode in ("prefill", "dense", "threshold"):
        variant = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, decode=mode if mode != "prefill" else "dense"))
        apply_plan(lm.model, variant)
        nll, share = second_half_nll(lm.model, windows, mode)
        restore_dense(lm.model)
        rows.append({"setting": f"orthorank, {mode}", "ppl": math.exp(nll), "updated_share": share})
    print(f"second-half perplexity, {args.windows} WikiText-2 windows of {args.seq_len} (prompt = first half), "
          f"plan {args.plan}")
    print("| setting | ppl | decoded tokens updated in selection layers |\n|---|---|---|")
    for r in rows:
        share = "-" if r["updated_share"] is None else f"{r['updated_share']:.3f}"
        print(f"| {r['setting']} | {r['ppl']:.3f} | {share} |")
    if args.json:
        write_json(args.json, {"command": "decode_modes", "plan": plan.to_dict(), "windows": args.windows,
                               "seq_len": args.seq_len, "rows": rows, "seconds": time.perf_counter() - start},
                   device=lm.device, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
