"""The decode-router summary (harness/reports/decode_router.py) reads the study's compare and bench files: the worst
domain against SLEB as compare wrote it, and decode ratios paired by round whose verdict follows the interval."""

from __future__ import annotations

import json

from orthorank.harness.reports.decode_router import summarize


def _bench(times: dict[str, list[float]], share: float) -> dict:
    methods = [{"method": k, "timing": {"times_s": v}} for k, v in times.items()]
    methods[-1]["decoded_tokens_updated"] = share
    return {"runs": [{"mode": "decode", "batch": 1, "new_tokens": 8, "methods": methods}]}


def test_the_summary_quotes_compare_and_pairs_decode_rounds(tmp_path):
    d = tmp_path / "tiny"
    (d / "compare-0.2").mkdir(parents=True)
    (d / "compare-0.2" / "compare.json").write_text(json.dumps({
        "windows": {"a": 4, "b": 4}, "seq_len": 32,
        "worst_domain": [{"method": "router-searched-causal", "vs": "sleb", "worst_dataset": "b", "datasets": ["a", "b"],
                          "ratio": 0.9, "ci95": [0.8, 1.05], "verdict": "no difference"}]}))
    # the causal row takes 0.8 of SLEB's time in every round: faster
    times = {"dense": [1.0, 1.1, 1.0, 1.2, 1.0], "sleb": [0.8, 0.9, 0.8, 0.9, 0.8],
             "router-searched-causal": [0.64, 0.72, 0.64, 0.72, 0.64]}
    (d / "bench-decode-0.2-b1-n8.json").write_text(json.dumps(_bench(times, 0.3)))
    text = summarize(tmp_path)
    assert "worst-domain ratio to SLEB 0.900 [0.800, 1.050] on b: no difference" in text
    row = next(line for line in text.splitlines() if line.startswith("| batch 1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].startswith("1.250x") and cells[1].endswith("faster")  # SLEB's time / the causal row's
    assert cells[3].endswith("faster") and cells[4] == "0.300"
    # slower when every round is: the causal row at 1.5x SLEB's time
    times["router-searched-causal"] = [t * 1.5 for t in times["sleb"]]
    (d / "bench-decode-0.2-b1-n8.json").write_text(json.dumps(_bench(times, 0.3)))
    row = next(line for line in summarize(tmp_path).splitlines() if line.startswith("| batch 1"))
    assert row.split("|")[2].strip().endswith("slower")


def test_the_answer_cannot_call_a_loss_a_win():
    from orthorank.harness.reports.decode_router import NO, UNDECIDED, YES, answer

    assert answer("lower everywhere", "level") == YES
    assert answer("lower everywhere", "faster") == YES
    # better quality bought with speed: slower than SLEB is a no, whatever the perplexity
    assert answer("lower everywhere", "slower") == NO
    assert answer("higher somewhere", "faster") == NO
    # an interval across 1 decides nothing, and neither does a speed never measured
    assert answer("no difference", "faster") == UNDECIDED
    assert answer("lower everywhere", None) == UNDECIDED
    assert answer("lower everywhere", "unresolved") == UNDECIDED


def test_a_wide_interval_across_1_is_not_level():
    """SmolLM2-135M at 10%, first bench: 0.967 [0.716, 1.181] reached 1, which the first rule called level and so a
    yes, though the plan may have been 28% slower than SLEB."""
    from orthorank.harness.reports.decode_router import Speed

    assert Speed(0.967, 0.716, 1.181).verdict == "unresolved"
    assert Speed(0.99, 0.95, 1.04).verdict == "level"
    assert Speed(0.9, 0.85, 0.99).verdict == "slower" and Speed(1.1, 1.01, 1.2).verdict == "faster"


def test_the_summary_states_the_answer(tmp_path):
    d = tmp_path / "tiny"
    (d / "compare-0.1").mkdir(parents=True)
    (d / "compare-0.1" / "compare.json").write_text(json.dumps({
        "windows": 4, "seq_len": 32,
        "worst_domain": [{"method": "router-causal", "vs": "sleb", "worst_dataset": "a", "datasets": ["a"],
                          "ratio": 0.7, "ci95": [0.6, 0.8], "verdict": "lower everywhere"}]}))
    times = {"dense": [1.0] * 5, "sleb": [0.8, 0.82, 0.8, 0.81, 0.8], "router-causal": [1.0, 1.02, 1.0, 1.01, 1.0]}
    (d / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(times, 0.2)))
    assert "at SLEB's batch-1 decode speed: **no**" in summarize(tmp_path)  # better, but slower than SLEB
    times["router-causal"] = [0.79, 0.83, 0.8, 0.8, 0.81]
    (d / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(times, 0.2)))
    assert "at SLEB's batch-1 decode speed: **yes**" in summarize(tmp_path)


