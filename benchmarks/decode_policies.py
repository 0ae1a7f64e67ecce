"""Decode policies side by side: speed (batch 1 and 32) next to the quality each gives, on the embedded model.

Rows: the dense model, layer removal (SLEB's saved plan) and OrthoRank's saved plan under each decode policy
  - dense:     every new token is updated by every layer (ceil(ratio * 1) = 1): the prefill's savings only;
  - threshold: a new token is updated in a selection layer only if it is at least as orthogonal to the sink as the
               prefill's K-th token was; otherwise that layer skips its query, o_proj and MLP (K/V still written).
Quality: WikiText-2 windows of --seq-len tokens, the first half as the prompt (one prefill with token selection),
the second half fed one token at a time through the KV cache (teacher forcing); perplexity of the second half with
a 95% bootstrap interval over windows, and the paired ratio to the dense model. "whole window" is the same plan
with the window in one forward (what the paper evaluates): the reference for what decoding loses.
Speed: --new-tokens greedy steps after an untimed prompt of seq-len / 2 real tokens per row, batch 1 and 32,
methods interleaved per round (rotating order), median of --repeats rounds; the share of decoded tokens the
selection layers updated is reported for the timed steps.

    .venv/bin/python benchmarks/decode_policies.py --threads 1 --out benchmarks/results/decode-policies-smollm2-135m
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _rows(lm, sparsity: float) -> list[tuple[str, Any, str]]:
    """(name, plan, how): how = "decode" (prompt, then one token at a time) or "window" (one forward)."""
    from orthorank.method.plan import Plan
    from orthorank.method.plan_store import find_plan

    dense = Plan("dense", [], lm.name, lm.signature())
    sleb = Plan.load(find_plan(lm.name, "sleb", sparsity))
    ortho = Plan.load(find_plan(lm.name, "orthorank", sparsity))
    for p in (sleb, ortho):
        p.check_model(lm.name, lm.signature())

    def policy(d: str):
        return dataclasses.replace(ortho, selection=dataclasses.replace(ortho.selection, decode=d))

    label = f"{sparsity:g}"
    return [("dense", dense, "decode"), (f"sleb {label}", sleb, "decode"),
            (f"orthorank {label}, dense decode", policy("dense"), "decode"),
            (f"orthorank {label}, threshold decode", policy("threshold"), "decode"),
            (f"orthorank {label}, whole window (reference)", policy("dense"), "window")]


class UpdateCounter:
    """Share of decoded tokens that the selection layers updated (from each layer's last_keep)."""

    def __init__(self, model) -> None:
        from orthorank.method.apply import selective
        from orthorank.models.adapters import get_adapter

        self.layers = [s for s in (selective(l) for l in get_adapter(model).layers(model)) if s is not None]
        self.updated = 0
        self.seen = 0

    def step(self, tokens: int) -> None:
        for s in self.layers:
            keep = s.last_keep  # None: the layer ran densely (every token updated)
            self.seen += tokens
            self.updated += tokens if keep is None else int(keep.sum())

    @property
    def share(self) -> float | None:
        return self.updated / self.seen if self.seen else None


@torch.no_grad()
def continuation_nll(lm, windows: torch.Tensor, how: str) -> tuple[np.ndarray, float | None]:
    """Summed NLL of each window's second half; share of decoded tokens updated in selection layers."""
    from orthorank.bench.runner import _cache_kwarg, _output_cache

    model = lm.model
    half = windows.shape[1] // 2
    target = windows[:, half:]
    if how == "window":
        logits = model(windows, use_cache=False).logits[:, half - 1:-1]
        return F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none").sum(1).numpy(), None
    out = model(windows[:, :half], use_cache=True, logits_to_keep=1)
    cache, kw = _output_cache(out), _cache_kwarg(model)
    steps = [out.logits[:, -1].float()]
    counter = UpdateCounter(model)
    for t in range(half, windows.shape[1] - 1):
        out = model(windows[:, t:t + 1], use_cache=True, **{kw: cache})
        cache = _output_cache(out)
        steps.append(out.logits[:, -1].float())
        counter.step(windows.shape[0])
    logits = torch.stack(steps, 1)  # [B, half, vocab]
    nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none").sum(1)
    return nll.numpy(), counter.share


@torch.no_grad()
def time_decode(lm, rows, prompts: torch.Tensor, new_tokens: int, repeats: int) -> dict[str, dict]:
    """Greedy decode steps per row, interleaved over rounds; {name: {"times_s", "updated_share"}}."""
    from orthorank.bench.runner import LastTokenForward
    from orthorank.method.apply import apply_plan, restore_dense

    def once(plan) -> tuple[float, float | None]:
        apply_plan(lm.model, plan)
        try:
            forward = LastTokenForward(lm.model)
            logits, cache = forward(prompts, use_cache=True)  # the prompt: not timed
            nxt = logits.argmax(-1, keepdim=True)
            counter = UpdateCounter(lm.model)
            t0 = time.perf_counter()
            for _ in range(new_tokens):
                logits, cache = forward(nxt, use_cache=True, cache=cache)
                nxt = logits.argmax(-1, keepdim=True)
                counter.step(prompts.shape[0])
            return time.perf_counter() - t0, counter.share
        finally:
            restore_dense(lm.model)

    out = {name: {"times_s": [], "updated_share": None} for name, _, _ in rows}
    for _, plan, _ in rows:
        once(plan)  # warm-up
    for r in range(repeats):
        k = r % len(rows)
        for name, plan, _ in rows[k:] + rows[:k]:
            seconds, share = once(plan)
            out[name]["times_s"].append(seconds)
            out[name]["updated_share"] = share
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from orthorank.evaluation.data import load_eval_text
    from orthorank.evaluation.perplexity import make_windows, tokenize_text
    from orthorank.evaluation.stats import paired_perplexity_ratio, perplexity_interval
    from orthorank.method.apply import apply_plan, restore_dense
    from orthorank.models.loading import load_model
    from orthorank.results import check_writable, write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sparsity", type=float, default=0.2)
    p.add_argument("--windows", type=int, default=32, help="WikiText-2 windows for quality (and prompts for speed)")
    p.add_argument("--seq-len", type=int, default=512, help="window length; the first half is the prompt")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/decode-policies-smollm2-135m"))
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quality-from", default=None,
                   help="reuse the quality part of an earlier run's JSON (same settings; it is deterministic) and "
                        "measure speed only")
    args = p.parse_args(argv)
    out = Path(args.out)
    check_writable(out / "decode-policies.json", args.overwrite)
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu", dtype=args.dtype)
    rows = _rows(lm, args.sparsity)
    windows = make_windows(tokenize_text(lm.tokenizer, load_eval_text("wikitext2")), args.seq_len, args.windows)
    half = args.seq_len // 2

    quality: dict[str, dict] = {}
    nlls: dict[str, np.ndarray] = {}
    if args.quality_from:
        import json

        prev = json.loads(Path(args.quality_from).read_text())
        same = {k: prev.get(k) for k in ("model", "dtype", "sparsity", "windows", "seq_len")}
        if same != {"model": lm.name, "dtype": args.dtype, "sparsity": args.sparsity, "windows": args.windows,
                    "seq_len": args.seq_len} or [r["name"] for r in prev["rows"]] != [r[0] for r in rows]:
            raise SystemExit(f"error: {args.quality_from} was run with other settings: {same}")
        quality = prev["quality"]
    for name, plan, how in ([] if args.quality_from else rows):
        t0 = time.perf_counter()
        apply_plan(lm.model, plan)
        try:
            nll, share = continuation_nll(lm, windows, how)
        finally:
            restore_dense(lm.model)
        nlls[name] = nll
        ci = perplexity_interval(nll, args.seq_len - half)
        quality[name] = {"ppl": ci.to_dict(), "updated_share": share}
        if name != "dense":
            quality[name]["ratio_to_dense"] = paired_perplexity_ratio(nll, nlls["dense"], args.seq_len - half).to_dict()
        print(f"quality {name}: ppl {ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}]"
              f"{'' if share is None else f', updated share {share:.3f}'} ({time.perf_counter() - t0:.0f}s)",
              flush=True)

    decode_rows = [r for r in rows if r[2] == "decode"]
    speed: dict[str, dict] = {}
    for b in [int(x) for x in args.batches.split(",")]:
        idx = torch.arange(b) % windows.shape[0]
        timed = time_decode(lm, decode_rows, windows[idx, :half], args.new_tokens, args.repeats)
        dense_s = statistics.median(timed["dense"]["times_s"])
        sleb_name = decode_rows[1][0]
        sleb_s = statistics.median(timed[sleb_name]["times_s"])
        for name, t in timed.items():
            med = statistics.median(t["times_s"])
            speed.setdefault(name, {})[str(b)] = {
                "times_s": t["times_s"], "median_s": med, "tokens_per_s": b * args.new_tokens / med,
                "speedup_vs_dense": dense_s / med, "vs_layer_removal": sleb_s / med,
                "spread_pct": 100 * (max(t["times_s"]) - min(t["times_s"])) / med,
                "updated_share": t["updated_share"]}
            print(f"speed batch {b} {name}: {b * args.new_tokens / med:.1f} tok/s, x{dense_s / med:.3f} vs dense",
                  flush=True)

    batches = [int(x) for x in args.batches.split(",")]
    head = ("| row | continuation ppl (95% CI) | ratio to dense (95% CI) | decoded tokens updated | "
            + " | ".join(f"tok/s, batch {b} (x dense)" for b in batches) + " |")
    lines = [f"Decode policies on {lm.name} ({args.dtype}, CPU, {args.threads} thread(s)): continuation perplexity "
             f"of the second half of {args.windows} WikiText-2 windows of {args.seq_len} tokens (prompt = first "
             f"half, then one token at a time through the KV cache), and greedy decode speed ({args.new_tokens} "
             f"steps after a {half}-token prompt, median of {args.repeats} interleaved rounds). ** = interval "
             "excludes 1.", "", head, "|---|---|---|---|" + "---|" * len(batches)]
    for name, _, how in rows:
        q = quality[name]
        ci = q["ppl"]
        r = q.get("ratio_to_dense")
        rtxt = "-" if r is None else (f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                                      + (" **" if r["low"] > 1 or r["high"] < 1 else ""))
        share = q["updated_share"]
        stxt = "-" if share is None else f"{share:.3f}"
        cells = [("-" if name not in speed else
                  f"{speed[name][str(b)]['tokens_per_s']:.1f} (x{speed[name][str(b)]['speedup_vs_dense']:.2f})")
                 for b in batches]
        lines.append(f"| {name} | {ci['value']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}] | {rtxt} | {stxt} | "
                     + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode-policies.md").write_text(text + "\n")
    write_json(out / "decode-policies.json", {
        "command": "decode_policies", "model": lm.name, "dtype": args.dtype, "threads": args.threads,
        "sparsity": args.sparsity, "windows": args.windows, "seq_len": args.seq_len,
        "new_tokens": args.new_tokens, "repeats": args.repeats,
        "rows": [{"name": n, "how": h, "plan": pl.to_dict()} for n, pl, h in rows],
        "quality": quality, "speed": speed}, device="cpu", overwrite=True)
    print(f"wrote {out / 'decode-policies.md'}, {out / 'decode-policies.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
