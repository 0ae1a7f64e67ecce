"""Zero-shot through lm-evaluation-harness: offline task data and converters, the `orthorank` backend against the
harness's own HF backend, run_zeroshot/format_table, plan lookup and the `orthorank zeroshot` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("lm_eval")

from orthorank.harness.cli.main import main  # noqa: E402
from orthorank.errors import UserError  # noqa: E402
from orthorank.harness.evaluation.data import find_data_dir  # noqa: E402
from cli_helpers import assert_user_error as _assert_user_error, run_cli  # noqa: E402
from orthorank.harness.evaluation.zeroshot import convert  # noqa: E402
from orthorank.harness.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS, TASKS, resolve_tasks  # noqa: E402
from orthorank.harness.evaluation.zeroshot.runner import format_table, run_zeroshot, task_manager  # noqa: E402
from orthorank.method.plan import Plan  # noqa: E402
from orthorank.method.plan_store import find_plan, plan_relpath  # noqa: E402

DATA = find_data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="the offline data folder ../shared/data is missing")
EXPECTED_SIZES = {"piqa": 1838, "winogrande": 1267, "hellaswag": 10042, "arc_easy": 2376, "arc_challenge": 1172,
                  "boolq": 3270, "openbookqa": 500, "lambada_openai": 5153}


def read_jsonl(rel):
    with (DATA / rel).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ------------------------------------------------------------------ converters, on hand-checked examples


def test_piqa_pairs_items_with_label_file():
    docs = convert.piqa_docs([{"goal": "g", "sol1": "a", "sol2": "b"}, {"goal": "h", "sol1": "c", "sol2": "d"}],
                             ["1\n", "0\n", ""])
    assert docs == [{"goal": "g", "sol1": "a", "sol2": "b", "label": 1},
                    {"goal": "h", "sol1": "c", "sol2": "d", "label": 0}]
    with pytest.raises(ValueError):
        convert.piqa_docs([{"goal": "g", "sol1": "a", "sol2": "b"}], ["0", "1"])
    with pytest.raises(ValueError):
        convert.piqa_docs([{"goal": "g", "sol1": "a", "sol2": "b"}], ["2"])


def test_winogrande_rebuilds_original_sentences():
    # WinoGrande dev items 1 and 3 (winogrande_xl validation), as the harness's source has them.
    doc = convert.winogrande_doc({
        "context_options": ["Sarah was a much better surgeon than Maria so Sarah",
                            "Sarah was a much better surgeon than Maria so Maria"],
        "continuation": "always got the easier cases.", "gold": 1})
    assert doc == {"sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.",
                   "option1": "Sarah", "option2": "Maria", "answer": "2"}
    row = {"context_options": ["They were worried the wine would ruin the bed and the blanket, but the blanket",
                               "They were worried the wine would ruin the bed and the blanket, but the bed"],
           "continuation": "was't ruined.", "gold": 1}
    doc = convert.winogrande_doc(row)
    assert doc == {"sentence": "They were worried the wine would ruin the bed and the blanket, but the _ was't ruined.",
                   "option1": "blanket", "option2": "bed", "answer": "2"}
    # The harness's own prompt functions give back the file's contexts, continuation and gold.
    from lm_eval.tasks.winogrande import preprocess_winogrande as wg

    assert wg.doc_to_choice(doc) == row["context_options"]
    assert wg.doc_to_target(doc) == row["continuation"]
    assert wg.doc_to_text(doc) == row["gold"]
    # A sentence that starts with the blank.
    doc = convert.winogrande_doc({"context_options": ["Tom", "Ann"], "continuation": "won.", "gold": 0})
    assert doc == {"sentence": "_ won.", "option1": "Tom", "option2": "Ann", "answer": "1"}


def test_hellaswag_text_format_matches_harness_processing_but_capitalization():
    # HellaSwag validation item 0. Original fields: activity_label "Roof shingle removal", ctx_a "A man is sitting
    # on a roof.", ctx_b "he", label "3"; the harness's query is "...on a roof. He" (ctx_b capitalized).
    endings = ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
               "starts pulling up roofing on a roof."]
    text = "\n".join(["Roof shingle removal: A man is sitting on a roof. he", "3", *endings]) + "\n"
    (doc,) = convert.hellaswag_docs(text)
    assert doc == {"query": "Roof shingle removal: A man is sitting on a roof. he", "choices": endings, "gold": 3,
                   "label": "3"}
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs

    original = {"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
                "endings": endings, "label": "3"}
    harness = process_docs(datasets.Dataset.from_list([original]))[0]
    assert harness["query"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert doc["choices"] == harness["choices"] and doc["gold"] == harness["gold"]
    assert doc["query"].lower() == harness["query"].lower()  # the one known difference
    # Leftover WikiHow tags are cleaned the harness's way.
    (doc,) = convert.hellaswag_docs("Home and Garden: [header] How to clean [title] Use soap.\n0\na\nb\nc\nd")
    assert doc["query"] == "Home and Garden: How to clean. Use soap."
    with pytest.raises(ValueError):
        convert.hellaswag_docs("ctx\n0\na\nb\nc")
    with pytest.raises(ValueError):
        convert.hellaswag_docs("ctx\n4\na\nb\nc\nd")


def test_arc_obqa_boolq_lambada_converters():
    arc = convert.arc_doc({"choices": ["safety goggles", "breathing mask", "rubber gloves", "lead apron"],
                           "query": "Question: Which piece of safety equipment is used to keep mold spores from "
                                    "entering the respiratory system?", "gold": 1})
    assert arc == {"question": "Which piece of safety equipment is used to keep mold spores from entering the "
                               "respiratory system?",
                   "choices": {"text": ["safety goggles", "breathing mask", "rubber gloves", "lead apron"],
                               "label": ["A", "B", "C", "D"]},
                   "answerKey": "B"}
    with pytest.raises(ValueError):
        convert.arc_doc({"choices": ["a", "b"], "query": "Which?", "gold": 0})
    with pytest.raises(ValueError):
        convert.arc_doc({"choices": ["a", "b"], "query": "Question: Which?", "gold": 2})

    obqa = convert.openbookqa_doc({"query": "Predators eat", "choices": ["lions", "humans", "bunnies", "grass"],
                                   "gold": 2})
    assert obqa == {"question_stem": "Predators eat",
                    "choices": {"text": ["lions", "humans", "bunnies", "grass"], "label": ["A", "B", "C", "D"]},
                    "answerKey": "C"}

    boolq = convert.boolq_doc({"query": "Passage: Persian (/ˈpɜːrʒən/) is one of the Western Iranian languages."
                                        "\nQuestion: do iran and afghanistan speak the same language?",
                               "choices": ["no", "yes"], "gold": 1})
    assert boolq == {"passage": "Persian (/ˈpɜːrʒən/) is one of the Western Iranian languages.",
                     "question": "do iran and afghanistan speak the same language", "label": 1}
    # A passage that itself holds "\nQuestion: " (one item of the file): the split is at the last one.
    two = convert.boolq_doc({"query": "Passage: Snakes.\nQuestion: which?\nMore text.\nQuestion: is it venomous?",
                             "choices": ["no", "yes"], "gold": 0})
    assert two == {"passage": "Snakes.\nQuestion: which?\nMore text.", "question": "is it venomous", "label": 0}
    with pytest.raises(ValueError):
        convert.boolq_doc({"query": "Question: x?", "choices": ["no", "yes"], "gold": 0})

    lam = convert.lambada_doc({"context": "I don't care about", "continuation": "signs"})
    assert lam == {"text": "I don't care about signs"}
    assert convert.lambada_doc({"context": "some kind", "continuation": "of\n\nPower"}) == {
        "text": "some kind of\n\nPower"}
    with pytest.raises(ValueError):
        convert.lambada_doc({"context": "a", "continuation": "two words"})


# -------------------------------------------------------------- the offline tasks, loaded through the harness


@pytest.fixture(scope="module")
def loaded_tasks():
    if DATA is None:
        pytest.skip("the offline data folder ../shared/data is missing")
    return task_manager(DATA).load([t.offline for t in TASKS.values()])["tasks"]


@needs_data
def test_each_task_loads_expected_number_of_examples(loaded_tasks):
    assert {TASKS[n].offline for n in ALL_TASKS} == set(loaded_tasks)
    for name, size in EXPECTED_SIZES.items():
        task = loaded_tasks[TASKS[name].offline]
        assert len(task.eval_docs) == size == TASKS[name].size, name
        assert task.config.metadata["data_dir"] == str(DATA)


@needs_data
def test_harness_prompts_rebuild_the_files_exactly(loaded_tasks):
    """The harness's prompt templates over our converted documents give back, item by item, the text the files
    hold (llm-foundry stores the harness's own formatting)."""

    def rendered(name):
        task = loaded_tasks[TASKS[name].offline]
        for doc in task.eval_docs:
            choices = task.doc_to_choice(doc) if task.config.doc_to_choice is not None else None
            yield task.doc_to_text(doc), choices, task.doc_to_target(doc)

    for name, rel in (("arc_easy", "arc_easy"), ("arc_challenge", "arc_challenge")):
        rows = read_jsonl(f"llm-foundry-icl/{rel}.jsonl")
        for row, (text, choices, target) in zip(rows, rendered(name), strict=True):
            assert (text, choices, target) == (row["query"] + "\nAnswer:", row["choices"], row["gold"])
    rows = read_jsonl("llm-foundry-icl/openbook_qa.jsonl")
    for row, got in zip(rows, rendered("openbookqa"), strict=True):
        assert got == (row["query"], row["choices"], row["gold"])
    rows = read_jsonl("llm-foundry-icl/boolq.jsonl")
    for row, got in zip(rows, rendered("boolq"), strict=True):
        assert got == (row["query"][len("Passage: "):] + "\nAnswer:", ["no", "yes"], row["gold"])
    rows = read_jsonl("llm-foundry-icl/winogrande.jsonl")
    for row, got in zip(rows, rendered("winogrande"), strict=True):
        assert got == (row["gold"], row["context_options"], row["continuation"])
    rows = read_jsonl("llm-foundry-icl/lambada_openai.jsonl")
    for row, (text, _, target) in zip(rows, rendered("lambada_openai"), strict=True):
        assert (text, target) == (row["context"], " " + row["continuation"])
    rows = read_jsonl("piqa/valid.jsonl")
    labels = (DATA / "piqa/valid-labels.lst").read_text().split()
    for row, lab, got in zip(rows, labels, rendered("piqa"), strict=True):
        assert got == (f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], int(lab))
    # HellaSwag: the label counts the data README gives.
    hs = loaded_tasks[TASKS["hellaswag"].offline]
    assert Counter(hs.doc_to_target(d) for d in hs.eval_docs) == {0: 2515, 1: 2485, 2: 2584, 3: 2458}


