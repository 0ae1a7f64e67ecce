"""An offline long-context suite in the style of RULER (Hsieh et al. 2024), generated from a seed, no downloads.

Tasks (RULER's names in brackets; builders in ruler_tasks.py):
- niah_single   [niah_single_2]: one "special magic number" sentence hidden in prose; recall the number.
- niah_single_noise [niah_single_1]: the same in RULER's noise haystack ("The grass is green. ...").
- niah_single_needles [niah_single_3]: the haystack is nothing but needles with other keys; recall one.
- niah_multikey [niah_multikey_1]: four needles with different keys; recall the asked key's number.
- niah_multivalue [niah_multivalue]: four numbers for the same key; recall all of them.
- niah_multiquery [niah_multiquery]: four needles with different keys; recall two keys' numbers (RULER: four).
- variable_tracking [vt]: a five-variable chain VAR A = 12345, VAR B = VAR A, ... in prose; name every variable
  that holds the value.
- vt_hops [vt]: a chain of 1-4 hops (1 + index % 4) and a distractor chain in the noise haystack.
- common_words [cwe]: a numbered word list in which ten words recur many times; name the ten.
- frequent_words [fwe]: coded words with Zipf (alpha 2) counts; name the three most frequent.
- qa [qa_1, with BoolQ instead of SQuAD]: a BoolQ passage among distractor passages; answer yes or no.
Prose haystacks are consecutive sentences of WikiText-2 and C4 text (alternating by sample); QA passages come from
BoolQ's validation file, split by row into an evaluation and a calibration part (`load_qa_rows`).

Every sample is a pure function of (seed, task, length, index, layout, chat) and is built to fit `length` minus
the task's generation budget in tokens of the model's tokenizer. Layouts (`LAYOUTS`):
- "last": instruction head, document, question, task answer prefix (completion style, as RULER does for base
  models). The original five tasks' prompts in this layout without chat are unchanged from the first version.
- "first": instruction head, question, document, then the neutral cue "\\nAnswer:".
- "long": as "last" with a fixed block of generic instructions (over 100 tokens) right before the question, so
  that the text after the document is far longer than a 64-token recent-token tail.
With chat=True the tokenizer's chat template wraps the user turn; the answer prefix or cue follows the template's
generation prompt.

Scoring is binary: a sample is correct (1.0) when every expected string appears in the prediction (RULER's
string_match_all, but all-or-nothing per sample where RULER gives per-reference partial credit), and for qa when
the first "yes" or "no" word of the prediction is the answer (RULER's string_match_part on a single reference).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

from orthorank.errors import UserError
from orthorank.harness.evaluation.data import load_eval_text
from orthorank.harness.evaluation.ruler_tasks import _KEYS, Parts, TaskBuilders  # noqa: F401  (_KEYS: older imports)

# TASKS need only the sentence pools (and are the `longctx` command's default); qa needs BoolQ rows as well.
CLASSIC_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "common_words")
TASKS = CLASSIC_TASKS + ("niah_single_noise", "niah_single_needles", "niah_multiquery", "vt_hops",
                         "frequent_words")
RULER_TASKS = ("niah_single_noise", "niah_single", "niah_single_needles", "niah_multikey", "niah_multivalue",
               "niah_multiquery", "vt_hops", "common_words", "frequent_words", "qa")
LENGTHS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192}
MAX_NEW_TOKENS = {"niah_single": 16, "niah_multikey": 16, "niah_multivalue": 48, "variable_tracking": 32,
                  "common_words": 80, "niah_single_noise": 16, "niah_single_needles": 16, "niah_multiquery": 32,
                  "vt_hops": 32, "frequent_words": 32, "qa": 8}
LAYOUTS = ("last", "first", "long")
FIRST_CUE = "\nAnswer:"
# Layout "long": the same generic instructions for every task, placed between the document and the question.
LONG_INSTRUCTIONS = (
    "Instructions: Read the whole text above carefully before you answer, from its first line to its last, because "
    "the information you need may appear anywhere in it: at the beginning, in the middle or at the end. Answer only "
    "from the text above and do not use outside knowledge, even when the text seems to disagree with what you "
    "know. Much of the text is unrelated to the question and is there only to distract you, so ignore it. Copy "
    "names, numbers and codes exactly as they are written, character by character, without rounding, reformatting "
    "or translating them. When the question asks for several items, give every one of them, separated by commas, "
    "in any order. Write the answer directly after the answer cue, on a single line, with no explanation, no "
    "reasoning and no repetition of the question, and stop when the answer is complete."
)
# BoolQ rows for qa: evaluation rows are those with index % 5 != 4, calibration rows those with index % 5 == 4
# that lie past the first ZEROSHOT_BOOLQ_ROWS (what the zero-shot BoolQ evaluation reads at most) and whose passage
# no other row has, so calibration and evaluation prompts share no text.
QA_CALIBRATION_MODULUS = 5
ZEROSHOT_BOOLQ_ROWS = 100


@dataclass
class Sample:
    task: str
    length: int  # target prompt length in tokens
    index: int
    prompt: str
    answers: list[str]
    max_new_tokens: int
    meta: dict = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)  # the prompt's token ids, what the model is given
    match: str = "all"  # "all": every answer must appear; "yes_no": the first yes/no word must be the answer


def parse_lengths(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in LENGTHS:
            out.append(LENGTHS[part])
        elif part.isdigit() and int(part) >= 256:
            out.append(int(part))
        else:
            raise UserError(f"unknown length {part!r}; use {', '.join(LENGTHS)} or a token count >= 256")
    return out


def parse_tasks(text: str) -> list[str]:
    known = TASKS + tuple(t for t in RULER_TASKS if t not in TASKS)
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tasks if t not in known]
    if bad or not tasks:
        raise UserError(f"unknown task {bad[0] if bad else text!r}; choose from {', '.join(known)}")
    return tasks


def parse_layouts(text: str) -> list[str]:
    layouts = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in layouts if t not in LAYOUTS]
    if bad or not layouts:
        raise UserError(f"unknown layout {bad[0] if bad else text!r}; choose from {', '.join(LAYOUTS)}")
    return list(dict.fromkeys(layouts))  # a layout named twice would score its items twice


def _rng(seed, task: str, length: int, index: int) -> random.Random:
    h = hashlib.sha256(f"{seed}/{task}/{length}/{index}".encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def split_sentences(text: str) -> list[str]:
    text = re.sub(r"\s+", " ", text.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", "."))
    parts = re.split(r"(?<=[.!?])\s+", text)
    return [p.strip() for p in parts if len(p.split()) >= 4 and "=" not in p]


class SuiteBuilder(TaskBuilders):
    """Builds samples to a token budget with one tokenizer over sentence pools (e.g. WikiText-2 and C4) and,
    for qa, BoolQ rows (`load_qa_rows`)."""

    def __init__(self, tokenizer, pools: dict[str, list[str]], seed: int = 0,
                 qa_rows: list[dict] | None = None) -> None:
        if not pools or any(len(p) < 100 for p in pools.values()):
            raise UserError("the haystack text is too short to build the long-context suite")
        self.tok = tokenizer
        self.pools = pools
        self.seed = seed
        self.qa_rows = qa_rows
        self._lens: dict[str, list] = {}  # token counts and word lists, cached per pool (see TaskBuilders)

    def sample(self, task: str, length: int, index: int, layout: str = "last", chat: bool = False) -> Sample:
        if task not in MAX_NEW_TOKENS:
            raise UserError(f"unknown task {task!r}; choose from {', '.join(RULER_TASKS)}")
        if layout not in LAYOUTS:
            raise UserError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
        if chat:
            self._check_chat()
        default = layout == "last" and not chat
        # the default layout keeps the first version's seeds (and so its prompts); others fold theirs in
        seed = self.seed if default else f"{self.seed}/{layout}/{'chat' if chat else 'plain'}"
        pool = sorted(self.pools)[index % len(self.pools)]
        build = getattr(self, f"_{task}")
        # Fill to the budget, then shrink the document until the prompt's ids fit the target length.
        reserve = MAX_NEW_TOKENS[task]
        limit = length - reserve
        budget = limit - 120 - (0 if default else self._overhead(layout, chat))
        added = 0 if chat else self._added_tokens()
        for _ in range(6):
            parts = build(_rng(seed, task, length, index), pool, max(budget, 64), index)
            prompt, span, ids = self._assemble(parts, layout, chat)
            n = len(ids)
            # measured on the ids the model gets (with its BOS): the first version left out the BOS, so a BOS
            # tokenizer's prompt of exactly `limit` tokens without it now takes another try (Gemma: 2 of 364
            # default prompts checked, none of the committed results' items)
            if n <= limit:
                break
            # the first version counted the prompt without the BOS a tokenizer adds; so does this step, or a
            # Gemma prompt that needed a second try would come out differently
            budget -= (n - added - limit) + 16
        else:
            raise UserError(f"could not fit a {task} sample into {length} tokens")
        head = self.tok(prompt[:span[0]], add_special_tokens=not chat).input_ids
        meta = dict(parts.meta, pool=pool, prompt_tokens=n, layout=layout, chat=chat, haystack=parts.haystack,
                    head_tokens=len(head), tail_tokens=self._n_tokens(prompt[span[1]:]), doc_span=list(span))
        return Sample(task, length, index, prompt, parts.answers, reserve, meta, ids=list(ids), match=parts.match)

    # -- layout -------------------------------------------------------------------------------------------------

    def _assemble(self, parts: Parts, layout: str, chat: bool) -> tuple[str, tuple[int, int], list]:
        """The prompt, the document's character span in it, and its token ids."""
        if layout == "first":
            body_head = (parts.head_first or parts.head) + (parts.question_first or parts.question).strip() + "\n\n"
            body_tail, answer = "", FIRST_CUE
        else:
            body_head = parts.head
            body_tail = ("\n\n" + LONG_INSTRUCTIONS if layout == "long" else "") + parts.question
            answer = parts.prefix
        if not chat:
            prompt = body_head + parts.doc + body_tail + answer
            start = len(body_head)
            return prompt, (start, start + len(parts.doc)), self.tok(prompt).input_ids
        text = self.tok.apply_chat_template([{"role": "user", "content": body_head + parts.doc + body_tail}],
                                            tokenize=False, add_generation_prompt=True)
        prompt = text + answer.lstrip()
        start = prompt.find(parts.doc)
        if start < 0:
            raise UserError("the tokenizer's chat template changed the document's text; use chat off")
        # the template carries its own BOS where the model has one, so the tokenizer adds none
        return prompt, (start, start + len(parts.doc)), self.tok(prompt, add_special_tokens=False).input_ids

    def _added_tokens(self) -> int:
        """How many special tokens (a BOS, say) the tokenizer adds to any text."""
        return len(self.tok("x").input_ids) - len(self.tok("x", add_special_tokens=False).input_ids)

    def _check_chat(self) -> None:
        if getattr(self.tok, "chat_template", None) is None or not hasattr(self.tok, "apply_chat_template"):
            raise UserError("chat prompts need a tokenizer with a chat template; this model's tokenizer has none "
                            "(use a chat/instruct model or leave chat off)")

    def _overhead(self, layout: str, chat: bool) -> int:
        """Tokens a non-default layout adds over "last" (a first guess for the fill; the ids are measured)."""
        extra = self._n_tokens(LONG_INSTRUCTIONS) if layout == "long" else 0
        if chat:
            extra += self._n_tokens(self.tok.apply_chat_template([{"role": "user", "content": ""}], tokenize=False,
                                                                 add_generation_prompt=True))
        return extra


