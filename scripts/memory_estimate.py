"""The memory guard's estimate against measurement: peak memory above the loaded model of a perplexity forward
(1 x T tokens, logits and the cross-entropy) and of a generation (prefill of T tokens with a KV cache, then new
tokens), on the embedded model, T from 1k to 16k.

    .venv/bin/python scripts/memory_estimate.py --threads 1 --trials 3 --out scripts/results/memory

Prints a table and writes memory.json and memory.md (estimate, measurement, ratio; versions, device, git commit).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from orthorank.harness.peak_memory import PeakMeter  # noqa: E402
from orthorank.harness.runtime.memory import Shape, estimate_bytes  # noqa: E402
from orthorank.harness.evaluation.perplexity import window_nll  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402
from orthorank.models.static_decode import allocated_static_cache  # noqa: E402
from orthorank.harness.results import atomic_write_text, write_json  # noqa: E402


def measure_one(args, kind: str, T: int) -> dict:
    """One case in this (fresh) process: load, warm up, reset the peak, run, read the peak."""
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype)
    model = lm.model.eval()
    shape = Shape.of(model)
    with torch.no_grad():  # one-time allocations (thread pools, kernel caches) are not a forward's memory
        window_nll(model, torch.randint(100, shape.arch.vocab - 1, (1, 256)))
        model.generate(torch.randint(100, shape.arch.vocab - 1, (1, 64)), max_new_tokens=2, do_sample=False,
                       pad_token_id=0)
    ids = torch.randint(100, shape.arch.vocab - 1, (1, T), generator=torch.Generator().manual_seed(T))
    gc.collect()
    meter = PeakMeter(lm.device).start()
    with torch.no_grad():
        if kind == "perplexity":
            window_nll(model, ids)
            est = estimate_bytes(shape, 1, T, loss=True)
        else:
            # as the commands generate (harness/evaluation/generation.py): a static cache allocated before the prefill
            cache = allocated_static_cache(model, 1, T + args.new_tokens)
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                           min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0, past_key_values=cache)
            est = estimate_bytes(shape, 1, T, cache_tokens=T + args.new_tokens, all_logits=False)
    got = meter.peak_above_bytes()
    return {"kind": kind, "tokens": T, "estimate_mib": round(est / 2**20, 1), "measured_mib": round(got / 2**20, 1),
            "ratio": round(est / got, 3) if got else None, "how": meter.how, "model": lm.name}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--trials", type=int, default=3,
                   help="fresh processes per case: the resident peak varies between identical runs (allocator)")
    p.add_argument("--out", default="scripts/results/memory")
    p.add_argument("--one", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)
    p.add_argument("--reestimate", action="store_true",
                   help="keep the measurements in OUT/memory.json, recompute the estimates (after a change to the "
                        "estimate; it is a function of the config alone)")
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(measure_one(args, args.one[0], int(args.one[1]))), flush=True)
        return 0
    rows = []
    if args.reestimate:
        rows = json.loads((Path(args.out) / "memory.json").read_text())["rows"]
        shape = Shape.of(load_model(args.model, dtype=args.dtype).model)
        for r in rows:
            T = r["tokens"]
            est = (estimate_bytes(shape, 1, T, loss=True) if r["kind"] == "perplexity" else
                   estimate_bytes(shape, 1, T, cache_tokens=T + args.new_tokens, all_logits=False))
            r["estimate_mib"] = round(est / 2**20, 1)
            r["ratio"] = round(est / (r["measured_mib"] * 2**20), 3) if r["measured_mib"] else None
            if r.get("measured_trials_mib"):
                got = r["measured_trials_mib"]
                r["ratio_range"] = [round(r["estimate_mib"] / got[-1], 3), round(r["estimate_mib"] / got[0], 3)]
    for T in ([] if args.reestimate else (int(x) for x in args.lengths.split(","))):
        for kind in ("perplexity", "generation"):  # each case in fresh processes: no allocator state carried
            trials = []
            for _ in range(args.trials):
                done = subprocess.run([sys.executable, __file__, "--model", args.model, "--dtype", args.dtype,
                                       "--threads", str(args.threads), "--new-tokens", str(args.new_tokens), "--one",
                                       kind, str(T)], capture_output=True, text=True)
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"{kind} at {T} tokens failed: {done.stderr[-1500:]}")
                trials.append(json.loads(line[7:]))
            r = dict(trials[0])
            got = sorted(t["measured_mib"] for t in trials)
            r["measured_trials_mib"] = got
            r["measured_mib"] = got[len(got) // 2]  # the median
            r["ratio"] = round(r["estimate_mib"] / r["measured_mib"], 3) if r["measured_mib"] else None
            r["ratio_range"] = [round(r["estimate_mib"] / got[-1], 3), round(r["estimate_mib"] / got[0], 3)]
            rows.append(r)
            print(f"{kind:>10} {T:>6} tokens: estimate {r['estimate_mib']:8.1f} MiB, measured {got} MiB, "
                  f"estimate / median {r['ratio']}", flush=True)
    out = Path(args.out)
    caption = (f"Peak memory above the loaded model, {rows[0]['model']} ({args.dtype}, {args.threads} threads, "
               f"batch 1): the guard's estimate against the measured peak ({rows[0]['how']}), each case in a fresh "
               f"process after a warm-up, {args.trials} processes per case (the median, and the range of the "
               f"ratio over them); generation = a static KV cache allocated first, the prefill, then "
               f"{args.new_tokens} new tokens.")
    lines = [caption, "", "| kind | tokens | estimate (MiB) | measured, median (MiB) | measured, every trial (MiB) "
             "| estimate / median | estimate / measured, range |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['tokens']} | {r['estimate_mib']} | {r['measured_mib']} | "
              f"{', '.join(str(x) for x in r.get('measured_trials_mib', [r['measured_mib']]))} | {r['ratio']} | "
              f"{'-'.join(str(x) for x in r.get('ratio_range', [r['ratio']]))} |" for r in rows]
    write_json(out / "memory.json", {"command": "memory_estimate", "model": rows[0]["model"], "dtype": args.dtype,
                                     "threads": args.threads, "rows": rows}, overwrite=True)
    atomic_write_text(out / "memory.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
