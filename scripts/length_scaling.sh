#!/usr/bin/env bash
# How a selection layer's cost follows the prompt length (attention's share grows with it): one decoder layer alone,
# dense against the same layer as a selection layer (ratio 0.33), interleaved rounds, on random-weight shapes; and
# the attention of the selected queries alone, as selection layers run it (masked SDPA) and split into an unmasked
# prefix and a masked diagonal (method/attention_split.py), against the dense layer's causal kernel.
# Thin calls of `orthorank bench --mode layer --seq-len L1,L2,...`; the table is `python -m orthorank.harness.reports.speed`.
#
# Usage: scripts/length_scaling.sh [OUT_DIR]   (default scripts/results/length-scaling; ~25 min on 2 cores)
#   PROFILE=1 adds a torch.profiler breakdown per row (self time per operator family, and how far each family is
#   from its share of the ideal); REPEATS (default 3) and BIG_REPEATS (the 7B/8B shapes, default 2) set the rounds.
# Run it alone: two processes sharing two cores time each other.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/scripts/results/length-scaling}
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
THREADS=${THREADS:-2}
DTYPE=${DTYPE:-float32}
REPEATS=${REPEATS:-3}
BIG_REPEATS=${BIG_REPEATS:-2}
mkdir -p "$OUT"
BENCH=("$PY" -m orthorank.harness.cli.main bench --device cpu --overwrite --threads "$THREADS" --dtype "$DTYPE" --mode layer
       --warmup 1)
if [[ ${PROFILE:-0} == 1 ]]; then BENCH+=(--profile); fi

"${BENCH[@]}" --model smollm2-135m-shape --num-layers 2 --seq-len 1024,2048,4096,8192,16384,32768 \
  --repeats "$REPEATS" --json "$OUT/smollm2-135m-shape.json"
# Gemma 3: five sliding-window layers to one full one; layer 5 is full, layer 1 sliding (window 512)
for index in 1 5; do
  "${BENCH[@]}" --model gemma3-270m-shape --num-layers 6 --layer-index "$index" \
    --seq-len 1024,4096,16384,32768 --repeats "$REPEATS" --json "$OUT/gemma3-270m-shape-layer$index.json"
done
# 7B/8B shapes: one dense layer at 16k tokens takes minutes on this CPU; 1k and 4k here
for shape in llama2-7b llama3-8b; do
  "${BENCH[@]}" --model "$shape" --num-layers 2 --seq-len 1024,4096 --repeats "$BIG_REPEATS" --json "$OUT/$shape.json"
done

"$PY" -m orthorank.harness.reports.speed --brief "$OUT"/*.json | tee "$OUT/length-scaling.md"
