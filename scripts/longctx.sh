#!/usr/bin/env bash
# Issue "long inputs": the offline long-context suite and LongBench on the embedded model (resumable through the
# result store; rerun to continue). Env: LENGTHS (default 1k,2k,4k), SAMPLES (50), THREADS (1), BATCH (4),
# LB_LIMIT (LongBench examples per task; default all).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
COMMON=(--model smollm2-135m --methods dense,sleb,orthorank --sparsity 0.2 --dtype bfloat16
        --threads "${THREADS:-1}" --batch-size "${BATCH:-4}" --store scripts/results/store --overwrite)
"$PY" -m orthorank.harness.cli.main longctx "${COMMON[@]}" --lengths "${LENGTHS:-1k,2k,4k}" --samples "${SAMPLES:-50}" \
  --out scripts/results/longctx-smollm2-135m
"$PY" -m orthorank.harness.cli.main longbench "${COMMON[@]}" ${LB_LIMIT:+--limit "$LB_LIMIT"} \
  --out scripts/results/longbench-smollm2-135m