def test_the_summary_gives_fitting_time_and_says_where_the_router_was_forced(tmp_path):
    d = tmp_path / "tiny"
    (d / "compare-0.1").mkdir(parents=True)

    def plan(router_nll: float) -> dict:
        return {"provenance": {"search_seconds": 10.0, "thresholds_fit": {"seconds": 3.0},
                               "router_fit": {"seconds": 20.0, "kept": "router",
                                              "held_out_nll": {"orthogonal": 4.0, "router": router_nll}}}}

    def write(router_nll: float) -> str:
        (d / "compare-0.1" / "compare.json").write_text(json.dumps({
            "windows": 4, "seq_len": 32, "plans": [{"provenance": {}}, plan(router_nll)],
            "worst_domain": [{"method": "router-searched-causal", "vs": "sleb", "worst_dataset": "a",
                              "datasets": ["a"], "ratio": 0.9, "ci95": [0.8, 0.95], "verdict": "lower everywhere"}]}))
        return summarize(tmp_path)

    text = write(4.1)  # the paper's rule had the lower held-out NLL: kept only because forced
    assert "layer search 10 s, router 20 s, thresholds 3 s" in text and "router was forced" in text
    assert "router was forced" not in write(3.9)


def test_a_replicate_can_take_a_win_away_but_never_give_one(tmp_path):
    """A second run of a bench (replicate/) is shown as its own row, and the answer needs every batch-1 run level or
    faster: a yes from the first run and an unresolved replicate is not decided; a replicate cannot turn an
    unresolved first run into a yes."""
    from orthorank.harness.reports.decode_router import combined_speed

    d = tmp_path / "tiny"
    (d / "compare-0.1").mkdir(parents=True)
    (d / "replicate").mkdir()
    (d / "compare-0.1" / "compare.json").write_text(json.dumps({
        "windows": 4, "seq_len": 32,
        "worst_domain": [{"method": "router-causal", "vs": "sleb", "worst_dataset": "a", "datasets": ["a"],
                          "ratio": 0.7, "ci95": [0.6, 0.8], "verdict": "lower everywhere"}]}))
    level = {"dense": [1.0] * 5, "sleb": [0.8, 0.82, 0.8, 0.81, 0.8], "router-causal": [0.79, 0.83, 0.8, 0.8, 0.81]}
    wide = {"dense": [1.0] * 5, "sleb": [0.8] * 5, "router-causal": [0.7, 1.0, 0.75, 0.95, 0.9]}
    (d / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(level, 0.2)))
    assert "at SLEB's batch-1 decode speed: **yes**" in summarize(tmp_path)
    (d / "replicate" / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(wide, 0.2)))
    text = summarize(tmp_path)
    assert "at SLEB's batch-1 decode speed: **not decided**" in text
    assert sum(line.startswith("| batch 1") for line in text.splitlines()) == 2 and "rounds, replicate" not in text
    assert "| batch 1, 8 new tokens, replicate |" in text
    (d / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(wide, 0.2)))
    (d / "replicate" / "bench-decode-0.1-b1-n8.json").write_text(json.dumps(_bench(level, 0.2)))
    assert "at SLEB's batch-1 decode speed: **not decided**" in summarize(tmp_path)
    assert combined_speed(["faster", "level"]) == "level" and combined_speed(["faster", "slower"]) == "slower"
    assert combined_speed(["faster", "faster"]) == "faster" and combined_speed([]) is None


