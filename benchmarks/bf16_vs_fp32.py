"""How far bfloat16 perplexities move from float32 on this CPU (AVX-512 BF16), and how much faster they come.

Evaluates dense and the committed 20% plans (SLEB, OrthoRank) on the first N windows of WikiText-2 and C4 in both
dtypes through the result store (the bfloat16 windows are shared with Table 1), and reports for each the paired
ratio ppl(bf16) / ppl(fp32) with its 95% bootstrap interval, plus the time of one dense window in each dtype.

    .venv/bin/python benchmarks/bf16_vs_fp32.py --windows 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plans", default="sleb-0.2,orthorank-0.2")
    p.add_argument("--store", default=str(ROOT / "benchmarks/results/store"))
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/bf16-vs-fp32"))
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from orthorank.evaluation.data import load_eval_text
    from orthorank.evaluation.perplexity import eval_stream, make_windows, perplexity_key, stored_window_nll
    from orthorank.evaluation.stats import paired_perplexity_ratio, perplexity_interval
    from orthorank.method.apply import apply_plan, restore_dense
    from orthorank.method.plan import Plan
    from orthorank.models.loading import load_model
    from orthorank.results import environment
    from orthorank.store import ResultStore, model_fingerprint

    seq = 2048
    store = ResultStore(args.store)
    nll: dict[tuple[str, str, str], list[float]] = {}
    timing = {}
    labels = ["dense", *args.plans.split(",")]
    for dtype in ("bfloat16", "float32"):
        lm = load_model("smollm2-135m", device="cpu", dtype=dtype)
        fp = model_fingerprint(lm.model)
        streams = {d: eval_stream(lm.tokenizer, d, load_eval_text(d), seq) for d in ("wikitext2", "c4")}
        windows = {d: make_windows(s, seq, args.windows) for d, s in streams.items()}
        with torch.no_grad():
            w = windows["wikitext2"][:1]
            lm.model(w, use_cache=False)
            start = time.perf_counter()
            for _ in range(3):
                lm.model(w, use_cache=False)
            timing[dtype] = (time.perf_counter() - start) / 3
        for label in labels:
            plan = Plan("dense", [], lm.name, lm.signature()) if label == "dense" else Plan.load(
                ROOT / "plans/smollm2-135m" / f"{label}.json")
            apply_plan(lm.model, plan)
            for d, win in windows.items():
                ns = store.namespace("perplexity", perplexity_key(lm.model, plan, d, streams[d], seq, fp))
                nll[(dtype, label, d)] = stored_window_nll(lm.model, win, ns, 1, progress=True,
                                                           desc=f"{dtype} {label} {d}").tolist()
            restore_dense(lm.model)
        del lm
    lines = [f"bfloat16 vs float32 on the CPU: first {args.windows} windows of 2048 tokens (a slice), 95% bootstrap "
             "intervals; ratio = ppl(bf16) / ppl(fp32), paired over windows", "",
             "| plan | dataset | fp32 ppl | bf16 ppl | ratio [95% CI] |", "|---|---|---|---|---|"]
    rows = []
    for label in labels:
        for d in ("wikitext2", "c4"):
            a, b = nll[("bfloat16", label, d)], nll[("float32", label, d)]
            r = paired_perplexity_ratio(a, b, seq - 1)
            pa, pb = perplexity_interval(a, seq - 1), perplexity_interval(b, seq - 1)
            rows.append({"plan": label, "dataset": d, "fp32": pb.to_dict(), "bf16": pa.to_dict(),
                         "ratio": r.to_dict()})
            lines.append(f"| {label} | {d} | {pb.value:.3f} | {pa.value:.3f} | {r.value:.4f} [{r.low:.4f}, "
                         f"{r.high:.4f}] |")
    lines += ["", f"One dense window of 2048 tokens, {args.threads} thread(s): float32 {timing['float32']:.2f}s, "
              f"bfloat16 {timing['bfloat16']:.2f}s ({timing['float32'] / timing['bfloat16']:.2f}x)"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bf16-vs-fp32.md").write_text("\n".join(lines) + "\n")
    (out / "bf16-vs-fp32.json").write_text(json.dumps({"rows": rows, "seconds_per_window": timing,
                                                       "settings": vars(args),
                                                       "environment": environment("cpu")}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
