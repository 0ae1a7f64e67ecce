"""The RULER-grade offline suite (harness/evaluation/longctx_suite.py, ruler_tasks.py): the first five tasks' prompts are
unchanged, every task x layout x chat is deterministic, fits its length and hides its answers in the document
only; the layouts, the new tasks' answers, the yes/no scorer and BoolQ's harness/evaluation/calibration split."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

import pytest

from orthorank.errors import UserError
from orthorank.harness.evaluation.longctx_suite import (
    FIRST_CUE, LAYOUTS, MAX_NEW_TOKENS, RULER_TASKS, TASKS, Sample, SuiteBuilder, parse_layouts, parse_tasks,
    qa_split_rows, score, score_sample, suite_items,
)


class WordTokenizer:
    """One token per whitespace-separated word; `bos` adds "<s>" as a real tokenizer adds its BOS."""

    chat_template = None
    eos_token_id = 0

    def __init__(self, bos: bool = False) -> None:
        self.bos = bos

    def _ids(self, text, add_special_tokens):
        return (["<s>"] if self.bos and add_special_tokens else []) + text.split()

    def __call__(self, text, add_special_tokens=True):
        if isinstance(text, list):
            return type("Enc", (), {"input_ids": [self._ids(t, add_special_tokens) for t in text]})()
        return type("Enc", (), {"input_ids": self._ids(text, add_special_tokens)})()


class ChatTokenizer(WordTokenizer):
    """A tiny chat template that, like Gemma's, begins with the BOS text."""

    chat_template = "fake"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        assert not tokenize and add_generation_prompt
        return "<s> <|user|>\n" + messages[0]["content"].strip() + " <|end|>\n<|assistant|>\n"


def _pools():  # as tests/harness/test_longctx.py: the digests below were taken on these pools
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))) for _ in range(3000)]
    sents = [" ".join(rng.choice(words) for _ in range(8)).capitalize() + "." for _ in range(400)]
    return {"a": sents, "b": sents[::-1]}


def _boolq(n: int = 400) -> list[dict]:
    """BoolQ-like documents; every tenth passage repeats the one before it, as BoolQ asks several questions about
    some passages."""
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(500)]
    docs = []
    for i in range(n):
        passage = docs[-1]["passage"] if i % 10 == 9 else " ".join(rng.choice(words) for _ in range(60)) + "."
        docs.append({"passage": passage, "question": f"is question {i} true", "label": i % 3 != 0})
    return docs


def _builder(tok=None, seed: int = 3, split: str = "evaluation") -> SuiteBuilder:
    return SuiteBuilder(tok or ChatTokenizer(), _pools(), seed=seed, qa_rows=qa_split_rows(_boolq(), split))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- the first version's prompts -----------------------------------------------------------------------------------

# sha256 of (prompt, json answers), taken with the suite as it was before layouts and the RULER tasks existed
_BEFORE = {
    ("niah_single", 0): ("b08760b40c5afa72278605e1fb57198ad05349bf0c8a7f0466cb33a64aee3786",
                         "be712a5af48251a72c32b9dc21f57d554ae9b8debc0b4952230d6bb7845da7ee"),
    ("niah_single", 5): ("50bae99c1185b2c0860d2f83cea97631384825f3cf83b3b865a26c248c0ee6f4",
                         "1aa3ebdbefcf6a39e47bf4beb8bdfa465e8a519283aaef44f6f734f04c8fe9fc"),
    ("niah_multikey", 5): ("4ac4cbb7d261df715a1ed8fbff7719a4504cbd17b6b563eac452f1853db369f2",
                           "ad14a0eb61bb0d8941339c6e542a312ad1ae2075d8011490c9dd87cee5f5000c"),
    ("niah_multivalue", 5): ("5137837f2cd74ae8c1ed743dc4593b09cbc5b093eac99cfdaaa246e605a93a1a",
                             "a92991d9df0551a458f626f2a51248156d3d2a52bc8f9400d81cec3b9bd2b3d7"),
    ("variable_tracking", 0): ("e313495041abd254b219787d99cb1e9e58c9a21b5966a4183e2af858e885c545",
                               "067f3e8b685d8a4053cdc191ffbdd3d3e2ed6cf083993e1ae09083060f44ac17"),
    ("variable_tracking", 5): ("46952c5f69dd031fe43669cde7f15d90f54f34f3031967f87d7d5e8c1920d66a",
                               "9c59a3de279a64574edeb0d19c537b983799075da01bd0de250ac3379890ebce"),
    ("common_words", 0): ("889e2d08a2b6a45cc2c46c5a942cc13aeba851bfad03ba442271a39dd9e1de3d",
                          "88cd4c98cd5b0eae94495f3f42cbaf2f002229c276b93cc430e6c4ee28e4268d"),
    ("common_words", 5): ("da7d6d39177e9e8a49e5125fdfe56f7a93ed069148a587b6dcedd720290c7cc4",
                          "694c75f4e1526b4e93fdd5dd842ee05853b78205f1611d87c0afde5dc4d34622"),
}