def test_task_names_and_missing_data(tmp_path):
    assert resolve_tasks("piqa, ARC_E,lambada") == ["piqa", "arc_easy", "lambada_openai"]
    assert resolve_tasks("main") == list(MAIN_TASKS) and resolve_tasks(["all"]) == list(ALL_TASKS)
    assert resolve_tasks("orthorank_hellaswag,hellaswag") == ["hellaswag"]
    with pytest.raises(UserError, match="unknown zero-shot task 'mmlu'"):
        resolve_tasks("piqa,mmlu")
    with pytest.raises(UserError, match="missing data file"):
        convert.task_docs("piqa", tmp_path)
    (tmp_path / "llm-foundry-icl").mkdir()
    (tmp_path / "llm-foundry-icl/openbook_qa.jsonl").write_text('{"query": "q", "choices": ["a"], "gold": 3}\n')
    with pytest.raises(UserError, match="item 1 is malformed"):
        convert.task_docs("openbookqa", tmp_path)


# ------------------------------------------------------------------------------------------- backend


REQUESTS = [
    ("Question: What do bees make?\nAnswer:", " honey"),
    ("Question: What do bees make?\nAnswer:", " concrete blocks"),
    ("The capital of France is", " Paris"),
    ("Once upon a time there was a little girl who lived in a village near the forest. Whenever she went out,",
     " she wore a red riding cloak."),
    ("A", " b"),
    ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."),
]


