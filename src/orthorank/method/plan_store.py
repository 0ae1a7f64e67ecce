"""Where saved plans live: plans/<model-name>/<method>-<sparsity>.json, under the current folder or the repo root."""

from __future__ import annotations

import re
from pathlib import Path

from orthorank.errors import UserError
from orthorank.method.plan import check_sparsity
from orthorank.method.registry import METHODS

PLANS_DIR = "plans"


def plan_file_method(search: str, match: str = "compute") -> str:
    """The file-name label of a search's plans: OrthoRank plans matched by the paper's nominal rule are kept apart
    from the default compute-matched ones (orthorank-nominal-0.2.json vs orthorank-0.2.json)."""
    for m in METHODS.values():
        if m.search == search and m.match == match:
            return m.plan_label
    return search
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def sparsity_label(sparsity: float) -> str:
    """0.2 -> "0.2", 0.10 -> "0.1": the shortest form, as file names use it."""
    check_sparsity(sparsity)
    return f"{float(sparsity):g}"


def plan_relpath(model_name: str, method: str, sparsity: float) -> Path:
    """plans/<model-name>/<method>-<sparsity>.json (a hub id org/name becomes two folders)."""
    if not _SAFE.match(method):
        raise UserError(f"method name {method!r} cannot name a plan file")
    parts = [p for p in model_name.replace("\\", "/").split("/") if p]
    if not parts or any(p in (".", "..") or not _SAFE.match(p) for p in parts):
        raise UserError(f"model name {model_name!r} cannot name a plan folder")
    return Path(PLANS_DIR, *parts, f"{method}-{sparsity_label(sparsity)}.json")


def plan_roots() -> list[Path]:
    """Folders searched for plans/: the current folder first, then the repository root."""
    repo = Path(__file__).resolve().parents[3]  # src/orthorank/method/plan_store.py -> repo root
    roots = [Path.cwd().resolve()]
    if repo not in roots:
        roots.append(repo)
    return roots


def find_plan(model_name: str, method: str, sparsity: float, roots: list[Path] | None = None) -> Path:
    """The saved plan of `method` at `sparsity` for `model_name`; a UserError naming what to run if none exists."""
    rel = plan_relpath(model_name, method, sparsity)
    searched = [Path(r) / rel for r in (roots if roots is not None else plan_roots())]
    for path in searched:
        if path.is_file():
            return path
    raise UserError(
        f"no {method} plan at sparsity {sparsity_label(sparsity)} for model {model_name!r} "
        f"(looked for {', '.join(str(p) for p in searched)}); run `orthorank calibrate` first to make it, "
        "or pass --plan FILE"
    )
