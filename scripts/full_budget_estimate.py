"""What `orthorank study --budget full` would cost on a 7B-70B model: tokens per stage from the budget, FLOPs from the
cost model (method/cost.py, dense forward FLOPs per token; a backward counted as twice a forward), GPU time at an
assumed sustained throughput, and memory per process (bfloat16 weights plus the memory guard's estimate of the
largest forward, harness/runtime/memory.py).

    .venv/bin/python scripts/full_budget_estimate.py [--gpus 8] [--tflops 989] [--mfu 0.35] [--json FILE]

These are predictions, not measurements: no GPU was lent to measure the throughput this assumes (989 TFLOP/s is an
H100/H200 SXM's dense bfloat16 peak; 35% of it is typical of batched prefill in eager PyTorch). The stages and their
row counts follow harness/study/stages.py; zero-shot and long-input token counts are averages stated below.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.method.cost import model_flops  # noqa: E402
from orthorank.models.arch import Arch  # noqa: E402
from orthorank.harness.results import write_json  # noqa: E402
from orthorank.harness.runtime.memory import Shape, estimate_bytes  # noqa: E402
from orthorank.harness.study.budgets import DOMAINS, ZEROSHOT_TASKS, get_budget  # noqa: E402

# Published shapes (config.json of each checkpoint)
MODELS = {
    "Llama-3.1-8B": Arch(num_layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "Mistral-7B-v0.1": Arch(num_layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=32000),
    "Llama-3.1-70B": Arch(num_layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256),
}
SEARCHED = 4  # sleb, shortgpt, shortened-ppl, orthorank
ABLATIONS = 4  # random, inverse, raw, no bypassed K/V, at each claim level
ZEROSHOT_TOKENS_PER_ITEM = 250  # choices x (context + continuation), averaged over PIQA, WinoGrande, HellaSwag, ARC
LONGCTX_TASKS = 5  # the offline suite's tasks
CALIB_TOKENS = 8192  # a search's calibration text (the default)


def params(a: Arch) -> float:
    attn = a.hidden * (a.heads + 2 * a.kv_heads) * a.head_dim + a.heads * a.head_dim * a.hidden
    return a.num_layers * (attn + 3 * a.hidden * a.ffn) + 2 * a.vocab * a.hidden


def stage_tokens(a: Arch) -> dict[str, tuple[float, int]]:
    """stage -> (forward-equivalent tokens, sequence length they run at)."""
    b = get_budget("full")
    L = a.num_layers
    levels, claims = len(b.levels), len(b.claim_levels)
    ppl_rows = 1 + SEARCHED * levels + ABLATIONS * claims
    lengths = [int(x.rstrip("k")) * 1024 for x in b.longctx_lengths.split(",")]
    # greedy searches: SLEB removes ceil(0.2 L) layers trying every remaining one per step (racing drops most
    # candidates after 2K tokens; counted in full, an upper bound); OrthoRank adds about twice as many selection layers
    n_prune = math.ceil(max(b.levels) * L)
    sleb = sum(L - i for i in range(n_prune)) * CALIB_TOKENS
    ortho = sum(L - i for i in range(2 * n_prune)) * CALIB_TOKENS
    # the hybrid search: per step every layer's remove / keep-ratio moves (about 4 per layer), about twice as many steps
    hybrid = 2 * n_prune * 4 * L * CALIB_TOKENS
    router_fit = b.router.calib_samples * b.router.calib_seq_len * 3 * b.router.iterations * levels  # fwd + bwd
    return {
        "searches (SLEB, OrthoRank; upper bound)": (sleb + ortho, 256),
        "hybrid search (upper bound)": (hybrid, 256),
        "perplexity": (ppl_rows * b.ppl_windows * len(DOMAINS) * b.ppl_seq_len, b.ppl_seq_len),
        "zero-shot": ((1 + SEARCHED * claims) * b.zeroshot_limit * len(ZEROSHOT_TASKS) * ZEROSHOT_TOKENS_PER_ITEM, 256),
        "long inputs": (3 * claims * LONGCTX_TASKS * b.longctx_samples * sum(lengths), max(lengths)),
        "router (fits and comparison)": (router_fit + 3 * levels * b.ppl_windows * len(DOMAINS) * b.ppl_seq_len,
                                         b.ppl_seq_len),
    }


def estimate(gpus: int, tflops: float, mfu: float) -> dict:
    out = {}
    for name, a in MODELS.items():
        rows, total = [], 0.0
        for stage, (tokens, seq) in stage_tokens(a).items():
            flops = tokens * model_flops(a, seq)
            hours = flops / (gpus * tflops * 1e12 * mfu) / 3600
            total += hours
            rows.append({"stage": stage, "tokens": tokens, "flops": flops, "hours": hours})
        weights = params(a) * 2
        shape = Shape(a, eager=False, value_bytes=2)
        act = estimate_bytes(shape, 1, 4096, loss=True)
        out[name] = {"params_b": params(a) / 1e9, "weights_gib": weights / 2**30,
                     "peak_per_process_gib": (weights + act) / 2**30, "stages": rows, "hours": total}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=8, help="processes, one GPU each (default %(default)s)")
    p.add_argument("--tflops", type=float, default=989.0, help="peak dense bfloat16 TFLOP/s per GPU (default %(default)s)")
    p.add_argument("--mfu", type=float, default=0.35, help="share of the peak sustained (default %(default)s)")
    p.add_argument("--json", default=None, help="also write the estimate here (default: print only)")
    args = p.parse_args(argv)
    est = estimate(args.gpus, args.tflops, args.mfu)
    print(f"full budget, {args.gpus} GPUs at {args.tflops:g} TFLOP/s x {args.mfu:g} (predicted, not measured)\n")
    print("| model | parameters | bf16 weights | peak per process (weights + 4K-token forward) | stage: hours | total hours |")
    print("|---|---|---|---|---|---|")
    for name, e in est.items():
        stages = "; ".join(f"{r['stage']} {r['hours']:.2f}" for r in e["stages"])
        print(f"| {name} | {e['params_b']:.1f}B | {e['weights_gib']:.0f} GiB | {e['peak_per_process_gib']:.0f} GiB | "
              f"{stages} | {e['hours']:.1f} |")
    if args.json:
        write_json(args.json, {"settings": vars(args), "models": est}, overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
