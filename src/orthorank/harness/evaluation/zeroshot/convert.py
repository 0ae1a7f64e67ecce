"""Offline task data: read the files of ../shared/data and rebuild the documents the harness's own task
definitions expect (same field names and meanings), so that our task YAMLs keep the harness's prompts, choices and
targets unchanged. The `load_*` functions are the tasks' `custom_dataset` hooks (see tasks/*.yaml).

Sources and how each is mapped (see ../shared/data/README.md):
- PIQA: the original files (goal, sol1, sol2 + a label file) -> the harness's fields, as they are.
- HellaSwag: llama.cpp's text format (6 lines an item) -> the harness's processed fields (query, choices, gold).
- ARC, BoolQ, OpenBookQA, WinoGrande, LAMBADA: MosaicML llm-foundry reformatted files -> the harness's source
  fields (question/choices/answerKey, passage/question/label, question_stem/..., sentence/option1/option2/answer,
  text).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from orthorank.errors import UserError
from orthorank.harness.evaluation.data import find_data_dir
from orthorank.harness.evaluation.zeroshot.registry import TASKS, check_task_files, resolve_tasks

_LETTERS = "ABCDEFGHIJ"


# ---------------------------------------------------------------------------------------------- converters
# Each takes the raw rows of a file and returns harness-form documents; bad rows raise ValueError.


def piqa_docs(rows: Iterable[dict], labels: Iterable[str]) -> list[dict]:
    """PIQA valid.jsonl + valid-labels.lst -> {goal, sol1, sol2, label} (the fields of the harness's baber/piqa)."""
    rows, labels = list(rows), [s.strip() for s in labels if s.strip()]
    if len(rows) != len(labels):
        raise ValueError(f"{len(rows)} PIQA items but {len(labels)} labels")
    out = []
    for row, lab in zip(rows, labels):
        if lab not in ("0", "1"):
            raise ValueError(f"PIQA label must be 0 or 1, got {lab!r}")
        out.append({"goal": row["goal"], "sol1": row["sol1"], "sol2": row["sol2"], "label": int(lab)})
    return out


def hellaswag_docs(text: str) -> list[dict]:
    """llama.cpp HellaSwag text (per item: "activity_label: ctx", gold label, 4 endings) -> the fields the harness's
    hellaswag `process_docs` produces: query = preprocess(activity_label + ": " + ctx), choices =
    [preprocess(ending)], gold = label (plus label as text, which the harness's YAML uses as target).

    Known difference from lm-eval: the harness builds ctx as ctx_a + " " + ctx_b.capitalize(); this file holds the
    original ctx, so ctx_b is NOT capitalized here (e.g. "...on a roof. he" where lm-eval has "...on a roof. He").
    The file was also cleaned upstream with a slightly different tag filter; applying the harness's `preprocess`
    again removes any [tags] left, so the remaining difference is that capital letter. Expect HellaSwag numbers
    to differ slightly from lm-eval's."""
    from lm_eval.tasks.hellaswag.utils import preprocess  # lazily: optional; the harness's own cleaning function

    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"HellaSwag text must have 6 lines per item, got {len(lines)} lines")
    out = []
    for i in range(0, len(lines), 6):
        ctx, label, endings = lines[i], lines[i + 1].strip(), lines[i + 2:i + 6]
        if label not in ("0", "1", "2", "3"):
            raise ValueError(f"HellaSwag item {i // 6}: label must be 0-3, got {label!r}")
        out.append({"query": preprocess(ctx), "choices": [preprocess(e) for e in endings], "gold": int(label),
                    "label": label})
    return out


def _mc_choices(row: dict) -> tuple[list[str], int]:
    choices, gold = list(row["choices"]), row["gold"]
    if not isinstance(gold, int) or not 0 <= gold < len(choices) or len(choices) > len(_LETTERS):
        raise ValueError(f"gold {gold!r} does not index the {len(choices)} choices")
    return [str(c) for c in choices], gold


def arc_doc(row: dict) -> dict:
    """llm-foundry {query: "Question: Q", choices, gold} -> the harness's ai2_arc fields {question, choices: {text,
    label}, answerKey}. Labels become A, B, C, ... (ARC also has 1-4 labels; the harness only uses their order)."""
    query = row["query"]
    if not query.startswith("Question: "):
        raise ValueError(f"ARC query must start with 'Question: ', got {query[:40]!r}")
    choices, gold = _mc_choices(row)
    labels = list(_LETTERS[: len(choices)])
    return {"question": query[len("Question: "):], "choices": {"text": choices, "label": labels},
            "answerKey": labels[gold]}


def openbookqa_doc(row: dict) -> dict:
    """llm-foundry {query: stem, choices, gold} -> the harness's openbookqa fields
    {question_stem, choices: {text, label}, answerKey}."""
    choices, gold = _mc_choices(row)
    labels = list(_LETTERS[: len(choices)])
    return {"question_stem": row["query"], "choices": {"text": choices, "label": labels}, "answerKey": labels[gold]}