def suite_items(builder: SuiteBuilder, tasks, length: int, samples: int, layouts=("last",),
                chats=(False,)) -> list[Sample]:
    """Samples for every (task, layout, chat, index), in that nesting order."""
    return [builder.sample(task, length, i, layout=layout, chat=chat)
            for task in tasks for layout in layouts for chat in chats for i in range(samples)]


def score(prediction: str, answers: list[str]) -> float:
    """1.0 when every expected string appears in the prediction (case-insensitive), else 0.0."""
    p = prediction.lower()
    return float(all(a.lower() in p for a in answers))


def score_yes_no(prediction: str, answer: str) -> float:
    """1.0 when the first word "yes" or "no" in the prediction (case-insensitive) is the answer, else 0.0."""
    m = re.search(r"\b(yes|no)\b", prediction.lower())
    return float(m is not None and m.group(1) == answer.lower())


def score_sample(sample: Sample | str, prediction: str, answers: list[str] | None = None) -> float:
    """Score by the sample's rule; `sample` may be a Sample (answers default to its own) or a match name."""
    match = sample.match if isinstance(sample, Sample) else sample
    answers = answers if answers is not None else sample.answers
    if match == "yes_no":
        return score_yes_no(prediction, answers[0])
    if match == "all":
        return score(prediction, answers)
    raise ValueError(f"unknown match rule {match!r}")


