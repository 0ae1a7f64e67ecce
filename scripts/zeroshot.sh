#!/usr/bin/env bash
# Zero-shot accuracy (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c) of dense, SLEB, Shortened-PPL, ShortGPT and
# OrthoRank (compute-matched) at 10% and 20% on the embedded model, bfloat16, the first LIMIT items of each task,
# per-item outcomes in the result store (resumable), standard errors and paired differences with intervals.
#   LIMIT=500 scripts/zeroshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${LIMIT-500}
OUT=${OUT:-scripts/results/zeroshot-smollm2-135m${LIMIT:+-n$LIMIT}}
${ORTHORANK:-.venv/bin/orthorank} compare --model smollm2-135m --dtype bfloat16 --no-ppl --zeroshot \
  --methods "${METHODS:-dense,sleb,shortened-ppl,shortgpt,orthorank}" --sparsity "${SPARSITY:-0.1,0.2}" \
  --tasks piqa,winogrande,hellaswag,arc_easy,arc_challenge ${LIMIT:+--limit $LIMIT} --zeroshot-batch-size 16 \
  --store "${STORE:-scripts/results/store}" --threads "${THREADS:-2}" --out "$OUT" --overwrite