def boolq_doc(row: dict) -> dict:
    """llm-foundry {query: "Passage: P\\nQuestion: Q?", choices: [no, yes], gold} -> the harness's super_glue boolq
    fields {passage, question, label}; the harness's prompt "{{passage}}\\nQuestion: {{question}}?\\nAnswer:" then
    rebuilds the same text without the "Passage: " prefix. One passage itself holds "\\nQuestion: ", so the split
    is at the last one."""
    query = row["query"]
    if not query.startswith("Passage: ") or "\nQuestion: " not in query or not query.endswith("?"):
        raise ValueError(f"BoolQ query is not 'Passage: ...\\nQuestion: ...?': {query[:60]!r}")
    if list(row["choices"]) != ["no", "yes"] or row["gold"] not in (0, 1):
        raise ValueError(f"BoolQ choices must be ['no', 'yes'] with gold 0/1, got {row['choices']}, {row['gold']}")
    passage, question = query[len("Passage: "):].rsplit("\nQuestion: ", 1)
    return {"passage": passage, "question": question[:-1], "label": int(row["gold"])}


def winogrande_doc(row: dict) -> dict:
    """llm-foundry {context_options: [prefix + option1, prefix + option2], continuation, gold} -> the harness's
    winogrande fields {sentence, option1, option2, answer}, from which the harness's own functions give back
    exactly the two contexts (choices) and the continuation (target). The blank "_" goes after the longest common
    word-aligned prefix of the two contexts, as in the original sentences ("... but the _ was't ruined.")."""
    a, b = row["context_options"]
    cont, gold = row["continuation"], row["gold"]
    if gold not in (0, 1):
        raise ValueError(f"WinoGrande gold must be 0 or 1, got {gold!r}")
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    cut = a[:n].rfind(" ") + 1  # back off to a word start: "the b|lanket" / "the b|ed" -> "the |blanket" / "the |bed"
    prefix = a[:cut]
    if "_" in prefix:
        raise ValueError(f"WinoGrande context holds '_': {prefix[:60]!r}")
    return {"sentence": f"{prefix}_ {cont}", "option1": a[cut:], "option2": b[cut:], "answer": str(gold + 1)}


def lambada_doc(row: dict) -> dict:
    """llm-foundry {context, continuation} -> the harness's lambada_openai {text}. The harness splits text at its
    last space (context = all but the last space-separated piece, target = " " + that piece), which is how the
    file was split; continuations that hold newlines ("of\\n\\nPower") are that same last piece."""
    ctx, cont = row["context"], row["continuation"]
    if not cont or " " in cont:
        raise ValueError(f"LAMBADA continuation must be one space-free piece, got {cont!r}")
    return {"text": f"{ctx} {cont}"}


# ------------------------------------------------------------------------------------------------- loading


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path} line {n} is not valid JSON: {exc}") from None
    return rows


def _convert_each(path: Path, rows: list[dict], fn) -> list[dict]:
    out = []
    for n, row in enumerate(rows, 1):
        try:
            out.append(fn(row))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{path} item {n} is malformed: {type(exc).__name__}: {exc}") from None
    return out


def task_docs(name: str, data_dir: str | Path | None = None) -> list[dict]:
    """The harness-form documents of a task (harness name, e.g. "arc_easy") from the offline data folder."""
    name = resolve_tasks(name)[0]
    root = resolve_data_dir(data_dir)
    check_task_files([name], root)
    paths = [root / rel for rel in TASKS[name].files]
    if name == "piqa":
        labels = paths[1].read_text(encoding="utf-8").splitlines()
        try:
            return piqa_docs(_read_jsonl(paths[0]), labels)
        except (KeyError, ValueError) as exc:
            raise UserError(f"{paths[0]} is malformed: {type(exc).__name__}: {exc}") from None
    if name == "hellaswag":
        try:
            return hellaswag_docs(paths[0].read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UserError(f"{paths[0]} is malformed: {exc}") from None
    fn = {"winogrande": winogrande_doc, "arc_easy": arc_doc, "arc_challenge": arc_doc, "boolq": boolq_doc,
          "openbookqa": openbookqa_doc, "lambada_openai": lambada_doc}[name]
    return _convert_each(paths[0], _read_jsonl(paths[0]), fn)


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """--data-dir, else $ORTHORANK_DATA_DIR, else ../shared/data (relative to the current folder or the repo)."""
    root = find_data_dir(data_dir)
    if root is None:
        raise UserError("no offline data folder found (looked for ../shared/data); pass --data-dir "
                        "or set ORTHORANK_DATA_DIR")
    return root


def dataset_dict(name: str, data_dir: str | Path | None = None):
    """A datasets.DatasetDict holding the task's evaluation split, built in memory (no hub, no cache files)."""
    import datasets  # lazily: optional dependency (lm_eval's)

    name = resolve_tasks(name)[0]
    return datasets.DatasetDict({TASKS[name].split: datasets.Dataset.from_list(task_docs(name, data_dir))})


# The harness calls custom_dataset(**metadata): the task YAML's metadata plus what the run passes (TaskManager
# metadata, or the model_args of `lm_eval --model_args ...`); `data_dir` there picks the data folder.
def _hook(name: str):
    def load(**metadata: Any):
        return dataset_dict(name, metadata.get("data_dir") or None)

    load.__name__ = f"load_{name}"
    load.__doc__ = f"custom_dataset hook of orthorank_{name}: the offline {name} data as a DatasetDict."
    return load


load_piqa = _hook("piqa")
load_winogrande = _hook("winogrande")
load_hellaswag = _hook("hellaswag")
load_arc_easy = _hook("arc_easy")
load_arc_challenge = _hook("arc_challenge")
load_boolq = _hook("boolq")
load_openbookqa = _hook("openbookqa")
load_lambada_openai = _hook("lambada_openai")