def loglikelihoods(backend, requests=REQUESTS):
    from lm_eval.api.instance import Instance

    return backend.loglikelihood([Instance("loglikelihood", {}, req, i) for i, req in enumerate(requests)],
                                 disable_tqdm=True)


@pytest.fixture(scope="module")
def tiny_lm(tiny_hf_folder):
    from orthorank.models.loading import load_model

    return load_model(str(tiny_hf_folder), device="cpu")


def test_backend_matches_harness_hf_backend_for_dense(tiny_hf_folder):
    from lm_eval.models.huggingface import HFLM

    from orthorank.harness.evaluation.zeroshot.backend import OrthoRankLM

    reference = HFLM(pretrained=str(tiny_hf_folder), device="cpu", batch_size=3, dtype="float32")
    ours = OrthoRankLM(model=str(tiny_hf_folder), device="cpu", batch_size=3)
    ref, got = loglikelihoods(reference), loglikelihoods(ours)
    for (lp_ref, greedy_ref), (lp, greedy) in zip(ref, got, strict=True):
        assert lp == pytest.approx(lp_ref, abs=1e-4)
        assert greedy == greedy_ref
    assert ours.plan.method == "dense" and ours.batch_size == 3


def test_orthorank_plan_batches_with_a_mask_and_equals_batch_size_one(tiny_lm):
    from lm_eval.models.huggingface import HFLM

    from orthorank.harness.evaluation.zeroshot.backend import OrthoRankLM
    from orthorank.method.apply import apply_plan, restore_dense

    dense = [lp for lp, _ in loglikelihoods(OrthoRankLM(tiny_lm, batch_size=4))]
    plan = Plan("orthorank", [1, 2], tiny_lm.name, tiny_lm.signature())
    one = [lp for lp, _ in loglikelihoods(OrthoRankLM(tiny_lm, plan=plan, batch_size=1))]
    ours = OrthoRankLM(tiny_lm, plan=plan, batch_size=4)
    assert ours.batch_size == 4
    got = [lp for lp, _ in loglikelihoods(ours)]
    assert max(abs(a - b) for a, b in zip(one, dense)) > 1e-3  # the plan is applied
    assert got == pytest.approx(one, abs=1e-4)  # padding changes nothing
    # Why the mask is needed: the harness alone right-pads rows and passes no mask, so OrthoRank would rank
    # padding tokens too. Scoring the same plan through plain HFLM with batches shows the change.
    apply_plan(tiny_lm.model, plan)
    try:
        padded = [lp for lp, _ in loglikelihoods(HFLM(pretrained=tiny_lm.model, tokenizer=tiny_lm.tokenizer,
                                                      batch_size=6))]
    finally:
        restore_dense(tiny_lm.model)
    assert max(abs(a - b) for a, b in zip(one, padded)) > 1e-4


