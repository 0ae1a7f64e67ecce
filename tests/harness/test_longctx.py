"""Long inputs: LongBench metrics against hand-computed values, truncation, the offline suite's generator and
scorer, `generate` and `longctx`/`longbench` bad input, and batched generation equal to single prompts."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_user_error, run_cli
from orthorank.errors import UserError
from orthorank.harness.evaluation import longbench as lb
from orthorank.harness.evaluation.longctx_suite import SuiteBuilder, TASKS, parse_lengths, parse_tasks, score


# -- metrics, by hand ------------------------------------------------------------------------------------------------

def test_qa_f1_by_hand():
    assert lb.normalize_answer("The  Cat, sat!") == "cat sat"
    # pred tokens [cat, sat, on, mat], truth [cat, is, on, mat]: overlap 3, P = R = 3/4, F1 = 0.75
    assert lb.qa_f1_score("The cat sat on the mat.", "a cat is on the mat") == pytest.approx(0.75)
    assert lb.qa_f1_score("dog", "cat") == 0.0


def test_rouge_l_by_hand():
    # LCS of [the cat sat on the mat] and [the cat is on the mat] = 5; P = R = 5/6; F = 5/6
    assert lb.rouge_score("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    assert lb.rouge_score("", "anything") == 0.0


def test_classification_retrieval_count_code_by_hand():
    classes = ["Location", "Description", "Entity"]
    assert lb.classification_score("Type: Location", "Location", all_classes=classes) == 1.0
    assert lb.classification_score("Location or Entity", "Location", all_classes=classes) == 0.5
    assert lb.classification_score("Entity", "Location", all_classes=classes) == 0.0
    assert lb.retrieval_score("Paragraph 3, not 4", "Paragraph 3") == 0.5
    assert lb.retrieval_score("no digits", "Paragraph 3") == 0.0
    assert lb.count_score("I count 7 paragraphs, 7 in all", "7") == 1.0
    assert lb.count_score("7 or 8", "7") == 0.5
    # first line without `, #, //: "x = 1" against "x = 2": Indel similarity 4/5 = 0.8
    assert lb.code_sim_score("# comment\nx = 1\ny", "x = 2") == pytest.approx(0.8)


def test_first_line_scoring_and_best_answer():
    assert lb.score_prediction("triviaqa", "Paris\nand more text", ["Paris"], None) == 1.0
    assert lb.score_prediction("narrativeqa", "Paris\nand more", ["Paris"], None) == pytest.approx(2 / 4)
    assert lb.score_prediction("hotpotqa", "blue", ["red", "blue"], None) == 1.0
    assert lb.length_bucket(3999) == "0-4k" and lb.length_bucket(4000) == "4-8k" and lb.length_bucket(8000) == "8k+"
    with pytest.raises(UserError, match="unknown LongBench task"):
        lb.metric_of("sudoku")
    with pytest.raises(UserError, match="Chinese"):
        lb.metric_of("dureader")


class CharTokenizer:
    """One token per character, for truncation tests."""

    chat_template = None
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return type("Enc", (), {"input_ids": [ord(c) for c in text]})()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_middle_truncation_keeps_first_and_last_halves():
    assert lb.middle_truncate(list(range(10)), 4) == [0, 1, 8, 9]
    assert lb.middle_truncate([1, 2], 4) == [1, 2]
    task = lb.LongBenchTask("qmsum", "qmsum", [], "{context}|{input}", 512)
    ids = lb.build_prompt_ids(CharTokenizer(), task, {"context": "abcdefghij", "input": "Q"}, 6, chat=True)
    assert "".join(map(chr, ids)) == "abcQ"[:0] + "abc" + "j|Q"  # first 3 and last 3 characters of "abcdefghij|Q"


def test_longbench_files(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/dataset2prompt.json").write_text(json.dumps({"trec": "{context}\n{input}"}))
    (tmp_path / "config/dataset2maxlen.json").write_text(json.dumps({"trec": 64}))
    good = {"input": "q", "context": "c", "answers": ["Location"], "length": 10, "all_classes": ["Location"]}
    (tmp_path / "trec.jsonl").write_text(json.dumps(good) + "\n")
    task = lb.load_task(tmp_path, "trec")
    assert task.max_new_tokens == 64 and len(task.rows) == 1
    bad = dict(good)
    del bad["answers"]
    (tmp_path / "trec_e.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(UserError, match="missing field"):
        lb.load_task(tmp_path, "trec_e")
    with pytest.raises(UserError, match="not found"):
        lb.load_task(tmp_path, "qasper")


def test_longbench_caption_says_when_it_is_a_slice(tmp_path):
    from orthorank.harness.api.longctx import _longbench_scope

    (tmp_path / "config").mkdir()
    (tmp_path / "config/dataset2prompt.json").write_text(json.dumps({"trec": "{context}\n{input}"}))
    (tmp_path / "config/dataset2maxlen.json").write_text(json.dumps({"trec": 64}))
    row = {"input": "q", "context": "c", "answers": ["Location"], "length": 10, "all_classes": ["Location"]}
    (tmp_path / "trec.jsonl").write_text((json.dumps(row) + "\n") * 3)
    assert _longbench_scope(tmp_path, [lb.load_task(tmp_path, "trec", limit=2)]) == \
        "trec: first 2 of 3 examples (a slice)"
    assert _longbench_scope(tmp_path, [lb.load_task(tmp_path, "trec")]) == "trec: all 3"


@pytest.mark.data
def test_shared_longbench_file_loads():
    from orthorank.harness.evaluation.data import find_data_dir

    task = lb.load_task(find_data_dir() / "longbench", "multi_news", limit=3)
    assert task.max_new_tokens == 512 and len(task.rows) == 3 and lb.metric_of(task.name) == "rouge"


# -- the offline suite ---------------------------------------------------------------------------------------------

def _pools():
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))) for _ in range(3000)]
    sents = [" ".join(rng.choice(words) for _ in range(8)).capitalize() + "." for _ in range(400)]
    return {"a": sents, "b": sents[::-1]}


class WordTokenizer(CharTokenizer):
    def __call__(self, text, add_special_tokens=True):
        if isinstance(text, list):
            return type("Enc", (), {"input_ids": [t.split() for t in text]})()
        return type("Enc", (), {"input_ids": text.split()})()


@pytest.mark.parametrize("task", TASKS)
def test_suite_generator_is_deterministic_fits_and_hides_the_answers(task):
    b1, b2 = SuiteBuilder(WordTokenizer(), _pools(), seed=3), SuiteBuilder(WordTokenizer(), _pools(), seed=3)
    s1, s2 = b1.sample(task, 1024, 5), b2.sample(task, 1024, 5)
    assert s1.prompt == s2.prompt and s1.answers == s2.answers
    assert s1.meta["prompt_tokens"] <= 1024 - s1.max_new_tokens and s1.meta["prompt_tokens"] > 600
    assert all(a in s1.prompt for a in s1.answers)
    assert b1.sample(task, 1024, 6).prompt != s1.prompt
    assert SuiteBuilder(WordTokenizer(), _pools(), seed=4).sample(task, 1024, 5).prompt != s1.prompt
    assert score(" " + ", ".join(s1.answers) + ".", s1.answers) == 1.0
    assert score(" " + ", ".join(s1.answers[:-1]), s1.answers) == 0.0


def test_suite_parsing():
    assert parse_lengths("1k,2k,4096") == [1024, 2048, 4096]
    with pytest.raises(UserError, match="unknown length"):
        parse_lengths("3q")
    with pytest.raises(UserError, match="unknown task"):
        parse_tasks("niah_single,sudoku")


# -- generation ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lm(tiny_hf_folder):
    from orthorank.models.loading import load_model

    return load_model(str(tiny_hf_folder), device="cpu")


def test_padded_batch_generation_equals_single_prompts(tiny_lm):
    from orthorank.harness.evaluation.generation import generate_rows
    from orthorank.method.apply import apply_orthorank, restore_dense
    from orthorank.method.selection import SelectionConfig

    rows = [tiny_lm.tokenizer("A long prompt about the sink and the tokens around it").input_ids,
            tiny_lm.tokenizer("Short one").input_ids]
    # generation runs on a static cache whose 4-D masks `generate` builds: padding is read from them
    for setup in ("dense", "orthorank", "threshold"):
        restore_dense(tiny_lm.model)
        if setup != "dense":
            apply_orthorank(tiny_lm.model, [1, 2], SelectionConfig(ratio=0.4, decode="dense" if setup == "orthorank"
                                                                   else "threshold"))
        batched, timing = generate_rows(tiny_lm, rows, 8)
        singles = [generate_rows(tiny_lm, [r], 8)[0][0] for r in rows]
        assert batched == singles and timing["time_to_first_token_s"] > 0
    restore_dense(tiny_lm.model)


def test_compiled_generation_equals_eager(tiny_lm, capsys):
    from orthorank.harness.evaluation.generation import generate_rows
    from orthorank.method.apply import apply_orthorank, restore_dense
    from orthorank.method.selection import SelectionConfig
    from orthorank.models.static_decode import compile_available

    rows = [tiny_lm.tokenizer("A long prompt about the sink and the tokens around it").input_ids,
            tiny_lm.tokenizer("Short one").input_ids]
    for setup in ("dense", "orthorank"):
        restore_dense(tiny_lm.model)
        if setup != "dense":
            apply_orthorank(tiny_lm.model, [1, 2], SelectionConfig(ratio=0.4))
        eager, timing = generate_rows(tiny_lm, rows, 6)
        compiled, ctiming = generate_rows(tiny_lm, rows, 6, compile=True)
        assert compiled == eager and timing["decode_impl"] == "eager"
        expected = "eager" if compile_available(next(tiny_lm.model.parameters()).device) else "compile"
        assert ctiming["decode_impl"] == expected
    restore_dense(tiny_lm.model)


def test_generate_cli_bad_input(capsys, tmp_path, tiny_hf_folder):
    m = ["--model", str(tiny_hf_folder)]
    assert_user_error(capsys, "prompt is empty", "generate", *m, "--prompt", "  ")
    assert_user_error(capsys, "does not exist", "generate", *m, "--file", str(tmp_path / "nope.txt"))
    code, out, err = run_cli(capsys, "generate", *m, "--prompt", "Hello there", "--max-new-tokens", "4")
    assert code == 0 and "time to first token" in err
    assert "memory-bandwidth bound" in err or "n/a (one new token)" in err  # the bound beside the decode figure
    code, out, err = run_cli(capsys, "generate", *m, "--prompt", "Hello there", "--max-new-tokens", "4", "--compile")
    assert code == 0 and ("compile)" in err or "decoding eagerly" in err)


def test_longctx_cli_bad_input(capsys, tiny_hf_folder, tmp_path):
    m = ["--model", str(tiny_hf_folder), "--methods", "dense", "--out", str(tmp_path / "o")]
    assert_user_error(capsys, "unknown task", "longctx", *m, "--tasks", "sudoku")
    assert_user_error(capsys, "unknown length", "longctx", *m, "--lengths", "9z")
    assert_user_error(capsys, "missing field", "longbench", *m, "--data-dir", str(_bad_longbench(tmp_path)))


@pytest.mark.data  # the suite reads its haystack text before it loads the model, whose context decides this
def test_longctx_cli_length_beyond_the_context(capsys, tiny_hf_folder, tmp_path):
    m = ["--model", str(tiny_hf_folder), "--methods", "dense", "--out", str(tmp_path / "o")]
    assert_user_error(capsys, "exceed the model's context", "longctx", *m, "--lengths", "1k")


def _bad_longbench(tmp_path):
    d = tmp_path / "lb"
    (d / "config").mkdir(parents=True)
    (d / "config/dataset2prompt.json").write_text(json.dumps({"qasper": "{context}{input}"}))
    (d / "config/dataset2maxlen.json").write_text(json.dumps({"qasper": 8}))
    (d / "qasper.jsonl").write_text(json.dumps({"input": "q", "context": "c", "length": 3}) + "\n")
    return d


def test_tables_pair_orthorank_with_the_pruning_row():
    """Besides the differences to dense, each OrthoRank row is paired item by item with each pruning row."""
    from orthorank.harness.api.longctx import _tables
    from orthorank.harness.evaluation.longctx import Row

    rows = [Row("dense", "dense", None, None), Row("sleb 0.2", "sleb", 0.2, None),
            Row("orthorank 0.2", "orthorank", 0.2, None)]  # plans play no part in the tables
    keys = [f"t/{i:03d}" for i in range(40)]
    results = {"dense": {k: {"score": 1.0} for k in keys}, "sleb 0.2": {k: {"score": 0.0} for k in keys},
               "orthorank 0.2": {k: {"score": float(i % 2)} for i, k in enumerate(keys)}}
    text, summary = _tables(rows, results, lambda k: k.split("/")[0], ["t"], "title", "dense")
    assert "Paired difference to sleb 0.2" in text
    d = summary["paired"]["orthorank 0.2 vs sleb 0.2"]["t"]
    assert d["value"] == 50.0 and d["excludes_zero"]
    assert summary["orthorank 0.2"]["t"]["diff"]["value"] == -50.0


# -- global spans of local attention under generate (issue 55) -------------------------------------------------------

def _local_plan_file(tiny_lm, tmp_path, **spans):
    import dataclasses

    from orthorank.method.cost import Arch
    from orthorank.method.local_attention import LocalAttention
    from orthorank.method.plan import Plan

    plan = Plan("local", [1, 2, 3], tiny_lm.name, tiny_lm.signature(),
                attention=LocalAttention(window=8, sinks=2, block=8, **spans),
                arch=dataclasses.asdict(Arch.from_config(tiny_lm.config, tiny_lm.num_layers)))
    path = tmp_path / "local.json"
    plan.save(path, overwrite=True)
    return plan, path


QUESTION_FIRST = ("Question: what is the special magic number for harbor? Read the report below and answer. "
                  + "The grass is green. The sky is blue. " * 12 + "One of the special magic numbers for harbor is: "
                  "4417. " + "Here we go. There and back again. " * 10 + "Answer:")


def test_left_padded_batches_with_global_spans_equal_single_prompts_under_generate(tiny_lm, tmp_path):
    """A question before the document (read by every query through the head) and a question longer than the tail:
    batched with left padding, the generated tokens equal each prompt's own."""
    from orthorank.harness.evaluation.generation import generate_rows
    from orthorank.method.apply import apply_plan, restore_dense

    question = tiny_lm.tokenizer(QUESTION_FIRST).input_ids
    long_question = tiny_lm.tokenizer("Some text about the sink. " * 10 + "Question: " + "which token is first? " * 6
                                      ).input_ids
    plan, _ = _local_plan_file(tiny_lm, tmp_path, head=20, tail=4)
    assert len(question) > 60 and len(long_question) - len("Question: ") > 4 * 4  # the question outgrows the tail
    dense = generate_rows(tiny_lm, [question], 6)[0][0]
    apply_plan(tiny_lm.model, plan)
    try:
        batched, _ = generate_rows(tiny_lm, [question, long_question], 6)
        singles = [generate_rows(tiny_lm, [r], 6)[0][0] for r in (question, long_question)]
    finally:
        restore_dense(tiny_lm.model)
    assert batched == singles
    assert len(batched[0]) == 6 and isinstance(dense, list)


def test_generate_sets_global_spans_and_refuses_them_without_local_attention(capsys, tmp_path, tiny_hf_folder, tiny_lm):
    m = ["--model", str(tiny_hf_folder)]
    _, path = _local_plan_file(tiny_lm, tmp_path)
    code, out, err = run_cli(capsys, "generate", *m, "--plan", str(path), "--prompt", QUESTION_FIRST,
                             "--max-new-tokens", "2", "--global-head", "24", "--global-tail", "8")
    assert code == 0 and "the first 24 tokens read by every query, the last 8 reading every key" in err
    assert_user_error(capsys, "local attention's spans", "generate", *m, "--prompt", "Hello", "--global-head", "8")
    assert_user_error(capsys, "0 or more", "generate", *m, "--prompt", "Hello", "--global-tail", "-1")