def load_pools(data_dir=None) -> dict[str, list[str]]:
    """Sentence pools from the offline WikiText-2 test text and the C4 validation sample."""
    return {name: split_sentences(load_eval_text(name, data_dir)) for name in ("wikitext2", "c4")}


def qa_split_rows(docs: list[dict], split: str) -> list[dict]:
    """BoolQ documents ({passage, question, label}) -> the rows of one part, each {index, passage, question,
    label, answer}; see QA_CALIBRATION_MODULUS."""
    if split not in ("evaluation", "calibration"):
        raise UserError(f"unknown BoolQ split {split!r}; use evaluation or calibration")
    rows = [dict(d, index=i, answer="yes" if d["label"] else "no") for i, d in enumerate(docs)]
    calib = [r for r in rows if r["index"] % QA_CALIBRATION_MODULUS == QA_CALIBRATION_MODULUS - 1
             and r["index"] >= ZEROSHOT_BOOLQ_ROWS]
    if split == "evaluation":
        return [r for r in rows if r["index"] % QA_CALIBRATION_MODULUS != QA_CALIBRATION_MODULUS - 1]
    ids = {r["index"] for r in calib}
    elsewhere = {r["passage"] for r in rows if r["index"] not in ids}
    return [r for r in calib if r["passage"] not in elsewhere]


def load_qa_rows(data_dir=None, split: str = "evaluation") -> list[dict]:
    """The qa task's BoolQ rows (llm-foundry-icl/boolq.jsonl under the data folder) of one part."""
    from orthorank.harness.evaluation.zeroshot.convert import task_docs  # lazily: the zero-shot package loads models

    if split not in ("evaluation", "calibration"):
        raise UserError(f"unknown BoolQ split {split!r}; use evaluation or calibration")
    return qa_split_rows(task_docs("boolq", data_dir), split)