@pytest.mark.parametrize("task,index", sorted(_BEFORE))
def test_first_version_prompts_are_unchanged(task, index):
    b = SuiteBuilder(WordTokenizer(), _pools(), seed=3)  # no qa rows, no chat template: as callers build it
    s = b.sample(task, 1024, index)
    assert (_digest(s.prompt), _digest(json.dumps(s.answers))) == _BEFORE[task, index]
    assert s == b.sample(task, 1024, index, layout="last", chat=False)
    assert s.ids == WordTokenizer()(s.prompt).input_ids and s.match == "all"


# -- every task x layout x chat ------------------------------------------------------------------------------------

def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9.]+", text))


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("task", RULER_TASKS)
def test_sample_is_deterministic_fits_and_hides_the_answers_in_the_document(task, layout, chat):
    length = 1024
    s1 = _builder(ChatTokenizer(bos=True)).sample(task, length, 5, layout, chat)
    s2 = _builder(ChatTokenizer(bos=True)).sample(task, length, 5, layout, chat)
    assert s1 == s2
    assert s1.ids == (ChatTokenizer(bos=True)(s1.prompt, add_special_tokens=not chat).input_ids)
    assert len(s1.ids) == s1.meta["prompt_tokens"] <= length - MAX_NEW_TOKENS[task] == length - s1.max_new_tokens
    assert len(s1.ids) > length * 0.6, "the document should fill most of the budget"
    assert s1.ids.count("<s>") == 1 and s1.ids[0] == "<s>"  # one BOS, from the tokenizer or from the template
    assert (s1.meta["layout"], s1.meta["chat"]) == (layout, chat)
    assert s1.meta["haystack"] in ("text", "noise", "needles", "words", "passages")
    start, end = s1.meta["doc_span"]
    doc, head, tail = s1.prompt[start:end], s1.prompt[:start], s1.prompt[end:]
    assert 0 < s1.meta["head_tokens"] <= 120 and s1.meta["tail_tokens"] > 0
    if s1.match == "all":
        assert all(a in doc for a in s1.answers)
        assert not set(s1.answers) & (_words(head) | _words(tail)), "an answer leaks outside the document"
        assert score_sample(s1, " " + ", ".join(s1.answers) + ".") == 1.0
        assert score_sample(s1, " " + ", ".join(s1.answers[:-1])) == 0.0
    else:
        assert s1.answers in (["yes"], ["no"]) and s1.meta["haystack"] == "passages"
    other = _builder(ChatTokenizer(bos=True)).sample(task, length, 6, layout, chat)
    assert other.prompt != s1.prompt
    assert _builder(ChatTokenizer(bos=True), seed=4).sample(task, length, 5, layout, chat).prompt != s1.prompt


def test_layouts_place_the_question_and_cue():
    b = _builder()
    for task in RULER_TASKS:
        last, first, long = (b.sample(task, 1024, 2, layout) for layout in LAYOUTS)
        # the generic instructions alone are over 100 tokens, and the same for every task
        assert long.meta["tail_tokens"] - last.meta["tail_tokens"] > 100
        assert first.prompt.endswith(FIRST_CUE) and first.prompt.endswith("Answer:")
        assert first.meta["tail_tokens"] <= 2
        q_end = first.meta["doc_span"][0]
        assert re.search(r"Question: |What ", first.prompt[:q_end]), "layout first asks before the document"
        assert "above" not in first.prompt[:q_end]
        chat = b.sample(task, 1024, 2, "last", chat=True)
        assert chat.ids[:2] == ["<s>", "<|user|>"] and chat.prompt.startswith("<s> <|user|>\n")
        generation = "<|assistant|>\n"
        cue = chat.prompt[chat.prompt.index(generation) + len(generation):]
        # the task's answer prefix follows the generation prompt, and only there
        assert cue.startswith(("The special magic", "Answer:")) and " ".join(cue.split()[:3]) in last.prompt
        assert cue not in chat.prompt[:chat.prompt.index(generation)]
        assert b.sample(task, 1024, 2, "first", chat=True).prompt.endswith("<|assistant|>\nAnswer:")


