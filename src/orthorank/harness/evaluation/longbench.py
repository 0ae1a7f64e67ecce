"""LongBench (v1) from its own files: prompts, middle truncation, chat rule, first-line scoring and metrics.

Follows THUDM/LongBench `pred.py` and `eval.py` (v1):
- prompt = dataset2prompt[task].format(**row); a prompt longer than `max_length` tokens keeps its first and last
  max_length/2 tokens (middle truncation);
- the chat template is applied except for trec, triviaqa, samsum, lsht, lcc, repobench-p (few-shot tasks);
- greedy decoding with dataset2maxlen[task] new tokens; samsum also stops at a newline;
- trec, triviaqa, samsum, lsht are scored on the first line of the prediction; each prediction takes the best
  score over the answers; LongBench-E buckets by the row's `length` (0-4k, 4-8k, 8k+ words).
Metrics are re-implemented from the paper's definitions (tested on hand-computed values). ROUGE-L uses the
`rouge-score` library (LongBench used the `rouge` package: same ROUGE-L F on word tokens, small tokenization
differences), code similarity `rapidfuzz.fuzz.ratio` (LongBench: fuzzywuzzy's ratio).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orthorank.errors import UserError

NO_CHAT_TASKS = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")
REQUIRED_FIELDS = ("input", "context", "answers", "length", "all_classes")


# -- metrics ------------------------------------------------------------------------------------------------------

def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD's normalisation)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(pred_tokens: list[str], truth_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(truth_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_) -> float:
    return _f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, **_) -> float:
    from rouge_score import rouge_scorer  # lazily: optional dependency (orthorank[eval])

    if not prediction.strip() or not ground_truth.strip():
        return 0.0
    return float(rouge_scorer.RougeScorer(["rougeL"]).score(ground_truth, prediction)["rougeL"].fmeasure)


def classification_score(prediction: str, ground_truth: str, all_classes: list[str] | None = None, **_) -> float:
    matches = [c for c in (all_classes or []) if c in prediction]
    matches = [c for c in matches if not (c in ground_truth and c != ground_truth)]
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def retrieval_score(prediction: str, ground_truth: str, **_) -> float:
    found = re.findall(r"Paragraph (\d+)", ground_truth)
    if not found:
        return 0.0
    numbers = re.findall(r"\d+", prediction)
    return sum(n == found[0] for n in numbers) / len(numbers) if numbers else 0.0


def count_score(prediction: str, ground_truth: str, **_) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(n == str(ground_truth) for n in numbers) / len(numbers) if numbers else 0.0


def code_sim_score(prediction: str, ground_truth: str, **_) -> float:
    from rapidfuzz import fuzz  # lazily: optional dependency (orthorank[eval])

    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz.ratio(line, ground_truth) / 100.0


METRICS: dict[str, Callable[..., float]] = {
    "qa_f1": qa_f1_score, "rouge": rouge_score, "classification": classification_score,
    "retrieval": retrieval_score, "count": count_score, "code_sim": code_sim_score,
}
TASK_METRIC: dict[str, str] = {
    **{t: "qa_f1" for t in ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
                            "triviaqa")},
    **{t: "rouge" for t in ("gov_report", "qmsum", "multi_news", "samsum")},
    "trec": "classification", "passage_retrieval_en": "retrieval", "passage_count": "count",
    "lcc": "code_sim", "repobench-p": "code_sim",
}
CHINESE_TASKS = ("multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh")


def score_prediction(task: str, prediction: str, answers: list[str], all_classes: list[str] | None) -> float:
    """One prediction's score in [0, 1]: the best over the answers, first line only where LongBench does it."""
    metric = METRICS[metric_of(task)]
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return max((metric(prediction, a, all_classes=all_classes) for a in answers), default=0.0)


