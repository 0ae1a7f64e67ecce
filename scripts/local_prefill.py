"""The long-prompt preset's time to first token under local attention's two kernels (method/local_kernel.py), side by
side with dense: the preset's plan for the prompt's length (`generate --preset long-prompt` runs the same plan),
batch 1, one prompt of random tokens, the LM head on the last position only, interleaved rounds after a warm-up; per
length the speed-up over dense of each kernel and the split kernel's over the placeholder kernel (median of paired
round ratios, bootstrap interval over rounds), and the last-token logits of the two kernels compared (they round
differently in bfloat16).

    .venv/bin/python scripts/local_prefill.py --lengths 4096,8192 --rounds 7 \\
        --out studies/long-prompt/speed/local-prefill-smollm2-135m.json
    .venv/bin/python scripts/local_prefill.py --render studies/long-prompt/speed/local-prefill-smollm2-135m.json \\
        --md studies/long-prompt/speed/local-prefill-smollm2-135m.md     # the table docs/long-prompts.md quotes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.evaluation.stats import paired_time_ratio  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import prefill_variants  # noqa: E402
from orthorank.method import local_kernel  # noqa: E402
from orthorank.method.apply import apply_plan, restore_dense  # noqa: E402
from orthorank.method.cost import Arch  # noqa: E402
from orthorank.method.presets import load_preset, preset_plan  # noqa: E402
from orthorank.models.last_token import LastTokenForward  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402

ROWS = ("dense", "placeholder", "split")


def _ratio(num: list[float], den: list[float]) -> dict:
    r = paired_time_ratio(num, den)
    return {"value": r.value, "low": r.low, "high": r.high, "n": r.n}


def render(data: dict) -> str:
    env = data["environment"]
    lines = [f"{data['model']}, `--preset long-prompt`'s plan: time to first token against dense (batch 1, random "
             f"prompts, {data['dtype']}, {data['threads']} threads, median of {data['rounds']} interleaved paired "
             f"rounds, bootstrap 95% interval; commit {str(env['git_commit'])[:8]})", "",
             "| prompt tokens | first kernel vs dense | split kernel vs dense | split vs first | last-token logits: "
             "largest difference | same top token |", "|---|---|---|---|---|---|"]

    def cell(x: dict) -> str:
        return f"{x['value']:.3f}x [{x['low']:.3f}, {x['high']:.3f}]"
    for r in data["rows"]:
        sp = r["speedup_over_dense"]
        lines.append(f"| {r['seq_len']} | {cell(sp['placeholder'])} | {cell(sp['split'])} | "
                     f"{cell(r['split_over_placeholder'])} | {r['max_abs_logit_diff']:.3f} | "
                     f"{'yes' if r['same_argmax'] else 'no'} |")
    return "\n".join(lines) + "\n"


@torch.no_grad()
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--preset", default="long-prompt")
    p.add_argument("--lengths", default="4096,8192")
    p.add_argument("--rounds", type=int, default=7)
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
    arch = Arch.from_config(lm.config, lm.config.num_hidden_layers)
    preset = load_preset(args.preset)
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        plan = preset_plan(preset, lm.name, lm.signature(), arch, n,
                           layer_types=getattr(lm.config, "layer_types", None))
        ids = torch.randint(10, min(lm.config.vocab_size, 30000), (1, n), generator=torch.Generator().manual_seed(0))

        def setup(name: str) -> None:
            restore_dense(lm.model)
            if name != "dense":
                local_kernel.AUTO = name
                apply_plan(lm.model, plan)

        times, logits = prefill_variants(forward, ids, ROWS, setup, args.rounds, compared=ROWS[1:])
        restore_dense(lm.model)
        local_kernel.AUTO = "split"
        row = {"seq_len": n, "plan": {"method": plan.method, "layers": plan.layers,
                                      "attention": None if plan.attention is None else plan.attention.to_dict()},
               "times_s": times,
               "speedup_over_dense": {k: _ratio(times["dense"], times[k]) for k in ROWS[1:]},
               "split_over_placeholder": _ratio(times["placeholder"], times["split"]),
               "max_abs_logit_diff": float((logits["split"] - logits["placeholder"]).abs().max()),
               "same_argmax": bool(logits["split"].argmax() == logits["placeholder"].argmax())}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("times_s", "plan")}), flush=True)
    if args.out:
        body = {"command": " ".join(["scripts/local_prefill.py", *sys.argv[1:]]), "model": lm.name,
                "preset": dataclasses.asdict(preset) if dataclasses.is_dataclass(preset) else args.preset,
                "rounds": args.rounds, "threads": args.threads, "dtype": "bfloat16", "rows": rows,
                "environment": environment("cpu")}
        atomic_write_text(Path(args.out), json.dumps(body, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
