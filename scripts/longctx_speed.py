"""Memory and speed at length (issue: long inputs): peak memory of one prefill for dense, SLEB and OrthoRank at
2k, 4k and 8k tokens, and time to first token and decode tokens/s per method and decode policy at 4k.

Each measurement runs in a fresh process; peak memory is the resident set sampled every millisecond during the
prefill, above its value before it (KV cache, activations, masks). Writes JSON with versions, device and git commit.

    .venv/bin/python scripts/longctx_speed.py --threads 1 --out scripts/results/longctx-speed
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = {"dense": None, "sleb": "sleb-0.2.json", "orthorank": "orthorank-0.2.json"}


class RssSampler:
    """Peak resident memory above its value at entry, sampled every millisecond by a thread (the process's
    high-water mark is useless here: loading the GGUF file peaks higher than any prefill). Large tensors are
    mmap-backed, so their pages show up in the resident set while they live and leave it when freed."""

    def __init__(self, interval_s: float = 0.001) -> None:
        import threading

        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssSampler":
        self.start = self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def peak_above_start_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def one(method: str, length: int, decode: str, new_tokens: int, threads: int, dtype: str) -> dict:
    import torch

    from orthorank.harness.evaluation.data import load_eval_text
    from orthorank.harness.evaluation.generation import generate_rows
    from orthorank.method.apply import apply_plan
    from orthorank.method.plan import Plan
    from orthorank.models.loading import load_model

    torch.set_num_threads(threads)
    lm = load_model("smollm2-135m", device="cpu", dtype=dtype)
    ids = lm.tokenizer(load_eval_text("wikitext2")[:200_000]).input_ids[:length]
    if ROWS[method]:
        plan = Plan.load(ROOT / "plans/smollm2-135m" / ROWS[method])
        if plan.method == "orthorank":
            from dataclasses import replace

            plan = replace(plan, selection=replace(plan.selection, decode=decode))
        apply_plan(lm.model, plan)
    import gc

    gc.collect()
    sampler = RssSampler()
    t0 = time.perf_counter()
    with torch.no_grad(), sampler:
        # last position's logits only, as generate does: an 8k x vocab logits tensor would hide every difference
        lm.model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
    prefill_s = time.perf_counter() - t0
    out = {"method": method, "length": length, "decode": decode, "prefill_s": prefill_s,
           "peak_above_model_mb": sampler.peak_above_start_mb}
    if new_tokens:
        _, timing = generate_rows(lm, [ids], new_tokens)
        out.update(time_to_first_token_s=timing["time_to_first_token_s"],
                   decode_tokens_per_s=timing["decode_tokens_per_s"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="2048,4096,8192")
    p.add_argument("--speed-length", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=str(ROOT / "scripts/results/longctx-speed"))
    p.add_argument("--one", nargs=3, metavar=("METHOD", "LENGTH", "DECODE"), help=argparse.SUPPRESS)
    p.add_argument("--gen", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--memory-only", action="store_true", help="the prefill rows only (no time to first token)")
    args = p.parse_args()
    if args.one:
        m, n, d = args.one
        print(json.dumps(one(m, int(n), d, args.gen, args.threads, args.dtype)))
        return 0
    runs = []
    lengths = [int(x) for x in args.lengths.split(",")]
    jobs = [(m, n, "dense", 0) for n in lengths for m in ROWS]
    jobs += [] if args.memory_only else [(m, args.speed_length, d, args.new_tokens) for m in ROWS
                                         for d in (("dense", "threshold") if m == "orthorank" else ("dense",))]
    for m, n, d, gen in jobs:
        cmd = [sys.executable, __file__, "--one", m, str(n), d, "--gen", str(gen), "--threads", str(args.threads),
               "--dtype", args.dtype]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                             env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            return 1
        row = json.loads(res.stdout.strip().splitlines()[-1])
        runs.append(row)
        print(json.dumps(row), flush=True)
    sys.path.insert(0, str(ROOT / "src"))
    from orthorank.harness.results import write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "longctx-speed.json", {"command": "longctx_speed", "threads": args.threads,
                                            "dtype": args.dtype, "runs": runs}, overwrite=True)
    lines = ["| method | decode | length | prefill s | peak above model (MB) | time to first token s | decode tok/s |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['method']} | {r['decode']} | {r['length']} | {r['prefill_s']:.2f} | "
                     f"{r['peak_above_model_mb']:.0f} | {r.get('time_to_first_token_s', float('nan')):.2f} | "
                     f"{r.get('decode_tokens_per_s') or float('nan'):.1f} |")
    (out / "longctx-speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
