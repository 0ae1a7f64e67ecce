"""What every stage's calls share: the model, the output folder, the budget, and the options every command takes."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from orthorank.harness.api.options import BenchOptions, CompareOptions, Options, StoreOptions
from orthorank.method.plan_store import PLANS_DIR, plan_relpath, sparsity_label
from orthorank.harness.study.budgets import DOMAINS, Budget

O = TypeVar("O", bound=Options)


@dataclass
class StudyContext:
    model: str  # as the user gave it
    model_name: str  # what plans record
    out: Path
    budget: Budget
    model_options: dict[str, Any]  # ModelOptions fields every command gets (model, dtype, seed, device, threads)
    data_dir: str | None  # for the commands that read text
    store: str | None  # the result store; None: none
    plans_root: Path  # plans/<model-name>/ lives under it: the current folder, where every command looks first
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))

    @property
    def plans_dir(self) -> Path:
        return self.plans_root / plan_relpath(self.model_name, "x", 0.1).parent.relative_to(PLANS_DIR)

    def options(self, kind: type[O], **fields: Any) -> O:
        """A command's options for this study: its model options, data folder and store, then `fields`."""
        names = {f.name for f in dataclasses.fields(kind)}
        shared: dict[str, Any] = dict(self.model_options)
        if "data_dir" in names:
            shared["data_dir"] = self.data_dir
        if issubclass(kind, StoreOptions):
            shared.update(store=self.store, no_store=False) if self.store else shared.update(no_store=True)
        return kind(**(shared | fields))

    def levels(self, levels: tuple[float, ...]) -> str:
        return ",".join(sparsity_label(s) for s in levels)


def hybrid_cost_table(ctx: StudyContext, table: Path) -> BenchOptions:
    """This machine's cost table at the perplexity windows' length, where compute is matched too."""
    return ctx.options(BenchOptions, batch=[1], seq_len=[ctx.budget.ppl_seq_len], cost_table=str(table))


def compare_on_domains(ctx: StudyContext, methods: list[str], levels: tuple[float, ...], out: Path,
                       **fields: Any) -> CompareOptions:
    """A comparison on the perplexity stage's windows of every domain, with the study's plans."""
    b = ctx.budget
    return ctx.options(CompareOptions, **{
        "methods": ",".join(methods), "sparsity": ctx.levels(levels), "datasets": ",".join(DOMAINS),
        "seq_len": b.ppl_seq_len, "max_windows": b.ppl_windows, "plans_dir": str(ctx.plans_dir), "out": str(out),
        "overwrite": True, **fields})


def finished_json(path: Path) -> bool:
    """A result file its command rewrites as it goes (bench, frontier, the transfer matrix) is finished when it says
    so: `"complete": true`."""
    return path.is_file() and json.loads(path.read_text()).get("complete") is True
