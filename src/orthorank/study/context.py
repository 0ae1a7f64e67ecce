"""What every stage's commands share: the model, the output folder, the budget and the flags of every command."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orthorank.method.plan_store import PLANS_DIR, plan_relpath, sparsity_label
from orthorank.study.budgets import Budget


@dataclass
class StudyContext:
    model: str  # as the user gave it
    model_name: str  # what plans record
    out: Path
    budget: Budget
    common: list[str]  # --model/--dtype/--seed/--device/--threads for every command
    data: list[str]  # --data-dir for the commands that read text (bench does not)
    store: str | None
    plans_root: Path  # plans/<model-name>/ lives under it: the current folder, where every command looks first
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))

    @property
    def plans_dir(self) -> Path:
        return self.plans_root / plan_relpath(self.model_name, "x", 0.1).parent.relative_to(PLANS_DIR)

    def store_args(self) -> list[str]:
        return ["--store", self.store] if self.store else ["--no-store"]

    def levels(self, levels: tuple[float, ...]) -> str:
        return ",".join(sparsity_label(s) for s in levels)


def hybrid_cost_table_argv(ctx: StudyContext, table: Path) -> list[str]:
    """This machine's cost table at the perplexity windows' length, where compute is matched too."""
    return ["bench", *ctx.common, "--batch-size", "1", "--seq-len", str(ctx.budget.ppl_seq_len), "--cost-table",
            str(table)]
