#!/usr/bin/env bash
# Issue 57 item 3: the router plans' selection layers against their FLOP ideal, and the plans against SLEB.
#   1. one selection layer of the router plan at 20% (its first, run with the plan's fitted router), dense against
#      selective, at 1k, 4k and 8k tokens, with `--profile`: its time split into phases (input norm, scoring,
#      top-K, gather, attention kernel, projections, MLP, scatter) against each phase's ideal
#      (harness/speed/phase_profile.py);
#   2. prefill of dense, SLEB, the paper's rule, the router and the router searched under it at 20% and 10%,
#      side by side (interleaved rounds) at 1k, 4k and 8k tokens, as studies/router/evidence.sh times them.
# Writes OUT_DIR/layer-phases-MODEL.json and OUT_DIR/prefill-MODEL-LEVEL.json (default scripts/results/selection-speed),
# each with the machine's load before and after, the versions and the commit.
#   scripts/selection_speed.sh [OUT_DIR]    MODEL=smollm2-135m LEVELS="0.2 0.1" REPEATS=5 THREADS=2 (about 20 minutes)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/scripts/results/selection-speed}
PY=${PYTHON:-$ROOT/.venv/bin/python}
M=${MODEL:-smollm2-135m}
THREADS=${THREADS:-2}
REPEATS=${REPEATS:-5}
mkdir -p "$OUT"
BENCH=("$PY" -m orthorank.harness.cli.main bench --model "$M" --dtype bfloat16 --threads "$THREADS" --overwrite)
"${BENCH[@]}" --mode layer --profile --methods dense,orthorank --plan "$ROOT/plans/$M/router-searched-0.2.json" \
  --seq-len 1024,4096,8192 --repeats "$REPEATS" --json "$OUT/layer-phases-$M.json" > "$OUT/layer-phases-$M.log" 2>&1
for s in ${LEVELS:-0.2 0.1}; do
  "${BENCH[@]}" --mode prefill --methods dense,sleb,orthorank,router,router-searched --sparsity "$s" \
    --seq-len 1024,4096,8192 --repeats "$REPEATS" --json "$OUT/prefill-$M-$s.json" > "$OUT/prefill-$M-$s.log" 2>&1
done
