"""`orthorank analyze`: does a model have the attention sink OrthoRank relies on? Plots and an HTML report."""

from __future__ import annotations

import argparse
import time

import torch

from orthorank.cli.common import DATA_DIR_HELP, add_model_args, finite_float, load_from_args, positive_int
from orthorank.cli.selection_map import load_maps
from orthorank.errors import UserError
from orthorank.evaluation.data import load_eval_text
from orthorank.method.selection import CRITERIA
from orthorank.results import environment


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="per-layer sink statistics, plots and an HTML report",
        description="Per layer: cos(sink, token) of the normalized states, the sink's layer-to-layer stability, "
                    "hidden-state norms, the attention share of the sink, and which tokens OrthoRank would select. "
                    "Writes PNG figures, DIR/report.html (self-contained) and DIR/analysis.json.")
    add_model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None, help="wikitext2 (default), c4, or a path to a UTF-8 text file")
    src.add_argument("--text", default=None,
                     help="analyze this text instead of a dataset (split into --seq-len windows when longer; "
                          "default: none, --dataset is read)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--samples", type=positive_int, default=4, help="windows to average over (default 4)")
    p.add_argument("--seq-len", type=positive_int, default=512, help="tokens per window (default 512)")
    p.add_argument("--ratio", type=finite_float, default=0.33, help="selection ratio for the selection map (default %(default)s)")
    p.add_argument("--criterion", choices=CRITERIA, default="dot", help="selection score: |<x_sink,x_i>| (dot) or |cos| (default %(default)s)")
    p.add_argument("--sample-tokens", type=positive_int, default=48,
                   help="tokens of the first window shown in the selection map (default 48)")
    p.add_argument("--compare-json", action="append", default=[], metavar="FILE",
                   help="add a table from an `orthorank compare` JSON result (repeatable; default: none)")
    p.add_argument("--selection-map", action="append", default=[], metavar="FILE",
                   help="add the maps of an `orthorank selection-map` result (selection-map.json; repeatable; "
                        "default: none)")
    p.add_argument("--out", required=True, help="output folder for report.html, the PNGs and analysis.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report in --out")
    p.set_defaults(func=run)


def _windows(ids: torch.Tensor, seq_len: int, samples: int) -> torch.Tensor:
    if ids.numel() < 2:
        raise UserError(f"the text has {ids.numel()} token(s); the analysis needs at least 2 (a sink and a token)")
    n = ids.numel() // seq_len
    if n == 0:  # shorter than one window: analyze it whole
        return ids.unsqueeze(0)
    n = min(n, samples)
    return ids[: n * seq_len].view(n, seq_len)


def _token_ids(tokenizer, text: str, need: int) -> torch.Tensor:
    # Tokenize a generous prefix first: a whole dataset takes seconds and only `need` tokens are used.
    chars = need * 12 + 1000
    if len(text) > chars:
        ids = tokenizer(text[:chars], add_special_tokens=False, return_tensors="pt").input_ids[0]
        if ids.numel() > need + 8:
            return ids[:need]
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0][:need]


def run(args) -> int:
    # Imported here: plotting needs matplotlib, which the GPU machine's bench path must not require.
    from orthorank.analysis.report import check_out_dir, load_compare, render_report
    from orthorank.analysis.stats import analyze

    if args.seq_len < 2:
        raise UserError("--seq-len must be at least 2")
    if not 0.0 < args.ratio <= 1.0:
        raise UserError(f"--ratio must be in (0, 1], got {args.ratio}")
    if args.text is not None and not args.text.strip():
        raise UserError("--text is empty")
    check_out_dir(args.out, args.overwrite)
    compare = [load_compare(path) for path in args.compare_json]
    maps = [m for path in args.selection_map for m in load_maps(path)]
    if args.text is not None:
        text, source = args.text, "--text"
    else:
        dataset = args.dataset or "wikitext2"
        text, source = load_eval_text(dataset, args.data_dir), dataset
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer (a random-weight shape); analyze a real model, or call "
                        "orthorank.analysis.analyze(model, token_ids) from Python")
    windows = _windows(_token_ids(lm.tokenizer, text, args.samples * args.seq_len), args.seq_len, args.samples)
    labels = [lm.tokenizer.decode([int(t)]) for t in windows[0, : args.sample_tokens]]
    start = time.perf_counter()
    result = analyze(lm.model, windows, ratio=args.ratio, criterion=args.criterion,
                     sample_tokens=max(2, args.sample_tokens), token_labels=labels, name=lm.name, source=source)
    seconds = time.perf_counter() - start
    env = environment(lm.device)
    provenance = {
        "model": lm.name, "source": source, "samples": int(windows.shape[0]),
        "tokens_per_sample": int(windows.shape[1]), "ratio": args.ratio, "criterion": args.criterion,
        "seed": args.seed, "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
        **{k: env[k] for k in ("torch", "transformers", "device", "git_commit") if k in env},
    }
    paths = render_report(result, args.out, compare=compare, provenance=provenance, overwrite=args.overwrite,
                          maps=maps)
    _print_summary(result)
    print(f"analysis of {windows.shape[0]} x {windows.shape[1]} tokens took {seconds:.1f}s")
    figures = ", ".join(p.name for k, p in paths.items() if k not in ("json", "report"))
    print(f"wrote {paths['report']} (figures: {figures}; numbers: {paths['json'].name})")
    return 0


def _print_summary(a) -> None:
    from orthorank.analysis.stats import observations  # lazily: orthorank.analysis imports matplotlib

    print(f"{'layer':>5} {'cos':>7} {'|cos|':>6} {'sink_stab':>9} {'sink|h|':>9} {'med|h|':>8} {'attn_sink':>9}")
    for l in a.layers:
        st = a.sink_stability[l]
        print(f"{l:>5} {a.cos_mean[l]:>+7.3f} {a.cos_abs_mean[l]:>6.3f} {'-' if st is None else f'{st:.4f}':>9} "
              f"{a.sink_norm[l]:>9.1f} {a.other_norm_median[l]:>8.1f} {a.attn_sink_share[l]:>9.3f}")
    from orthorank.analysis.report import observation_lines  # lazily: orthorank.analysis imports matplotlib

    for line in observation_lines(a, observations(a)):
        print("- " + line)