def test_the_study_stage_refuses_a_forced_router_made_on_other_layers(tmp_path):
    """studies/decode-router/run.sh once wrote router-forced-0.1.json on the searched plan's layers, the name the
    study's stage gives its own router forced on OrthoRank's layers: reused, it would answer for the wrong plan."""
    import pytest

    from orthorank.errors import UserError
    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.decode_router import _causal_plan_calls

    ctx = StudyContext(model="tiny", model_name="tiny", out=tmp_path / "out", budget=get_budget("test"),
                       model_options={"model": "tiny"}, data_dir=None, store=None, plans_root=tmp_path)
    ctx.plans_dir.mkdir(parents=True)

    def plan(name: str, layers: list[int], policy: str) -> None:
        (ctx.plans_dir / name).write_text(json.dumps({"layers": layers, "selection": {"policy": policy}}))

    plan("orthorank-0.1.json", [2, 3], "orthogonal")
    plan("router-0.1.json", [2, 3], "orthogonal")  # the fit declined the router: the stage forces one
    plan("router-forced-0.1.json", [2, 4], "router")
    with pytest.raises(UserError, match=r"router-forced-0.1.json selects in layers \[2, 4\], not in router-0.1"):
        _causal_plan_calls(ctx, "0.1")
    plan("router-forced-0.1.json", [2, 3], "router")  # its own: reused, only the thresholds are fitted
    assert [type(c).__name__ for c in _causal_plan_calls(ctx, "0.1")] == ["FitThresholdsOptions"]
    plan("router-causal-0.1.json", [3], "router")
    with pytest.raises(UserError, match="router-causal-0.1.json selects in layers"):
        _causal_plan_calls(ctx, "0.1")


def test_compiled_decoding_rows_pair_within_an_implementation_and_give_compiles_gain(tmp_path):
    from orthorank.harness.reports.decode_router import compile_lines

    def run(impl: str, scale: float) -> dict:
        times = {"dense": [1.0, 1.1, 1.0], "sleb": [0.8, 0.9, 0.8], "router-causal": [0.8, 0.9, 0.8]}
        return {"mode": "decode", "decode_impl": impl, "batch": 1, "seq_len": 32, "new_tokens": 8, "repeats": 3,
                "methods": [{"method": k, "timing": {"times_s": [t * scale for t in v],
                                                     "median_s": sorted(v)[1] * scale}} for k, v in times.items()]}

    d = tmp_path / "tiny" / "compile"
    d.mkdir(parents=True)
    (d / "bench-decode-0.2-b1-n8.json").write_text(json.dumps({"sparsity": 0.2, "runs": [run("eager", 1.0),
                                                                                          run("compile", 0.8)]}))
    lines = compile_lines(tmp_path / "tiny", "tiny")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in lines if line.startswith("| ")}
    assert "1.000x [1.000, 1.000] level" in rows[("compile", "router-causal")]  # as fast as SLEB in every round
    assert rows[("compile", "dense")].endswith("| 1.250x |") and rows[("eager", "sleb")].endswith("| - |")


def test_long_context_answers_pair_the_causal_row_item_by_item(tmp_path):
    from orthorank.harness.reports.decode_router import longctx_lines

    keys = [f"001024/niah_single/{i:04d}" for i in range(20)]
    items = {"dense": {k: {"score": 1.0} for k in keys},
             "router 0.2 (dense decode)": {k: {"score": float(i % 2)} for i, k in enumerate(keys)},
             "router-causal 0.2 (causal decode)": {k: {"score": 0.0} for k in keys}}
    rows = [{"name": n, "decode": "causal" if "causal decode" in n else None} for n in items]
    d = tmp_path / "tiny" / "longctx-0.2-1k-s20"
    d.mkdir(parents=True)
    (d / "longctx.json").write_text(json.dumps({"items": items, "rows": rows, "sparsity": 0.2, "lengths": [1024],
                                                "tasks": ["niah_single"]}))
    lines = longctx_lines(tmp_path / "tiny", "tiny")
    row = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ")}
    assert "| 100.0 [100.0, 100.0] | -100.0 [-100.0, -100.0] **" in row["dense"]  # lost every item dense solved
    assert row["router 0.2 (dense decode)"].split("|")[3].strip().startswith("-50.0")
    assert row["router-causal 0.2 (causal decode)"].endswith("| - |")
