"""What a skipped token-layer runs in a batch-1 decode step, counted in operator calls (issue 58).

A causal router plan decides per generated token whether each selection layer updates it; a skipped token still
needs its keys and values (input norm, K/V projections, RoPE, cache update) and the decision itself (the router's
score against the layer's threshold). At batch 1 on this CPU a decode step is dispatch-bound: the dense layer's
matrix products read little, and every small operator costs microseconds. So what a skip saves is set by how many
operator calls it runs, not by its FLOPs.

This counts the profiler's events (every aten call, views included) of one decode step after a prompt, for the
model without a plan, and for a causal plan with every selection layer forced to skip (threshold +inf: no token
updated) and forced to keep (threshold -inf: every token updated), and gives the count per selection layer against
a dense layer's. Counts, not times: deterministic, and valid on a busy machine.

    .venv/bin/python scripts/decode_skip_ops.py --plan plans/smollm2-135m/router-searched-causal-0.1.json \\
        --out scripts/results/decode-router/skip-ops-smollm2-135m.json
"""

from __future__ import annotations

import argparse
import dataclasses
import collections
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.method.apply import apply_plan, selective  # noqa: E402
from orthorank.method.plan import Plan  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402

HEAVY = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def step_events(model, prompt: torch.Tensor, warm_steps: int = 3) -> collections.Counter:
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        nxt = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(warm_steps):
            nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        with torch.profiler.profile() as prof:
            model(nxt, past_key_values=cache, use_cache=True)
    return collections.Counter(e.name for e in prof.events())


def force(model, cutoff: float) -> None:
    """Every selection layer's cut-off (a token is updated where its key, minus its score, is at most it; the
    one-token step compares the score with the threshold, minus the cut-off)."""
    for layer in model.model.layers:
        sel = selective(layer)
        if sel is not None:
            sel._fixed_cutoff = torch.tensor([cutoff], dtype=torch.float32)
            sel._fitted = dataclasses.replace(sel._fitted, threshold=-cutoff, _cache={})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", type=Path, required=True, help="a causal router plan")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    plan = Plan.load(args.plan)
    lm = load_model(plan.model, device="cpu", dtype=args.dtype)
    model = lm.model.eval()
    L = len(model.model.layers)
    prompt = torch.randint(100, 20000, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    counts = {"dense": step_events(model, prompt)}
    apply_plan(model, plan)
    S = len([layer for layer in model.model.layers if selective(layer) is not None])
    for name, cutoff in (("skip", float("-inf")), ("keep", float("inf"))):
        force(model, cutoff)
        counts[name] = step_events(model, prompt)
    total = {k: sum(c.values()) for k, c in counts.items()}
    heavy = {k: sum(c[h] for h in HEAVY) for k, c in counts.items()}
    dense_layer = total["dense"] / L  # the head and embedding spread over the layers: a bound, not exact
    per = {name: (total[name] - total["dense"] * (L - S) / L) / S for name in ("skip", "keep")}
    row = {"plan": str(args.plan), "model": plan.model, "layers": L, "selection_layers": S,
           "events_per_step": total, "heavy_calls_per_step": heavy,
           "events_per_dense_layer": round(dense_layer, 1),
           "events_per_skipped_layer": round(per["skip"], 1), "events_per_kept_layer": round(per["keep"], 1),
           "skip_minus_dense_by_op": {op: round((counts["skip"][op] - counts["dense"][op] * (L - S) / L) / S, 1)
                                      for op in sorted(set(counts["skip"]) | set(counts["dense"]),
                                                       key=lambda o: -(counts["skip"][o] - counts["dense"][o]))[:25]}}
    print(f"{plan.model}: one decode step after {args.prompt_len} tokens: {total['dense']} events dense "
          f"({dense_layer:.0f} per layer); a skipped selection layer {per['skip']:.0f}, a kept one {per['keep']:.0f}; "
          f"heavy calls (matrix products, attention) dense {heavy['dense']}, all skipped {heavy['skip']}")
    if args.out:
        body = {"command": " ".join(["scripts/decode_skip_ops.py", *sys.argv[1:]]), **row,
                "environment": environment("cpu")}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