def test_pruned_plan_batches_without_changing_scores(tiny_lm):
    from orthorank.harness.evaluation.zeroshot.backend import OrthoRankLM
    from orthorank.method.apply import restore_dense

    plan = Plan("prune", [1], tiny_lm.name, tiny_lm.signature())
    one = [lp for lp, _ in loglikelihoods(OrthoRankLM(tiny_lm, plan=plan, batch_size=1))]
    batched = OrthoRankLM(tiny_lm, plan=plan, batch_size=6)
    assert batched.batch_size == 6
    assert [lp for lp, _ in loglikelihoods(batched)] == pytest.approx(one, abs=1e-4)
    restore_dense(tiny_lm.model)


def test_backend_rejects_mismatched_plan(tiny_lm):
    from orthorank.harness.evaluation.zeroshot.backend import OrthoRankLM

    other = Plan("prune", [1], "another-model", tiny_lm.signature())
    with pytest.raises(UserError, match="made for model"):
        OrthoRankLM(tiny_lm, plan=other)


@needs_data
def test_run_zeroshot_returns_harness_metrics_and_restores_dense(tiny_lm):
    from orthorank.method.apply import selective
    from orthorank.models.adapters import get_adapter

    plan = Plan("orthorank", [1], tiny_lm.name, tiny_lm.signature())
    info = {}
    res = run_zeroshot(tiny_lm, plan, ["winogrande", "lambada"], limit=3, info=info)
    assert set(res) == {"winogrande", "lambada_openai"}
    assert set(res["winogrande"]) == {"acc", "acc_stderr"}
    assert {"acc", "perplexity"} <= set(res["lambada_openai"]) and res["lambada_openai"]["perplexity"] > 1
    assert all(0.0 <= r["acc"] <= 1.0 for r in res.values())
    assert info["examples"] == {"winogrande": 3, "lambada_openai": 3} and info["batch_size"] == 8
    assert all(selective(layer) is None for layer in get_adapter(tiny_lm.model).layers(tiny_lm.model))
    with pytest.raises(UserError, match="limit"):
        run_zeroshot(tiny_lm, plan, ["piqa"], limit=0)


