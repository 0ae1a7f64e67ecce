"""Which layers should attend locally? Decided on calibration prompts only (issue 45: nothing is chosen on evaluation
samples): the needle tasks built from calibration text with the frontier's calibration seed, scored for dense, local
attention in the upper half of the layers and local attention in the lower half (method/local_attention.py, its
default window, sinks and tail), paired with dense.

    PYTHONPATH=src python studies/long-prompt/local_order.py --model smollm2-135m --length 4096 --samples 8 \
        --out studies/long-prompt/smollm2-135m/local-order.json

The local schedule fills layers from the top down because of this comparison (docs/long-prompts.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from orthorank.harness.api import frontier as F
from orthorank.harness.api.common import load_model_from_options
from orthorank.harness.api.options import FrontierOptions
from orthorank.harness.evaluation.longctx import Row, summarize
from orthorank.method.cost import Arch
from orthorank.method.local_attention import LocalAttention
from orthorank.method.plan import Plan
from orthorank.harness.results import write_json

TASKS = ["niah_single", "niah_multikey"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=8, help="per task (default %(default)s)")
    ap.add_argument("--window", type=int, default=LocalAttention.window, help="(default %(default)s)")
    ap.add_argument("--block", type=int, default=LocalAttention.block, help="(default %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    opts = FrontierOptions(model=args.model, dtype="bfloat16", threads=args.threads, out=args.out)
    lm = load_model_from_options(opts)
    arch = Arch.from_config(lm.config, lm.num_layers)
    types = getattr(lm.config, "layer_types", None)
    full = [i for i in range(1, lm.num_layers) if not isinstance(types, list) or types[i] == "full_attention"]
    half = len(full) // 2
    pattern = LocalAttention(window=args.window, block=args.block)
    rows = [Row("dense", "dense", None, Plan("dense", [], lm.name, lm.signature()))]
    for name, layers in (("local upper half", full[half:]), ("local lower half", full[:half])):
        rows.append(Row(name, "local", None, Plan("local", layers, lm.name, lm.signature(), attention=pattern,
                                                  arch=dataclasses.asdict(arch))))
    items = F.calibration_items(lm, TASKS, args.length, args.samples, None)
    settings = {"tasks": TASKS, "length": args.length, "samples": args.samples, "seed": F.CALIBRATION_SEED,
                "calibration": True}
    scores = F._scores(opts, lm, rows, items, settings)
    keys = [it.key for it in items]
    ref = {"all": [scores["dense"][k]["score"] for k in keys]}
    result = {"command": " ".join(["local_order.py", *(argv if argv is not None else sys.argv[1:])]),
              "model": lm.name, "length": args.length, "tasks": TASKS, "samples_per_task": args.samples,
              "items": len(items), "prompts": "calibration text (WikiText-2's and C4's calibration parts), seed "
              f"{F.CALIBRATION_SEED}", "rows": {}}
    for row in rows:
        vals = {"all": [scores[row.name][k]["score"] for k in keys]}
        result["rows"][row.name] = {"layers": row.plan.layers, "attention": (row.plan.attention.to_dict()
                                                                             if row.plan.attention else None),
                                    "compute": round(row.plan.compute_sparsity(arch, args.length) or 0.0, 4),
                                    **summarize(vals, None if row.name == "dense" else ref)["all"]}
        r = result["rows"][row.name]
        diff = r.get("diff")
        print(f"{row.name:18s} layers {len(row.plan.layers):2d}  compute {r['compute']:.3f}  score {r['mean']:.1f} "
              f"[{r['low']:.1f}, {r['high']:.1f}]" + (f"  vs dense {diff['value']:+.1f} [{diff['low']:+.1f}, "
                                                       f"{diff['high']:+.1f}]" if diff else ""))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(args.out, result, overwrite=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
