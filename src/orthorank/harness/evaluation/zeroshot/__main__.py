"""`python -m orthorank.harness.evaluation.zeroshot [lm_eval arguments]`: lm_eval's own command line with the `orthorank`
model backend registered and our offline tasks on the include path, e.g.

    python -m orthorank.harness.evaluation.zeroshot --model orthorank --device cpu \\
        --model_args model=smollm2-135m,plan=plans/smollm2-135m/orthorank-0.2.json \\
        --tasks orthorank_piqa,orthorank_arc_easy --limit 100

Offline task names: orthorank_<harness name> (orthorank_piqa, ...), or the tags orthorank_zeroshot (the paper's
five tasks) and orthorank_zeroshot_all (all eight). `data_dir=...` in --model_args picks the data folder.
(lm_eval 0.4.13 ignores the package's `lm_eval.models` entry point, so plain `lm_eval --model orthorank` needs a
harness version that loads plugin entry points; this wrapper works with any.)
"""

from __future__ import annotations

import os
import sys

from orthorank.errors import UserError
from orthorank.harness.evaluation.zeroshot.registry import tasks_dir


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import orthorank.harness.evaluation.zeroshot.backend  # noqa: F401  registers --model orthorank; lazily: it imports lm_eval
    from lm_eval.__main__ import cli_evaluate  # lazily: optional dependency (orthorank[eval])

    args = list(sys.argv[1:] if argv is None else argv)
    # lm_eval takes one --include_path; a user's own replaces ours.
    if args and not {"-h", "--help"} & set(args) and not any(a.startswith("--include_path") for a in args):
        args += ["--include_path", str(tasks_dir())]
    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    except UserError as exc:
        print(f"lm-eval (orthorank): error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
