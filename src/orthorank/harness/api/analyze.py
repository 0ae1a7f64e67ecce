"""`orthorank analyze`: does a model have the attention sink OrthoRank relies on? Plots and an HTML report."""

from __future__ import annotations

import time

import torch

from orthorank.harness.api.common import load_model_from_options
from orthorank.harness.api.options import AnalyzeOptions
from orthorank.harness.api.selection_map import load_maps
from orthorank.errors import UserError
from orthorank.harness.evaluation.data import load_eval_text
from orthorank.harness.results import environment


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


def run(opts: AnalyzeOptions) -> int:
    # Imported here: plotting needs matplotlib, which the GPU machine's bench path must not require.
    from orthorank.harness.reports.analysis import check_out_dir, load_compare, render_report
    from orthorank.harness.analysis.stats import analyze

    if opts.seq_len < 2:
        raise UserError("--seq-len must be at least 2")
    if not 0.0 < opts.ratio <= 1.0:
        raise UserError(f"--ratio must be in (0, 1], got {opts.ratio}")
    if opts.text is not None and not opts.text.strip():
        raise UserError("--text is empty")
    check_out_dir(opts.out, opts.overwrite)
    compare = [load_compare(path) for path in opts.compare_json]
    maps = [m for path in opts.selection_map for m in load_maps(path)]
    if opts.text is not None:
        text, source = opts.text, "--text"
    else:
        dataset = opts.dataset or "wikitext2"
        text, source = load_eval_text(dataset, opts.data_dir), dataset
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError(f"{opts.model} has no tokenizer (a random-weight shape); analyze a real model, or call "
                        "orthorank.harness.analysis.analyze(model, token_ids) from Python")
    windows = _windows(_token_ids(lm.tokenizer, text, opts.samples * opts.seq_len), opts.seq_len, opts.samples)
    labels = [lm.tokenizer.decode([int(t)]) for t in windows[0, : opts.sample_tokens]]
    start = time.perf_counter()
    result = analyze(lm.model, windows, ratio=opts.ratio, criterion=opts.criterion,
                     sample_tokens=max(2, opts.sample_tokens), token_labels=labels, name=lm.name, source=source)
    seconds = time.perf_counter() - start
    env = environment(lm.device)
    provenance = {
        "model": lm.name, "source": source, "samples": int(windows.shape[0]),
        "tokens_per_sample": int(windows.shape[1]), "ratio": opts.ratio, "criterion": opts.criterion,
        "seed": opts.seed, "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
        **{k: env[k] for k in ("torch", "transformers", "device", "git_commit") if k in env},
    }
    paths = render_report(result, opts.out, compare=compare, provenance=provenance, overwrite=opts.overwrite,
                          maps=maps)
    _print_summary(result)
    print(f"analysis of {windows.shape[0]} x {windows.shape[1]} tokens took {seconds:.1f}s")
    figures = ", ".join(p.name for k, p in paths.items() if k not in ("json", "report"))
    print(f"wrote {paths['report']} (figures: {figures}; numbers: {paths['json'].name})")
    return 0


def _print_summary(a) -> None:
    from orthorank.harness.analysis.stats import observations  # lazily: orthorank.harness.analysis imports matplotlib

    print(f"{'layer':>5} {'cos':>7} {'|cos|':>6} {'sink_stab':>9} {'sink|h|':>9} {'med|h|':>8} {'attn_sink':>9}")
    for l in a.layers:
        st = a.sink_stability[l]
        print(f"{l:>5} {a.cos_mean[l]:>+7.3f} {a.cos_abs_mean[l]:>6.3f} {'-' if st is None else f'{st:.4f}':>9} "
              f"{a.sink_norm[l]:>9.1f} {a.other_norm_median[l]:>8.1f} {a.attn_sink_share[l]:>9.3f}")
    from orthorank.harness.reports.analysis import observation_lines  # lazily: orthorank.harness.analysis imports matplotlib

    for line in observation_lines(a, observations(a)):
        print("- " + line)