@needs_data
def test_simple_evaluate_with_registered_backend_name(tiny_hf_folder):
    import lm_eval

    import orthorank.harness.evaluation.zeroshot.backend  # noqa: F401  registers "orthorank"

    out = lm_eval.simple_evaluate(model="orthorank", model_args=f"model={tiny_hf_folder},device=cpu",
                                  tasks=["orthorank_arc_easy"], limit=2, task_manager=task_manager(),
                                  log_samples=False)
    assert out["n-samples"]["orthorank_arc_easy"]["effective"] == 2
    assert 0.0 <= out["results"]["orthorank_arc_easy"]["acc,none"] <= 1.0
    assert out["config"]["orthorank_plan"]["method"] == "dense"


def test_format_table_like_the_paper():
    rows = {"Dense": {"piqa": {"acc": 0.5, "acc_norm": 0.25}, "winogrande": {"acc": 0.75}},
            "SLEB 20%": {"piqa": {"acc": 0.125}}}
    table = format_table(rows)
    lines = table.splitlines()
    assert lines[0] == "| Method | PIQA | WinoGrande | Mean |"
    assert lines[2] == "| Dense | 50.00 | 75.00 | 62.50 |"
    assert lines[3] == "| SLEB 20% | 12.50 | - | - |"
    norm = format_table(rows, metric="acc_norm", percent=False, digits=3).splitlines()
    assert norm[0] == "| Method | PIQA | WinoGrande* | Mean |" and norm[2] == "| Dense | 0.250 | 0.750 | 0.500 |"


def test_find_plan(tmp_path, monkeypatch):
    assert plan_relpath("smollm2-135m", "orthorank", 0.20).as_posix() == "plans/smollm2-135m/orthorank-0.2.json"
    assert plan_relpath("org/model", "sleb", 0.1).as_posix() == "plans/org/model/sleb-0.1.json"
    target = tmp_path / "plans" / "smollm2-135m" / "sleb-0.1.json"
    target.parent.mkdir(parents=True)
    target.write_text("{}")
    assert find_plan("smollm2-135m", "sleb", 0.1, roots=[tmp_path]) == target
    monkeypatch.chdir(tmp_path)
    assert find_plan("smollm2-135m", "sleb", 0.1).resolve() == target.resolve()
    with pytest.raises(UserError, match="orthorank calibrate"):
        find_plan("smollm2-135m", "sleb", 0.2, roots=[tmp_path])
    with pytest.raises(UserError):
        plan_relpath("../evil", "sleb", 0.1)


# ------------------------------------------------------------------------------------------- command line


def assert_user_error(capsys, fragment, *argv):
    _assert_user_error(capsys, fragment, *argv, prefix="orthorank zeroshot: error:")