def metric_of(task: str) -> str:
    base = task[:-2] if task.endswith("_e") else task
    if base in CHINESE_TASKS:
        raise UserError(f"LongBench task {task}: the Chinese tasks need jieba-based metrics, not supported here")
    if base not in TASK_METRIC:
        raise UserError(f"unknown LongBench task {task!r}; known: {', '.join(sorted(TASK_METRIC))}")
    return TASK_METRIC[base]


def length_bucket(length: int) -> str:
    """LongBench-E's buckets of the row's `length` (words)."""
    return "0-4k" if length < 4000 else "4-8k" if length < 8000 else "8k+"


# -- data ---------------------------------------------------------------------------------------------------------

@dataclass
class LongBenchTask:
    name: str  # file stem, e.g. multi_news or multi_news_e
    base: str  # the task whose prompt, length and metric it uses
    rows: list[dict]
    prompt: str
    max_new_tokens: int


def _config(data_dir: Path, name: str) -> dict:
    for path in (data_dir / "config" / name, data_dir / name):
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    raise UserError(f"LongBench config {name} not found in {data_dir} or {data_dir / 'config'}")


def available_tasks(data_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(data_dir).glob("*.jsonl"))


def load_task(data_dir: str | Path, name: str, limit: int | None = None) -> LongBenchTask:
    data_dir = Path(data_dir)
    path = data_dir / f"{name}.jsonl"
    if not path.is_file():
        have = ", ".join(available_tasks(data_dir)) or "none"
        raise UserError(f"LongBench task file {path} not found (tasks in {data_dir}: {have})")
    base = name[:-2] if name.endswith("_e") else name
    metric_of(name)
    prompts, maxlens = _config(data_dir, "dataset2prompt.json"), _config(data_dir, "dataset2maxlen.json")
    if base not in prompts or base not in maxlens:
        raise UserError(f"LongBench task {base} has no prompt or max length in the config files")
    rows = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}, line {i}: not valid JSON") from None
            missing = [k for k in REQUIRED_FIELDS if k not in row]
            if missing:
                raise UserError(f"{path}, line {i}: missing field(s) {', '.join(missing)}")
            if not isinstance(row["answers"], list) or not row["answers"]:
                raise UserError(f"{path}, line {i}: 'answers' must be a non-empty list")
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise UserError(f"{path} holds no examples")
    return LongBenchTask(name, base, rows, prompts[base], int(maxlens[base]))


def _uses_chat(tokenizer, task: LongBenchTask, chat: bool) -> bool:
    return chat and task.base not in NO_CHAT_TASKS and bool(getattr(tokenizer, "chat_template", None))


def prompt_text(tokenizer, task: LongBenchTask, row: dict, max_length: int, chat: bool) -> str:
    """One example's model input as text: the task template, middle-truncated to max_length tokens, then the chat
    template where LongBench applies it (without it the tokenizer adds its special tokens: build_prompt_ids)."""
    prompt = task.prompt.format(**row)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    if len(ids) > max_length:
        half = max_length // 2
        prompt = tokenizer.decode(ids[:half], skip_special_tokens=True) + \
            tokenizer.decode(ids[-half:], skip_special_tokens=True)
    if _uses_chat(tokenizer, task, chat):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt


def build_prompt_ids(tokenizer, task: LongBenchTask, row: dict, max_length: int, chat: bool) -> list[int]:
    """Token ids of one example's prompt (prompt_text, tokenized as LongBench does)."""
    text = prompt_text(tokenizer, task, row, max_length, chat)
    if _uses_chat(tokenizer, task, chat):
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(text).input_ids


def middle_truncate(ids: list[int], max_length: int) -> list[int]:
    """The token-level rule (for tests and callers holding ids): first and last max_length/2 tokens."""
    if len(ids) <= max_length:
        return ids
    half = max_length // 2
    return ids[:half] + ids[-half:]


def stop_tokens(tokenizer, task: LongBenchTask) -> list[int]:
    stops = [tokenizer.eos_token_id]
    if task.base == "samsum":
        stops.append(tokenizer.encode("\n", add_special_tokens=False)[-1])
    return stops