def test_chat_needs_a_template_and_layouts_parse():
    with pytest.raises(UserError, match="chat template"):
        SuiteBuilder(WordTokenizer(), _pools()).sample("niah_single", 1024, 0, chat=True)
    assert parse_layouts("last, first,long") == ["last", "first", "long"]
    with pytest.raises(UserError, match="unknown layout 'middle'"):
        parse_layouts("last,middle")
    with pytest.raises(UserError, match="unknown layout"):
        SuiteBuilder(WordTokenizer(), _pools()).sample("niah_single", 1024, 0, layout="middle")
    assert parse_tasks(",".join(RULER_TASKS)) == list(RULER_TASKS)
    assert set(TASKS) | {"qa"} >= set(RULER_TASKS)
    with pytest.raises(UserError, match="qa task needs BoolQ rows"):
        SuiteBuilder(WordTokenizer(), _pools()).sample("qa", 1024, 0)


def test_suite_items_cover_every_combination_in_order():
    b = _builder()
    items = suite_items(b, ["niah_single", "qa"], 512, 2, ["last", "first"], [False, True])
    assert len(items) == 2 * 2 * 2 * 2
    keys = [(s.task, s.meta["layout"], s.meta["chat"], s.index) for s in items]
    assert keys == [(t, lay, c, i) for t in ["niah_single", "qa"] for lay in ["last", "first"] for c in [False, True]
                    for i in range(2)]
    assert all(isinstance(s, Sample) for s in items)


# -- the new tasks' answers ----------------------------------------------------------------------------------------

def test_vt_hops_chains():
    b = _builder()
    for index in range(8):
        s = b.sample("vt_hops", 1024, index)
        hops = 1 + index % 4
        assert len(s.answers) == hops + 1 and s.meta["hops"] == hops and s.meta["haystack"] == "noise"
        doc = s.prompt[slice(*s.meta["doc_span"])]
        chain = [f"VAR {s.answers[0]} = {s.meta['value']}."] + [
            f"VAR {s.answers[i]} = VAR {s.answers[i - 1]}." for i in range(1, hops + 1)]
        positions = [doc.index(stmt) for stmt in chain]
        assert positions == sorted(positions)  # in order
        assert f"= {s.meta['distractor_value']}." in doc and len(re.findall(r"VAR \w+ = ", doc)) == 2 * (hops + 1)
        assert f", {hops + 1} variables are assigned" in s.prompt


def test_frequent_words_top_three_are_strictly_ahead():
    b = _builder()
    for index in range(4):
        s = b.sample("frequent_words", 1024 * (1 + index % 2), index)
        counts = Counter(w for w in s.prompt[slice(*s.meta["doc_span"])].split() if w != "....")
        ranked = counts.most_common()
        assert [w for w, _ in ranked[:3]] == s.answers
        assert ranked[2][1] > ranked[3][1]
        assert all(5 <= len(w) <= 7 and w.isalpha() and w.islower() for w in counts)


def test_niah_needles_and_multiquery():
    b = _builder()
    s = b.sample("niah_single_needles", 1024, 1)
    doc = s.prompt[slice(*s.meta["doc_span"])]
    keys = re.findall(r"numbers for (\S+) is", doc)
    numbers = re.findall(r"is: (\d{7})\.", doc)
    assert len(keys) == len(set(keys)) == len(numbers) == len(set(numbers)) == s.meta["needles"] > 30
    assert s.meta["key"] in keys and s.answers == [numbers[keys.index(s.meta["key"])]]
    assert not re.sub(r"One of the special magic numbers for \S+ is: \d{7}\.", "", doc).strip()
    s = b.sample("niah_multiquery", 1024, 1)
    doc = s.prompt[slice(*s.meta["doc_span"])]
    assert len(s.answers) == 2 and doc.count("special magic numbers for") == 4
    assert all(f"for {k} is: {v}." in doc for k, v in zip(s.meta["keys"], s.answers))
    assert " and ".join(s.meta["keys"]) in s.prompt[s.meta["doc_span"][1]:]
    s = b.sample("niah_single_noise", 1024, 1)
    doc = s.prompt[slice(*s.meta["doc_span"])]
    assert doc.startswith("The grass is green. The sky is blue.") or doc.startswith("One of the special")
    assert doc.count("special magic") == 1 and "There and back again." in doc


