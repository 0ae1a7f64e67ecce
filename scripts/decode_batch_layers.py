"""Where a batch decode step's time goes under a causal router plan, layer by layer (issue 58).

At batch 32 the causal plan decoded slower than dense on SmolLM2-135M at 20% though its selection layers updated
about a fifth of the rows (studies/decode-router/). This times every decoder layer of real decode steps (forward
pre- and post-hooks, perf_counter; B prompts of calibration text, a prefill, then --steps greedy steps), for the
model without a plan and with it, alternating in rounds, and gives:

    dense layer            the mean time of a decoder layer of the model without the plan
    plan, other layers     the plan's layers that select nothing (should equal the dense layer)
    plan, selection layer  the plan's selection layers, with the share of rows they updated
    ideal                  a selection layer at the share: K/V of every row plus the share of the rest, by FLOPs

Times, not counts: run it on a quiet machine.

    .venv/bin/python scripts/decode_batch_layers.py --plan plans/smollm2-135m/router-searched-causal-0.2.json \\
        --batch 32 --out scripts/results/decode-router/batch-layers-smollm2-135m.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.results import write_json  # noqa: E402
from orthorank.harness.runtime.costmodel import kv_fraction  # noqa: E402
from orthorank.harness.search.calibration import calibration_set  # noqa: E402
from orthorank.method.apply import apply_plan, restore_dense, selective  # noqa: E402
from orthorank.method.plan import Plan  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402


class LayerClock:
    """Wall time of every call of each decoder layer, by layer index (hooks on the layer modules)."""

    def __init__(self, layers) -> None:
        self.times: dict[int, list[float]] = collections.defaultdict(list)
        self.on = False
        self._start: dict[int, float] = {}
        self.handles = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._enter(i)))
            self.handles.append(layer.register_forward_hook(self._leave(i)))

    def _enter(self, i: int):
        def hook(mod, args):
            self._start[i] = time.perf_counter()
        return hook

    def _leave(self, i: int):
        def hook(mod, args, out):
            if self.on:
                self.times[i].append(time.perf_counter() - self._start[i])
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def decode_steps(model, prompts: torch.Tensor, steps: int, clock: LayerClock) -> None:
    """A prefill (unclocked), then `steps` greedy one-token steps, clocked."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        nxt = model(prompts, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        clock.on = True
        for _ in range(steps):
            nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        clock.on = False


def shares(model) -> dict[int, float]:
    """Share of the last step's rows each selection layer updated."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        sel = selective(layer)
        if sel is not None and sel.last_keep is not None:
            out[i] = float(sel.last_keep.float().mean())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", type=Path, required=True, help="a causal router plan")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    plan = Plan.load(args.plan)
    lm = load_model(plan.model, device="cpu", dtype=args.dtype)
    model = lm.model.eval()
    layers = model.model.layers
    L = len(layers)
    rows = -(-args.batch // 4) * 4
    prompts = calibration_set(lm.tokenizer, "mix", rows, args.prompt_len, 0).windows[:args.batch]
    sel_ids = list(plan.layers)
    clock = LayerClock(layers)
    per: dict[str, list[float]] = {"dense": [], "other": [], "selection": []}
    by_layer: dict[str, dict[int, list[float]]] = {"dense": collections.defaultdict(list),
                                                   "plan": collections.defaultdict(list)}
    last_shares: dict[int, float] = {}
    for _ in range(args.rounds):
        for name in ("dense", "plan"):
            if name == "plan":
                apply_plan(model, plan)
            clock.times.clear()
            decode_steps(model, prompts, args.steps, clock)
            if name == "plan":
                last_shares = shares(model)
                restore_dense(model)
            for i, ts in clock.times.items():
                by_layer[name][i] += ts
    clock.remove()
    ms = {name: {i: 1e3 * statistics.median(ts) for i, ts in d.items()} for name, d in by_layer.items()}
    dense_layer = statistics.mean(ms["dense"].values())
    other = statistics.mean(v for i, v in ms["plan"].items() if i not in sel_ids)
    selection = statistics.mean(ms["plan"][i] for i in sel_ids)
    dense_same = statistics.mean(ms["dense"][i] for i in sel_ids)
    share = statistics.mean(last_shares.values()) if last_shares else None
    f_kv = kv_fraction(model.config)
    ideal = dense_same * (f_kv + (1 - f_kv) * share) if share is not None else None
    print(f"{plan.model} batch {args.batch}, {args.steps} steps after {args.prompt_len} tokens, {args.rounds} rounds "
          f"(medians per layer, ms): dense layer {dense_layer:.3f}; plan's other layers {other:.3f}; plan's "
          f"selection layers {selection:.3f} against {dense_same:.3f} dense at the same indices"
          + (f", share updated {share:.3f}, ideal {ideal:.3f}" if ideal is not None else ""))
    row = {"plan": str(args.plan), "model": plan.model, "batch": args.batch, "prompt_len": args.prompt_len,
           "steps": args.steps, "rounds": args.rounds, "dtype": args.dtype, "threads": args.threads,
           "layers": L, "selection_layers": sel_ids, "ms_per_layer": ms, "dense_layer_ms": dense_layer,
           "plan_other_layer_ms": other, "plan_selection_layer_ms": selection,
           "dense_at_selection_indices_ms": dense_same, "share_updated_last_step": last_shares,
           "kv_fraction": f_kv, "ideal_selection_layer_ms": ideal}
    if args.out:
        write_json(args.out, {"command": " ".join(["scripts/decode_batch_layers.py", *sys.argv[1:]]), **row},
                   device="cpu", overwrite=True)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
