"""The zero-shot tasks: the harness's names (used on our command line), our offline task names, their data files
and expected sizes. No lm_eval import here, so the CLI can list and check tasks without loading the harness."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orthorank.errors import UserError


@dataclass(frozen=True)
class TaskSpec:
    name: str  # the harness's task name, e.g. "arc_easy"
    offline: str  # our task (tasks/<offline>.yaml), e.g. "orthorank_arc_easy"
    files: tuple[str, ...]  # relative to the data folder (../shared/data)
    split: str  # the split the harness evaluates
    size: int  # examples in that split
    metrics: tuple[str, ...]  # as the harness's task defines them
    title: str  # column title in tables


_FOUNDRY = "llm-foundry-icl"
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("piqa", "orthorank_piqa", ("piqa/valid.jsonl", "piqa/valid-labels.lst"), "validation", 1838,
                 ("acc", "acc_norm"), "PIQA"),
        TaskSpec("winogrande", "orthorank_winogrande", (f"{_FOUNDRY}/winogrande.jsonl",), "validation", 1267,
                 ("acc",), "WinoGrande"),
        TaskSpec("hellaswag", "orthorank_hellaswag", ("hellaswag/hellaswag_val_full.txt",), "validation", 10042,
                 ("acc", "acc_norm"), "HellaSwag"),
        TaskSpec("arc_easy", "orthorank_arc_easy", (f"{_FOUNDRY}/arc_easy.jsonl",), "test", 2376,
                 ("acc", "acc_norm"), "ARC-e"),
        TaskSpec("arc_challenge", "orthorank_arc_challenge", (f"{_FOUNDRY}/arc_challenge.jsonl",), "test", 1172,
                 ("acc", "acc_norm"), "ARC-c"),
        TaskSpec("boolq", "orthorank_boolq", (f"{_FOUNDRY}/boolq.jsonl",), "validation", 3270, ("acc",), "BoolQ"),
        TaskSpec("openbookqa", "orthorank_openbookqa", (f"{_FOUNDRY}/openbook_qa.jsonl",), "test", 500,
                 ("acc", "acc_norm"), "OBQA"),
        TaskSpec("lambada_openai", "orthorank_lambada_openai", (f"{_FOUNDRY}/lambada_openai.jsonl",), "test", 5153,
                 ("perplexity", "acc"), "LAMBADA"),
    )
}
# The paper's (and SLEB's) five tasks, in the paper's column order.
MAIN_TASKS = ("piqa", "winogrande", "hellaswag", "arc_easy", "arc_challenge")
ALL_TASKS = tuple(TASKS)
_ALIASES = {"lambada": "lambada_openai", "obqa": "openbookqa", "openbook_qa": "openbookqa", "arc_e": "arc_easy",
            "arc_c": "arc_challenge", "arc-easy": "arc_easy", "arc-challenge": "arc_challenge"}
_GROUPS = {"main": MAIN_TASKS, "all": ALL_TASKS}
_BY_OFFLINE = {t.offline: t.name for t in TASKS.values()}


def tasks_dir() -> Path:
    """The folder of our task YAMLs, for lm_eval's TaskManager(include_path=...) or `lm_eval --include_path`."""
    return Path(__file__).resolve().parent / "tasks"


def resolve_tasks(spec: str | list[str] | tuple[str, ...]) -> list[str]:
    """Harness task names from a comma list or a list: harness names, aliases, our offline names, main, all."""
    items = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in str(s).split(",")]
    out: list[str] = []
    for raw in items:
        key = raw.strip().lower()
        if not key:
            continue
        names = _GROUPS.get(key) or (_ALIASES.get(key) or _BY_OFFLINE.get(key) or key,)
        for name in names:
            if name not in TASKS:
                raise UserError(
                    f"unknown zero-shot task {raw.strip()!r}; choose from {', '.join(ALL_TASKS)} (or main, all)"
                )
            if name not in out:
                out.append(name)
    if not out:
        raise UserError("no zero-shot tasks given; choose from " + ", ".join(ALL_TASKS))
    return out


def check_task_files(names: list[str], data_dir: Path) -> None:
    """Fail before any model work if a task's data file is missing."""
    for name in names:
        for rel in TASKS[name].files:
            if not (data_dir / rel).is_file():
                raise UserError(
                    f"missing data file {data_dir / rel} for task {name}; see ../shared/data/README.md "
                    "or pass --data-dir"
                )
