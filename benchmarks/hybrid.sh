#!/usr/bin/env bash
# Hybrid plans vs SLEB and OrthoRank at equal speed-up on the embedded model (docs/results.md, "Hybrid plans"):
#   1. the cost table of this device: smollm2-135m, bfloat16, 1 x 2048 tokens, THREADS threads (kept if present);
#   2. the predicted speed-ups of the committed SLEB and OrthoRank plans at 0.1 and 0.2 (the targets);
#   3. one hybrid search (C4 calibration 8 x 256, seed 0, bfloat16, screened) writing plans/smollm2-135m/hybrid-x<t>.json
#      for every target whose plan is missing;
#   4. measured prefill speed-ups, perplexity on the first MAX_WINDOWS windows of WikiText-2 and C4 through the result
#      store (resumes where it stopped), benchmarks/results/hybrid-smollm2-135m/{hybrid.md,hybrid.json,frontier.png}.
#   THREADS=1 MAX_WINDOWS=40 benchmarks/hybrid.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
THREADS=${THREADS:-1}
MAX_WINDOWS=${MAX_WINDOWS:-40}
OUT=benchmarks/results/hybrid-smollm2-135m
TABLE=${TABLE:-$OUT/cost-table.json}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's sources, whatever the venv points at
ORTHORANK="$PY -m orthorank.cli.main"
mkdir -p "$OUT"
if [ ! -f "$TABLE" ]; then
  $ORTHORANK bench --model smollm2-135m --dtype bfloat16 --threads "$THREADS" --batch 1 --seq-len 2048 \
    --warmup 1 --repeats 15 --cost-layers 1,15,28 --cost-table "$TABLE"
fi
TARGETS=$($PY benchmarks/hybrid.py targets --cost-table "$TABLE")
echo "targets (predicted speed-ups of sleb/orthorank 0.1 and 0.2, rounded up): $TARGETS"
MISSING=""
for t in ${TARGETS//,/ }; do
  [ -f "plans/smollm2-135m/hybrid-x$t.json" ] || MISSING="${MISSING:+$MISSING,}$t"
done
if [ -n "$MISSING" ]; then
  $ORTHORANK calibrate --model smollm2-135m --method hybrid --dtype bfloat16 --threads "$THREADS" \
    --cost-table "$TABLE" --target-speedup "$MISSING" --screen-fraction 0.25 --out-dir plans/smollm2-135m
fi
$PY benchmarks/hybrid.py evaluate --cost-table "$TABLE" --threads "$THREADS" --max-windows "$MAX_WINDOWS" --repeats "${REPEATS:-7}" \
  --store "${STORE:-benchmarks/results/store}"
