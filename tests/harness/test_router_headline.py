"""The README's router table is computed from the comparison files: a router that loses to SLEB is shown losing."""

import json


def _compare(folder, rows, model="m"):
    folder.mkdir(parents=True)
    (folder / "compare.json").write_text(json.dumps({
        "model": model, "windows": {"wikitext2": 16}, "skip_windows": 32, "seq_len": 512, "datasets": ["wikitext2"],
        "dtype": "torch.bfloat16", "rows": [],
        "worst_domain": [{"method": m, "level": lv, "worst_dataset": "wikitext2", "ratio": r, "ci95": ci,
                          "verdict": v} for m, lv, r, ci, v in rows]}))


def test_the_router_headline_reads_each_verdict_and_the_best_other_method(tmp_path, monkeypatch):
    from orthorank.harness.study.router_headline import headline

    monkeypatch.chdir(tmp_path)  # no committed plans here: no fit counts as declined
    folder = tmp_path / "studies" / "m"
    _compare(folder / "compare", [("router", 0.1, 0.95, [0.93, 0.97], "lower everywhere"),
                                  ("router", 0.2, 1.05, [1.01, 1.09], "higher somewhere"),
                                  ("orthorank", 0.2, 1.10, [1.05, 1.15], "higher somewhere"),
                                  ("shortgpt", 0.2, 1.02, [0.98, 1.06], "no difference")])
    _compare(folder / "searched" / "compare", [("router-searched", 0.2, 0.99, [0.95, 1.03], "no difference")])
    text = headline([folder])
    assert "windows 33-48 of 512 tokens" in text
    assert "| m | 0.1 | **0.950 [0.930, 0.970]** lower everywhere | - | - | - |" in text
    assert ("| m | 0.2 | **1.050 [1.010, 1.090]** higher somewhere | 0.990 [0.950, 1.030] no difference | - | "
            "shortgpt: 1.020 [0.980, 1.060] |") in text


def test_a_declined_fit_shows_the_paper_rules_row(tmp_path, monkeypatch):
    from orthorank.harness.study.router_headline import headline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plans" / "m").mkdir(parents=True)
    (tmp_path / "plans" / "m" / "router-0.1.json").write_text(
        json.dumps({"provenance": {"router_fit": {"kept": "orthogonal"}}}))
    folder = tmp_path / "studies" / "m"
    _compare(folder / "compare", [("router", 0.1, 0.99, [0.95, 1.03], "no difference"),
                                  ("orthorank", 0.1, 0.90, [0.85, 0.95], "lower everywhere")])
    assert "| m | 0.1 | **0.900 [0.850, 0.950]** lower everywhere (fit declined: the paper's rule) |" in headline([folder])