@needs_data
def test_cli_limit_run_end_to_end(capsys, tiny_hf_folder, tmp_path):
    out_json = tmp_path / "zs.json"
    code, out, err = run_cli(capsys, "zeroshot", "--model", tiny_hf_folder, "--tasks", "piqa,arc_challenge",
                             "--limit", 3, "--json", out_json)
    assert code == 0, err
    assert "| Method | PIQA | ARC-c | Mean |" in out and "| dense |" in out
    body = json.loads(out_json.read_text())
    assert body["command"] == "zeroshot" and body["tasks"] == ["piqa", "arc_challenge"]
    assert body["examples"] == {"piqa": 3, "arc_challenge": 3} and body["limit"] == 3
    assert set(body["results"]["piqa"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert body["plan"]["method"] == "dense" and "environment" in body


@needs_data
def test_cli_saved_plan_by_method_and_sparsity(capsys, tiny_hf_folder, tiny_lm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = Plan("orthorank", [1, 2], tiny_lm.name, tiny_lm.signature(), target_sparsity=0.2)
    plan.save(tmp_path / plan_relpath(tiny_lm.name, "orthorank", 0.2))
    out_json = tmp_path / "o.json"
    code, out, err = run_cli(capsys, "zeroshot", "--model", tiny_hf_folder, "--method", "orthorank",
                             "--sparsity", 0.2, "--tasks", "winogrande", "--limit", 2, "--batch-size", 8,
                             "--json", out_json)
    assert code == 0, err
    body = json.loads(out_json.read_text())
    assert body["plan"]["layers"] == [1, 2] and body["batch_size"] == 8
    assert_user_error(capsys, "run `orthorank calibrate` first", "zeroshot", "--model", tiny_hf_folder,
                      "--method", "sleb", "--sparsity", 0.1)


@pytest.mark.data
def test_cli_bad_input_is_one_line_exit_2(capsys, tmp_path):
    assert_user_error(capsys, "unknown zero-shot task 'nope'", "zeroshot", "--tasks", "piqa,nope")
    assert_user_error(capsys, "missing data file", "zeroshot", "--data-dir", tmp_path, "--tasks", "piqa")
    assert_user_error(capsys, "does not exist", "zeroshot", "--data-dir", tmp_path / "none")
    assert_user_error(capsys, "needs --sparsity S (a saved plan), --plan FILE", "zeroshot", "--method", "shortgpt")
    assert_user_error(capsys, "not both", "zeroshot", "--method", "sleb", "--sparsity", "0.2", "--plan", "x.json")
    with pytest.raises(SystemExit) as exc:
        main(["zeroshot", "--limit", "0"])
    assert exc.value.code == 2
    assert "--limit: must be at least 1" in capsys.readouterr().err


@needs_data
def test_lm_eval_command_line_wrapper(tiny_hf_folder, tmp_path):
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "orthorank.harness.evaluation.zeroshot", "--model", "orthorank", "--device", "cpu",
         "--model_args", f"model={tiny_hf_folder},data_dir={DATA}", "--tasks", "orthorank_openbookqa",
         "--limit", "2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "openbookqa" in proc.stdout and "acc_norm" in proc.stdout


@pytest.mark.integration
@needs_data
def test_embedded_model_limit_run_through_cli(capsys, tmp_path):
    out_json = tmp_path / "smollm.json"
    code, out, err = run_cli(capsys, "zeroshot", "--model", "smollm2-135m", "--tasks", "winogrande,openbookqa",
                             "--limit", 4, "--json", out_json)
    assert code == 0, err
    body = json.loads(out_json.read_text())
    assert body["model"] == "smollm2-135m" and body["examples"] == {"winogrande": 4, "openbookqa": 4}
    assert all(0.0 <= body["results"][t]["acc"] <= 1.0 for t in ("winogrande", "openbookqa"))


@needs_data
def test_per_item_scorer_matches_the_harness_and_batches_exactly(tiny_lm):
    """The per-item scorer gives the harness's own accuracy (dense), and for an OrthoRank plan the same
    log-likelihoods at batch size 8 (right-padded with a mask) as at batch size 1."""
    from orthorank.harness.evaluation.compare import Row
    from orthorank.harness.evaluation.zeroshot.scoring import evaluate_zeroshot_rows, load_tasks, score_items
    from orthorank.method.apply import apply_plan, restore_dense

    dense = Plan("dense", [], tiny_lm.name, tiny_lm.signature())
    ours = evaluate_zeroshot_rows(tiny_lm, [Row("dense", 0.0, dense)], ["piqa", "arc_easy"], 12, None, None,
                                  batch_size=5, progress=False)[0]
    harness = run_zeroshot(tiny_lm, dense, ["piqa", "arc_easy"], limit=12, batch_size=1)
    for t in ("piqa", "arc_easy"):
        assert ours[t]["acc"].mean() == pytest.approx(harness[t]["acc"])
        assert ours[t]["acc_norm"].mean() == pytest.approx(harness[t]["acc_norm"])
    items = load_tasks(["hellaswag"], 10, None)["hellaswag"]
    plan = Plan("orthorank", [1, 2], tiny_lm.name, tiny_lm.signature())
    apply_plan(tiny_lm.model, plan)
    try:
        one = score_items(tiny_lm.model, tiny_lm.tokenizer, items, items.doc_ids, batch_size=1)
        eight = score_items(tiny_lm.model, tiny_lm.tokenizer, items, items.doc_ids, batch_size=8)
    finally:
        restore_dense(tiny_lm.model)
    for d in items.doc_ids:
        assert eight[d]["ll"] == pytest.approx(one[d]["ll"], abs=1e-4)
        assert eight[d]["acc"] == one[d]["acc"] and eight[d]["acc_norm"] == one[d]["acc_norm"]
