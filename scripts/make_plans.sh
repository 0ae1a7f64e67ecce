#!/usr/bin/env bash
# Makes the committed plans for the embedded model: every method at 10% and 20% sparsity, with the default
# calibration (8K tokens of the four-domain mix in 32 windows of 256, seed 0, racing from the first 2K tokens,
# float32: the setting the transfer matrix chose, docs/transfer.md). OrthoRank plans are compute-matched to pruning
# at 512 tokens (one keep ratio raised from 0.33); the paper's nominal rule is made too (orthorank-nominal-*.json).
# Greedy searches run once for the largest sparsity; the smaller one is the prefix of the same greedy order. The
# plans before 2026-12-03 (2K tokens of C4) are in plans/smollm2-135m/legacy-c4-2k/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-plans/smollm2-135m}
METHODS=${METHODS:-"orthorank sleb shortened-ppl shortgpt"}
for m in $METHODS; do
  # the default calibration (8K tokens of the four-domain mix, docs/data.md), compute matched at 512 tokens
  .venv/bin/orthorank calibrate --model smollm2-135m --method "$m" --sparsity 0.1,0.2 --cost-seq-len 512 \
    --match compute,nominal --dtype float32 --seed 0 --threads "${THREADS:-2}" --out "$OUT" ${OVERWRITE:+--overwrite}
done
