"""What one threshold decode step costs at batch 1, split into its two outcomes.

The threshold decode policy updates a new token in a selection layer only when it is at least as orthogonal to the
sink as the prefill's K-th token was. Its ideal step cost is a mix of two per-layer costs: a kept token should cost
a dense layer, a bypassed one only its K/V. This script times whole decode steps of one sequence (a DynamicCache
over a `--context`-token prompt, median of `--steps` steps per round, `--rounds` interleaved rounds) for:

    dense       the model without a plan
    keep-all    the plan's selection layers with the cut-off forced to +inf (every step keeps its token)
    keep-none   the cut-off forced to -inf (every step bypasses)
    threshold   the text's own decisions

each with the one-sequence step (`SelectiveLayer.fast_threshold_step`, the default) and with the general selection
path ("/general"), and prints each against dense beside its ideal (keep-all 1.0; keep-none the weights model with
the LM head counted, `orthorank.harness.runtime.costmodel`).

    .venv/bin/python scripts/decode_step_parts.py --model smollm2-135m --plan plans/smollm2-135m/orthorank-0.2.json \
        --out scripts/results/decode-static/step-parts.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.runtime.bandwidth import decode_head_share  # noqa: E402
from orthorank.harness.runtime.costmodel import ideal_speedup, kv_fraction, with_fixed_share  # noqa: E402
from orthorank.method.apply import apply_orthorank, restore_dense, selective  # noqa: E402
from orthorank.method.layer import SelectiveLayer  # noqa: E402
from orthorank.method.selection import SelectionConfig  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402

SETUPS = ("dense", "keep-all", "keep-none", "threshold", "keep-all/general", "keep-none/general", "threshold/general")


def step_seconds(model, layers: list[int], ratio: float, setup: str, ids: torch.Tensor, steps: int) -> float:
    """Median seconds of `steps` decode steps after a prefill of `ids`, under `setup`."""
    name, _, path = setup.partition("/")
    SelectiveLayer.fast_threshold_step = path != "general"
    restore_dense(model)
    if name != "dense":
        apply_orthorank(model, layers, SelectionConfig(ratio=ratio, decode="threshold"))
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        if name in ("keep-all", "keep-none"):
            for i in layers:
                sel = selective(model.model.layers[i])
                sel._cutoff = torch.full_like(sel._cutoff, float("inf") if name == "keep-all" else float("-inf"))
        cache, nxt, times = out.past_key_values, out.logits[:, -1:].argmax(-1), []
        for _ in range(steps):
            t = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    SelectiveLayer.fast_threshold_step = True
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--plan", default="plans/smollm2-135m/orthorank-0.2.json")
    ap.add_argument("--layers", help="selection layers, comma-separated, instead of the plan's (random-weight shapes)")
    ap.add_argument("--ratio", type=float, default=0.33, help="keep ratio with --layers")
    ap.add_argument("--num-layers", type=int, help="layers of a random-weight shape")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.layers:
        layers, ratio = [int(i) for i in args.layers.split(",")], args.ratio
    else:
        plan = json.loads(Path(args.plan).read_text())
        layers, ratio = plan["layers"], plan["selection"]["ratio"]
    model = load_model(args.model, device="cpu", dtype=args.dtype, num_layers=args.num_layers).model.eval()
    ids = torch.randint(100, model.config.vocab_size - 100, (1, args.context),
                        generator=torch.Generator().manual_seed(0))
    runs: dict[str, list[float]] = {s: [] for s in SETUPS}
    for _ in range(args.rounds):
        for s in SETUPS:
            runs[s].append(step_seconds(model, layers, ratio, s, ids, args.steps))
    dense = statistics.median(runs["dense"])
    n = model.config.num_hidden_layers
    f_kv = kv_fraction(model.config)
    head = decode_head_share(model)
    # keep-none: every selection layer costs its K/V alone, a selection layer at keep ratio 0
    ideal_none = 1 / with_fixed_share(ideal_speedup(n, 0, len(layers), f_kv, 0.0), head)
    ideal = {"dense": 1.0, "keep-all": 1.0, "keep-none": ideal_none}
    rows = []
    for s in SETUPS:
        med = statistics.median(runs[s])
        row = {"setup": s, "median_step_ms": 1e3 * med, "min_step_ms": 1e3 * min(runs[s]), "vs_dense": med / dense,
               "ideal_vs_dense": ideal.get(s.split("/")[0])}
        rows.append(row)
        print(f"{s:18s} median step {row['median_step_ms']:7.2f} ms  x{row['vs_dense']:.3f} of dense"
              + (f"  (ideal x{row['ideal_vs_dense']:.3f})" if row["ideal_vs_dense"] else ""))
    result = {"model": args.model, "plan": None if args.layers else args.plan, "layers": layers, "ratio": ratio, "dtype": args.dtype,
              "threads": args.threads, "context": args.context, "steps": args.steps, "rounds": args.rounds,
              "f_kv": f_kv, "head_share": head, "rows": rows, "runs_s": runs, "environment": environment("cpu")}
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
