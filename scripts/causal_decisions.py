"""Do generation and a teacher-forced forward make the same causal decisions on a real model? (issue 58)

A causal router plan updates a token in a selection layer when its router score reaches the layer's threshold. The
score reads only the token's own input to the layer, so a teacher-forced forward over the generated text decides as
generation did, up to rounding: the one-token step scores on the host (router.StepScorer), and in bfloat16 a decode
step's hidden states differ from the full forward's by the model's own rounding (other shapes, other kernels).

This generates greedily after prompts of calibration text, records every selection layer's decision per generated
token, runs the teacher-forced forward over the same tokens, and counts the decisions that differ, with the
one-token step (the default) and with the general selection path, in each dtype. Counts, not times: valid on a busy
machine.

    .venv/bin/python scripts/causal_decisions.py --plan plans/smollm2-135m/router-searched-causal-0.2.json \\
        --out scripts/results/decode-router/decisions-smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.search.calibration import calibration_set  # noqa: E402
from orthorank.method.apply import apply_plan, restore_dense, selective  # noqa: E402
from orthorank.method.layer import SelectiveLayer  # noqa: E402
from orthorank.method.plan import Plan  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402


def differing(model, prompt: torch.Tensor, new: int) -> tuple[int, int, int]:
    """(decisions that differ, decisions compared, tokens updated when generating) over the selection layers."""
    from transformers import DynamicCache

    layers = [layer for layer in model.model.layers if selective(layer) is not None]
    steps: list[list[bool]] = [[] for _ in layers]
    ids, cache = prompt, DynamicCache()
    with torch.no_grad():
        logits = model(prompt, past_key_values=cache, use_cache=True).logits
        for _ in range(new):
            nxt = logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, nxt], dim=1)
            logits = model(nxt, past_key_values=cache, use_cache=True).logits
            for row, layer in zip(steps, layers):
                keep = selective(layer).last_keep
                row.append(bool(keep[0, 0]) if keep is not None else True)
        model(ids, use_cache=False)
    P = prompt.shape[1]
    diff = 0
    for row, layer in zip(steps, layers):
        forced = selective(layer).last_keep[0, P:P + new].tolist()
        diff += sum(a != b for a, b in zip(forced, row))
    return diff, new * len(layers), sum(map(sum, steps))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", type=Path, required=True, help="a causal router plan")
    p.add_argument("--prompts", type=int, default=4, help="prompts of calibration text (the four-domain mix)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    plan = Plan.load(args.plan)
    rows = []
    for dtype in args.dtypes.split(","):
        lm = load_model(plan.model, device="cpu", dtype=dtype)
        model = lm.model.eval()
        prompts = calibration_set(lm.tokenizer, "mix", args.prompts, args.prompt_len).windows
        apply_plan(model, plan)
        for path in ("one-token step", "general"):
            SelectiveLayer.fast_threshold_step = path == "one-token step"
            diff = compared = kept = 0
            for prompt in prompts:
                d, c, k = differing(model, prompt.view(1, -1), args.new_tokens)
                diff, compared, kept = diff + d, compared + c, kept + k
            SelectiveLayer.fast_threshold_step = True
            rows.append({"dtype": dtype, "path": path, "differ": diff, "compared": compared, "updated": kept})
            print(f"{plan.model} {dtype}, {path}: {diff} of {compared} decisions differ between generation and the "
                  f"teacher-forced forward ({kept} updates when generating)")
        restore_dense(model)
    if args.out:
        body = {"command": " ".join(["scripts/causal_decisions.py", *sys.argv[1:]]), "plan": str(args.plan),
                "model": plan.model, "prompts": f"{args.prompts} windows of {args.prompt_len} tokens of the calibration "
                "mix", "new_tokens": args.new_tokens, "rows": rows, "environment": environment("cpu")}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