# -- qa ------------------------------------------------------------------------------------------------------------

def test_qa_split_is_disjoint_and_past_the_zero_shot_rows():
    docs = _boolq()
    ev, cal = qa_split_rows(docs, "evaluation"), qa_split_rows(docs, "calibration")
    assert {r["index"] for r in ev}.isdisjoint(r["index"] for r in cal)
    assert all(r["index"] >= 100 and r["index"] % 5 == 4 for r in cal) and cal
    assert all(r["index"] % 5 != 4 for r in ev)
    assert {r["passage"] for r in cal}.isdisjoint(d["passage"] for i, d in enumerate(docs)
                                                  if i not in {r["index"] for r in cal})
    assert all(r["answer"] == ("yes" if r["label"] else "no") for r in ev + cal)
    with pytest.raises(UserError, match="unknown BoolQ split"):
        qa_split_rows(docs, "train")


def test_qa_sample_uses_only_its_part_and_scores_yes_no():
    docs = _boolq()
    cal_passages = {r["passage"] for r in qa_split_rows(docs, "calibration")}
    ev_passages = {r["passage"] for r in qa_split_rows(docs, "evaluation")}
    for split, own in (("evaluation", ev_passages), ("calibration", cal_passages)):
        s = _builder(split=split).sample("qa", 2048, 3)
        doc = s.prompt[slice(*s.meta["doc_span"])]
        passages = re.findall(r"Document \d+:\n(.*?)(?=\n\nDocument \d+:|$)", doc, flags=re.S)
        assert len(passages) == s.meta["documents"] > 3 and set(passages) <= own
        assert docs[s.meta["row"]]["passage"] == passages[s.meta["gold_document"] - 1]
        assert f"Question: {docs[s.meta['row']]['question']}?" in s.prompt[s.meta["doc_span"][1]:]
        assert s.match == "yes_no" and s.prompt.endswith(" Answer:")
    for pred, answer, expected in [(" Yes, it is.", "yes", 1.0), (" no.", "no", 1.0), (" I know; yes", "yes", 1.0),
                                   (" No, yes", "yes", 0.0), (" maybe", "no", 0.0), ("Nope", "no", 0.0)]:
        assert score_sample("yes_no", pred, [answer]) == expected, pred
    assert score_sample("all", "a b", ["a", "b"]) == score("a b", ["a", "b"]) == 1.0


# -- with the real tokenizer and data ------------------------------------------------------------------------------

@pytest.mark.data
def test_real_tokenizer_every_task_layout_and_chat_fits(tiny_hf_folder):
    from transformers import AutoTokenizer

    from orthorank.harness.evaluation.longctx_suite import load_pools, load_qa_rows

    tok = AutoTokenizer.from_pretrained(str(tiny_hf_folder))
    ev, cal = load_qa_rows(None, "evaluation"), load_qa_rows(None, "calibration")
    assert {r["passage"] for r in ev}.isdisjoint(r["passage"] for r in cal) and min(r["index"] for r in cal) >= 100
    b = SuiteBuilder(tok, load_pools(), seed=0, qa_rows=ev)
    for task in RULER_TASKS:
        for layout in LAYOUTS:
            for chat in (False, True):
                s = b.sample(task, 2048, 1, layout, chat)
                assert len(s.ids) <= 2048 - s.max_new_tokens and len(s.ids) > 1500, (task, layout, chat)
                assert s.ids == tok(s.prompt, add_special_tokens=not chat).input_ids
                if s.match == "all":
                    assert all(a in s.prompt[slice(*s.meta["doc_span"])] for a in s.answers)
