"""Where a whole prefill's time goes, per method: dense, layer removal and OrthoRank at the same compute (evenly
spread layers, as `bench --methods dense,spread-prune,spread-orthorank`), timed in interleaved rounds and profiled
(torch.profiler self time per operator family, the mean of a few profiled calls). The profiled calls' wall time
that no operator's self time covers is Python and dispatch between operators, and the profiler's own bookkeeping
("outside operators": an upper bound on the first two).

    .venv/bin/python scripts/prefill_profile.py --seq-len 8192 --rounds 7 \\
        --out scripts/results/prefill-length/profile-8k.json
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

from orthorank.harness.speed.layer_mode import PROFILE_CATEGORIES, profile_families  # noqa: E402
from orthorank.harness.speed.specs import method_specs  # noqa: E402
from orthorank.harness.runtime.timing import random_ids  # noqa: E402
from orthorank.method.apply import restore_dense  # noqa: E402
from orthorank.method.cost import Arch  # noqa: E402
from orthorank.method.selection import SelectionConfig  # noqa: E402
from orthorank.models.last_token import LastTokenForward  # noqa: E402
from orthorank.models.loading import load_model  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import interleaved_rounds  # noqa: E402

METHODS = ["dense", "spread-prune", "spread-orthorank"]
FAMILIES = [c for c, _ in PROFILE_CATEGORIES] + ["elementwise"]


def measure(model_name: str, T: int, sparsity: float, rounds: int, calls: int, dtype: str) -> dict:
    lm = load_model(model_name, device="cpu", dtype=dtype)
    specs = method_specs(METHODS, lm.num_layers, sparsity, SelectionConfig(), model_name=lm.name,
                         arch=Arch.from_config(lm.config, lm.num_layers), seq_len=T)
    ids = random_ids(lm.config.vocab_size, 1, T, torch.device("cpu"), 0)
    forward = LastTokenForward(lm.model)
    times: dict[str, list[float]] = {s.name: [] for s in specs}
    profiles: dict[str, tuple[dict[str, float], float]] = {}
    with torch.inference_mode():
        by_name = {spec.name: spec for spec in specs}

        def run(name: str) -> float:
            by_name[name].apply(lm.model)
            try:
                t = time.perf_counter()
                forward(ids)
                return time.perf_counter() - t
            finally:
                restore_dense(lm.model)

        times.update(interleaved_rounds(
            list(by_name), run, rounds, warmup=1, on_round=lambda r, t: print(
                f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in t.items()), flush=True)))
        for spec in specs:
            spec.apply(lm.model)
            try:
                profiles[spec.name] = profile_families(lambda: forward(ids), torch.device("cpu"), calls)[1:]
            finally:
                restore_dense(lm.model)
    rows = {}
    for spec in specs:
        wall = 1e3 * statistics.median(times[spec.name])
        prof, profiled_wall = profiles[spec.name]
        rows[spec.name] = {"layers": spec.layers, "wall_ms": wall, "wall_ms_range": [1e3 * min(times[spec.name]),
                                                                                     1e3 * max(times[spec.name])],
                           "families_ms": prof, "operators_ms": sum(prof.values()),
                           "profiled_wall_ms": profiled_wall,
                           "outside_operators_ms": profiled_wall - sum(prof.values())}
    return {"model": lm.name, "seq_len": T, "sparsity": sparsity, "dtype": str(next(lm.model.parameters()).dtype),
            "rounds": rounds, "profiled_calls": calls, "threads": torch.get_num_threads(), "methods": rows,
            "times_s": times}


def markdown(rec: dict) -> str:
    rows = rec["methods"]
    dense = rows["dense"]["wall_ms"]
    out = [f"Prefill of 1 x {rec['seq_len']} tokens, {rec['model']}, {rec['dtype']}, {rec['threads']} threads: "
           f"median of {rec['rounds']} interleaved rounds (wall); self time per operator family, and the profiled "
           f"calls' wall time outside any operator, the mean of {rec['profiled_calls']} profiled calls (profiled "
           "wall); ms per prefill", "",
           "| family | " + " | ".join(rows) + " | orthorank - prune |", "|---|" + "---|" * (len(rows) + 1)]
    o, p = rows.get("spread-orthorank"), rows.get("spread-prune")
    extra = {"outside operators": "outside_operators_ms", "profiled wall": "profiled_wall_ms", "wall": "wall_ms"}
    for fam in FAMILIES + list(extra):
        def val(r):
            return r[extra[fam]] if fam in extra else r["families_ms"][fam]
        diff = f"{val(o) - val(p):+.0f}" if o and p else "-"
        out.append(f"| {fam} | " + " | ".join(f"{val(r):.0f}" for r in rows.values()) + f" | {diff} |")
    out += ["", "speed-up over dense: " + ", ".join(f"{n} {dense / r['wall_ms']:.3f}x" for n, r in rows.items())]
    if o and p:
        out.append(f"OrthoRank's speed-up over layer removal's: {p['wall_ms'] / o['wall_ms']:.3f}x")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--sparsity", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2, help="profiled calls per method")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", help="write the result JSON here (and the table beside it, .md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rec = measure(args.model, args.seq_len, args.sparsity, args.rounds, args.calls, args.dtype)
    text = markdown(rec)
    print(text)
    if args.out:
        out = Path(args.out)
        atomic_write_text(out, json.dumps({**rec, "environment": environment("cpu")}, indent=1) + "\n")
        atomic_write_text(out.with_suffix(".md"), text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
