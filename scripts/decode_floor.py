"""What stands between batch-1 decoding and the memory-bandwidth bound on this CPU.

The speed issue asks decode at batch 1 to reach 60% of the bandwidth bound (bytes one step reads over the measured
copy bandwidth, `orthorank.harness.runtime.bandwidth`). This script measures, side by side in one process and interleaved
rounds, three rates for one model:

    bound      B * copy bandwidth / bytes one decode step reads (weights once, KV cache per row)
    GEMV floor the same step's matrix products alone: F.linear of every projection of every layer and the LM head,
               one after another on inputs of the right width, nothing else (no norms, RoPE, attention, cache,
               Python module calls). No decode built on torch's CPU kernels can beat it.
    eager      one real decode step of the model (DynamicCache over `--context` positions), as `generate` runs it

and, to split the floor's shortfall, the rate at which summing every weight (`w.sum()`, a vectorized read) reads
memory on the same threads, and a `dispatch` time: the same number of F.linear calls on 1 x 1 weights, i.e.
the cost of calling the operators at all. The gap bound -> floor belongs to the kernels (and the copy benchmark's
read+write convention); floor -> eager to everything a decode step does besides the products.

    .venv/bin/python scripts/decode_floor.py --model smollm2-135m --batch 1,32 --out scripts/results/decode-floor
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.runtime.bandwidth import copy_bandwidth, decode_bound, decode_step_bytes  # noqa: E402
from orthorank.models.adapters import get_adapter  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402


def step_weights(model) -> list[torch.Tensor]:
    """Every matrix one decode step multiplies by, in forward order: each layer's linear layers, then the LM head."""
    weights = []
    for layer in get_adapter(model).layers(model):
        weights += [m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    weights.append(model.get_output_embeddings().weight)
    return weights


def timed(fn, rounds: int) -> list[float]:
    fn()  # warm-up: first-touch pages, oneDNN primitive caches
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", default="1,32")
    p.add_argument("--context", type=int, default=256, help="KV-cache positions behind the decoded token")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--num-layers", type=int, default=None, help="random-weight shapes only (the tests)")
    p.add_argument("--out", type=Path, default=ROOT / "scripts/results/decode-floor")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device="cpu", dtype=args.dtype, num_layers=args.num_layers)
    model = loaded.model.eval()
    weights = step_weights(model)
    dtype = weights[0].dtype
    tiny = [torch.ones(1, 1, dtype=dtype) for _ in weights]
    rows = []
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch.split(",")]:
            inputs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=dtype) for w in weights}
            one = torch.ones(batch, 1, dtype=dtype)

            def gemv_floor():
                for w in weights:
                    F.linear(inputs[w.shape[1]], w)

            transposed = [w.t().contiguous() for w in weights]  # (in, out): the layout MKL's GEMV streams fastest here

            def gemv_transposed():
                for w in transposed:
                    inputs[w.shape[0]] @ w

            def read():
                for w in weights:
                    w.sum()

            def dispatch():
                for w in tiny:
                    F.linear(one, w)

            prompt = torch.randint(0, model.config.vocab_size, (batch, args.context))
            out = model(input_ids=prompt, use_cache=True)
            cache, token = out.past_key_values, prompt[:, -1:]
            position = torch.full((batch, 1), args.context, dtype=torch.long)

            def eager_step():
                model(input_ids=token, past_key_values=cache, position_ids=position, use_cache=True)
                cache.crop(-1)  # every round decodes the same position over the same cache

            fns = {"read": read, "gemv_floor": gemv_floor, "gemv_transposed": gemv_transposed, "dispatch": dispatch, "eager": eager_step}
            times: dict[str, list[float]] = {name: [] for name in fns}
            for fn in fns.values():
                fn()
            bandwidths = []
            for _ in range(args.rounds):  # interleaved, so drift of this shared machine hits every rate alike
                for name, fn in fns.items():
                    times[name] += timed(fn, 1)
                bandwidths.append(copy_bandwidth("cpu", repeats=1))
            bandwidth = max(bandwidths)
            step_bytes = decode_step_bytes(model, batch=batch, context=args.context)
            bound = decode_bound(step_bytes, batch, bandwidth)
            rates = {name: batch / statistics.median(times[name]) for name in ("gemv_floor", "gemv_transposed", "eager")}
            read_rate = step_bytes["weights"] / statistics.median(times["read"])
            row = {
                "batch": batch, "context": args.context, "bandwidth_gb_s": bandwidth / 1e9,
                "step_bytes": step_bytes, "bound_tokens_s": bound,
                "linear_calls": len(weights),
                **{f"{k}_tokens_s": v for k, v in rates.items()},
                **{f"{k}_ms": 1e3 * statistics.median(t) for k, t in times.items()},
                **{f"{k}_ms_min_max": [1e3 * min(t), 1e3 * max(t)] for k, t in times.items()},
                # w.sum() over every weight: the read rate a vectorized torch kernel reaches on these threads
                "weight_read_gb_s": read_rate / 1e9,
                # a decode that read its bytes at that rate and did nothing else
                "read_ceiling_tokens_s": batch * read_rate / step_bytes["total"],
                "read_ceiling_share_of_bound": batch * read_rate / step_bytes["total"] / bound,
                "transposed_share_of_bound": rates["gemv_transposed"] / bound,
                "floor_share_of_bound": rates["gemv_floor"] / bound,
                "eager_share_of_bound": rates["eager"] / bound,
                "eager_share_of_floor": rates["eager"] / rates["gemv_floor"],
                "dispatch_share_of_floor_time": statistics.median(times["dispatch"]) / statistics.median(times["gemv_floor"]),
            }
            rows.append(row)
            print(f"batch {batch}: bound {bound:.0f} tok/s ({bandwidth / 1e9:.1f} GB/s copy, "
                  f"{step_bytes['total'] / 2**20:.0f} MiB/step); GEMV floor {rates['gemv_floor']:.1f} "
                  f"({100 * row['floor_share_of_bound']:.0f}% of bound), transposed {rates['gemv_transposed']:.1f}; summing the "
                  f"weights reads {row['weight_read_gb_s']:.1f} GB/s ({100 * row['read_ceiling_share_of_bound']:.0f}% of "
                  f"bound); eager {rates['eager']:.1f} "
                  f"({100 * row['eager_share_of_bound']:.0f}% of bound, {100 * row['eager_share_of_floor']:.0f}% of floor); "
                  f"calling {len(weights)} linears on 1x1 weights: {row['dispatch_ms']:.2f} ms", flush=True)
    env = environment("cpu")
    env["load_average_1m"] = os.getloadavg()[0]
    result = {"model": loaded.name, "dtype": str(dtype).replace("torch.", ""), "threads": args.threads,
              "rounds": args.rounds, "rows": rows, "environment": env}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{loaded.name}-{result['dtype']}-{args.threads}t"
    atomic_write_text(args.out / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    text = render(args.out)
    atomic_write_text(args.out / "decode-floor.md", text)
    print(text, end="")
    return 0


def render(folder: Path) -> str:
    """One table of every configuration measured into `folder` (one JSON per model, dtype and thread count)."""
    lines = ["| model | dtype | threads | batch | context | copy GB/s | MiB read / step | bound tok/s | GEMV floor tok/s "
             "(% of bound) | GEMV on (in, out) weights tok/s (% of bound) | weights summed: GB/s (% of bound) | "
             "eager tok/s (% of bound, % of floor) | 1x1-linear calls, ms (% of floor time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        for r in result["rows"]:
            lines.append(
                f"| {result['model']} | {result['dtype']} | {result['threads']} | {r['batch']} | {r['context']} | "
                f"{r['bandwidth_gb_s']:.1f} | {r['step_bytes']['total'] / 2**20:.0f} | {r['bound_tokens_s']:.0f} | "
                f"{r['gemv_floor_tokens_s']:.1f} ({100 * r['floor_share_of_bound']:.0f}%) | "
                f"{r['gemv_transposed_tokens_s']:.1f} ({100 * r['transposed_share_of_bound']:.0f}%) | "
                f"{r['weight_read_gb_s']:.1f} ({100 * r['read_ceiling_share_of_bound']:.0f}%) | "
                f"{r['eager_tokens_s']:.1f} ({100 * r['eager_share_of_bound']:.0f}%, {100 * r['eager_share_of_floor']:.0f}%) | "
                f"{r['dispatch_ms']:.2f} ({100 * r['dispatch_share_of_floor_time']:.0f}%) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
