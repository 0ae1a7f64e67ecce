#!/usr/bin/env bash
# Makes the committed plans for the embedded model: every method at 10% and 20% sparsity, with the default
# calibration (8 windows x 256 tokens of held-out C4 sample documents, seed 0, exhaustive greedy, bfloat16; see the
# calibration-spread study in docs/results.md). OrthoRank plans are compute-matched to pruning (the default --match compute: exact since stop 27, one keep ratio raised from 0.33; the committed plans predate it and use 0.33); the paper's
# nominal rule is made too (orthorank-nominal-*.json). Greedy searches run once for the largest sparsity; the
# smaller one is the prefix of the same greedy order.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-plans/smollm2-135m}
METHODS=${METHODS:-"orthorank sleb shortened-ppl shortgpt"}
for m in $METHODS; do
  .venv/bin/orthorank calibrate --model smollm2-135m --method "$m" --sparsity 0.1,0.2 --calib-data c4 \
    --match compute,nominal --dtype bfloat16 --seed 0 --threads "${THREADS:-2}" --out-dir "$OUT" ${OVERWRITE:+--overwrite}
done
