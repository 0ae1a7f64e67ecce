"""The dense prefill of a model with sliding-window layers, with transformers' own attention and with the library's
exact blocked kernel (models/sliding_attention.py), timed side by side: time to first token (batch 1, one prompt of N
tokens, the LM head on the last position only), interleaved rounds after a warm-up, the speed-up as the median of
paired round ratios with a bootstrap interval over rounds. The last-token logits of both are compared too (the kernel
changes rounding, not the model).

    .venv/bin/python scripts/sliding_prefill.py --model gemma3-270m --lengths 4096,8192 --rounds 5 \\
        --out studies/long-prompt/speed/sliding-prefill-gemma3-270m.json
    .venv/bin/python scripts/sliding_prefill.py --render studies/long-prompt/speed/sliding-prefill-gemma3-270m.json \\
        --md studies/long-prompt/speed/sliding-prefill-gemma3-270m.md     # the table the README quotes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.evaluation.stats import paired_time_ratio  # noqa: E402
from orthorank.models.last_token import LastTokenForward  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402
from orthorank.models.sliding_attention import kernel_name, use_blocked_sliding  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import prefill_variants  # noqa: E402


def render(data: dict) -> str:
    env = data["environment"]
    lines = [f"{data['model']}: dense prefill with the blocked sliding-window kernel against transformers' attention "
             f"(time to first token, batch 1, {data['dtype']}, {data['threads']} thread(s), median of "
             f"{data['rounds']} interleaved paired rounds with a bootstrap 95% interval; {env['device_name']}, "
             f"commit {str(env['git_commit'])[:8]})", "",
             "| prompt tokens | speed-up [95% CI] | last-token logits: largest difference | same argmax |",
             "|---|---|---|---|"]
    for r in data["rows"]:
        sp = r["speedup"]
        lines.append(f"| {r['seq_len']} | {sp['value']:.2f}x [{sp['low']:.2f}, {sp['high']:.2f}] | "
                     f"{r['max_abs_logit_diff']:.3f} | {'yes' if r['same_argmax'] else 'no'} |")
    return "\n".join(lines) + "\n"


@torch.no_grad()
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--lengths", default="4096,8192")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--render", default=None, metavar="JSON", help="only write --md from a result file")
    p.add_argument("--md", default=None)
    args = p.parse_args()
    if args.render:
        atomic_write_text(Path(args.md), render(json.loads(Path(args.render).read_text())))
        return 0
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype="bfloat16", device="cpu")
    forward = LastTokenForward(lm.model)
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(10, min(lm.config.vocab_size, 30000), (1, n), generator=torch.Generator().manual_seed(0))
        undo = {"fn": None}

        def setup(name: str) -> None:
            if undo["fn"] is not None:
                undo["fn"]()
                undo["fn"] = None
            if name == "blocked":
                undo["fn"] = use_blocked_sliding(lm.model)

        times, logits = prefill_variants(forward, ids, ("model", "blocked"), setup, args.rounds,
                                         compared=("model", "blocked"))
        setup("model")
        sp = paired_time_ratio(times["model"], times["blocked"])
        row = {"seq_len": n, "model_s": times["model"], "blocked_s": times["blocked"],
               "speedup": {"value": sp.value, "low": sp.low, "high": sp.high, "n": sp.n},
               "max_abs_logit_diff": float((logits["model"] - logits["blocked"]).abs().max()),
               "same_argmax": bool(logits["model"].argmax() == logits["blocked"].argmax())}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_s")}), flush=True)
    setup("blocked")
    kernel = kernel_name(lm.model)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({"command": " ".join(sys.argv), "model": lm.name,
                                                      "rounds": args.rounds, "threads": args.threads,
                                                      "dtype": "bfloat16", "kernel_when_switched": kernel,
                                                      "rows": rows, "environment": environment("cpu")},
                                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
