"""Zero-shot accuracy through lm-evaluation-harness, offline.

- `run_zeroshot(lm, plan, tasks, limit)` -> {task: {metric: value}}, `format_table(...)` -> Markdown (runner.py)
- the `orthorank` lm_eval model backend (backend.py; imports lm_eval, so it is not imported here)
- offline copies of the harness tasks (tasks/*.yaml) fed from ../shared/data (convert.py)
"""

from orthorank.harness.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS, TASKS, resolve_tasks, tasks_dir
from orthorank.harness.evaluation.zeroshot.runner import format_table, run_zeroshot, task_manager

__all__ = [
    "ALL_TASKS", "MAIN_TASKS", "TASKS", "format_table", "resolve_tasks", "run_zeroshot", "task_manager", "tasks_dir",
]
