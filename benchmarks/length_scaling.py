"""How OrthoRank's ideal and measured speed-ups change with prompt length (attention's share grows with length).

For each random-weight shape and prompt length: one decoder layer alone, dense against the same layer as a
selection layer (ratio 0.33), interleaved rounds, median; the measured cost fraction against the ideal one from the
FLOP model with attention (orthorank.method.cost) and from weights only. From the fractions, the end-to-end
speed-up of a plan with n of L layers selective (n from the 20% compute-matched rule at that length), measured
fraction against ideal ("derived": the rest of the model is assumed to run at the dense layers' speed). Where the
whole model fits the time budget (--e2e), end-to-end prefill of dense, layer removal and OrthoRank is measured too.

    .venv/bin/python benchmarks/length_scaling.py --threads 1 --out benchmarks/results/length-scaling
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JOBS = ("smollm2-135m-shape:1024,4096,16384,32768;llama2-7b:1024,4096;llama3-8b:1024,4096")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from orthorank.bench.costmodel import flop_layer_cost, ideal_speedup, kv_fraction, selective_layer_cost
    from orthorank.bench.runner import RunSettings, method_specs, run_layer, run_methods
    from orthorank.method.cost import Arch
    from orthorank.method.plan import layers_for_sparsity
    from orthorank.method.selection import SelectionConfig
    from orthorank.models.loading import load_model
    from orthorank.results import check_writable, write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default=DEFAULT_JOBS, help="shape:len,len;shape:len,...")
    p.add_argument("--e2e", default="smollm2-135m-shape:1024,4096", help="end-to-end prefill runs, same format")
    p.add_argument("--sparsity", type=float, default=0.2)
    p.add_argument("--ratio", type=float, default=0.33)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/length-scaling"))
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    check_writable(out / "length-scaling.json", args.overwrite)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    sel = SelectionConfig(ratio=args.ratio)

    def parse(text: str) -> list[tuple[str, list[int]]]:
        return [(j.split(":")[0], [int(x) for x in j.split(":")[1].split(",")]) for j in text.split(";") if j]

    layer_rows, e2e_rows = [], []
    for shape, lengths in parse(args.jobs):
        lm = load_model(shape, device="cpu", dtype=args.dtype, num_layers=2)
        from orthorank.models.shapes import shape_config

        cfg = shape_config(shape)
        L = int(cfg.num_hidden_layers)
        arch = Arch.from_config(cfg, L)
        for T in lengths:
            r = run_layer(lm.model, sel, RunSettings("layer", 1, T, warmup=1, repeats=args.repeats), cpu,
                          log=lambda s: None)
            n = layers_for_sparsity(args.sparsity, L, "orthorank", args.ratio, match="compute", arch=arch,
                                    seq_len=T, inner_only=False)
            p_rm = layers_for_sparsity(args.sparsity, L, "prune", 1.0, match="compute", arch=arch, seq_len=T,
                                       inner_only=False)
            frac, ideal = r["selective_cost_fraction"], flop_layer_cost(cfg, T, args.ratio)
            row = {"shape": shape, "seq_len": T, "num_layers": L, "selection_layers": n, "removed_layers": p_rm,
                   "dense_layer_ms": 1e3 * r["timing"]["dense_layer"]["median_s"],
                   "dense_layer_spread_pct": r["timing"]["dense_layer"]["spread_pct"],
                   "selective_layer_ms": 1e3 * r["timing"]["selective_layer"]["median_s"],
                   "attention_chunks": r["attention_chunks"],
                   "measured_fraction": frac, "ideal_fraction_flops": ideal,
                   "ideal_fraction_weights": selective_layer_cost(kv_fraction(cfg), args.ratio),
                   "pct_of_ideal_layer": 100 * ideal / frac,
                   "orthorank_speedup_derived": L / (L - n + n * frac),
                   "orthorank_ideal_speedup": ideal_speedup("orthorank", L, n, layer_cost=ideal),
                   "removal_ideal_speedup": L / (L - p_rm)}
            row["pct_of_ideal_e2e_derived"] = 100 * row["orthorank_speedup_derived"] / row["orthorank_ideal_speedup"]
            layer_rows.append(row)
            print(f"{shape} {T}: layer fraction {frac:.3f} (ideal {ideal:.3f} FLOPs, "
                  f"{row['ideal_fraction_weights']:.3f} weights) = {row['pct_of_ideal_layer']:.1f}% of ideal; "
                  f"{n}/{L} layers: x{row['orthorank_speedup_derived']:.3f} of x{row['orthorank_ideal_speedup']:.3f}",
                  flush=True)
        del lm
    for shape, lengths in parse(args.e2e):
        lm = load_model(shape, device="cpu", dtype=args.dtype)
        L = lm.num_layers
        for T in lengths:
            specs = method_specs(["dense", "spread-prune", "spread-orthorank"], L, args.sparsity, sel,
                                 arch=Arch.from_config(lm.config, L), seq_len=T)
            rec = run_methods(lm.model, specs, RunSettings("prefill", 1, T, warmup=1, repeats=args.repeats), cpu,
                              log=lambda s: None)
            for m in rec["methods"]:
                e2e_rows.append({"shape": shape, "seq_len": T, "method": m["method"],
                                 "changed_layers": m["changed_layers"], "speedup": m["speedup_vs_dense"],
                                 "speedup_best_runs": m["speedup_vs_dense_best_runs"],
                                 "ideal_speedup": m["ideal_speedup"],
                                 "ideal_speedup_weights_only": m["ideal_speedup_weights_only"],
                                 "pct_of_ideal": m["pct_of_ideal"], "spread_pct": m["timing"]["spread_pct"]})
                print(f"e2e {shape} {T} {m['method']}: x{m['speedup_vs_dense']:.3f} of x{m['ideal_speedup']:.3f} "
                      f"({m['pct_of_ideal']:.1f}%)", flush=True)
        del lm

    lines = [f"Selection layer cost against prompt length (CPU, {args.threads} thread(s), {args.dtype}, random "
             f"weights, batch 1, ratio {args.ratio}; median of {args.repeats} interleaved rounds). Ideal fractions: "
             "FLOPs with attention (orthorank.method.cost) and weights only. End-to-end columns are derived from the "
             f"layer fractions for a {args.sparsity:g} compute-matched plan (n of L layers selective).", "",
             "| shape | tokens | dense layer ms | chunks | measured fraction | ideal (FLOPs) | ideal (weights) | "
             "% of ideal | n / L | speed-up, derived | ideal speed-up | % of ideal, end-to-end | removal ideal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in layer_rows:
        lines.append(f"| {r['shape']} | {r['seq_len']} | {r['dense_layer_ms']:.0f} | {r['attention_chunks']} | "
                     f"{r['measured_fraction']:.3f} | {r['ideal_fraction_flops']:.3f} | "
                     f"{r['ideal_fraction_weights']:.3f} | {r['pct_of_ideal_layer']:.1f} | "
                     f"{r['selection_layers']}/{r['num_layers']} | {r['orthorank_speedup_derived']:.3f} | "
                     f"{r['orthorank_ideal_speedup']:.3f} | {r['pct_of_ideal_e2e_derived']:.1f} | "
                     f"{r['removal_ideal_speedup']:.3f} |")
    if e2e_rows:
        lines += ["", "End-to-end prefill, measured (whole model, batch 1):", "",
                  "| shape | tokens | method | changed layers | speed-up | best runs | ideal (FLOPs) | "
                  "ideal (weights) | % of ideal | spread % |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in e2e_rows:
            lines.append(f"| {r['shape']} | {r['seq_len']} | {r['method']} | {r['changed_layers']} | "
                         f"{r['speedup']:.3f} | {r['speedup_best_runs']:.3f} | {r['ideal_speedup']:.3f} | "
                         f"{r['ideal_speedup_weights_only']:.3f} | {r['pct_of_ideal']:.1f} | {r['spread_pct']:.1f} |")
    text = "\n".join(lines)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "length-scaling.md").write_text(text + "\n")
    write_json(out / "length-scaling.json", {"command": "length_scaling", "threads": args.threads,
                                             "dtype": args.dtype, "ratio": args.ratio, "sparsity": args.sparsity,
                                             "layer": layer_rows, "end_to_end": e2e_rows},
               device="cpu", overwrite=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
