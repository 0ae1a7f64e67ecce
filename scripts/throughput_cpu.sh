#!/usr/bin/env bash
# CPU throughput, side by side: dense vs layer removal ("sleb") vs OrthoRank at sparsity 0.2, layers spread evenly.
#   1. the embedded SmolLM2-135M (float32, as `--dtype auto` loads it on CPU): prefill 4 x 1024, decode batch 1
#      (prompt 256, 32 new tokens), and one decoder layer alone at 4 x 1024;
#   2. the Llama-2-7B and Llama-3-8B shapes cut to 10 layers (random weights, bfloat16): prefill 1 x 1024
#      (2 layers removed vs 3 selection layers), and one decoder layer alone, selective vs dense, against the cost
#      model's f_kv + (1 - f_kv) * r.
# Writes OUT_DIR/cpu-*.json and OUT_DIR/cpu-summary.md (the docs/results.md table).
#
# Usage: scripts/throughput_cpu.sh [OUT_DIR]   (default scripts/results; about 20 minutes)
# CPU timings move with whatever else runs on the machine: each run records the load average before and after.
# One thread by default (THREADS=2 to change): on a shared 2-core machine, two OpenMP threads wait for each other
# at every op whenever one is descheduled, which hits the selective layer's many small ops hardest.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/scripts/results}
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS
mkdir -p "$OUT"
BENCH=("$PY" -m orthorank.harness.cli.main bench --device cpu --overwrite --threads "$THREADS")

"${BENCH[@]}" --model smollm2-135m --mode prefill,decode,layer --batch-size 4 --decode-batch-size 1 --seq-len 1024 \
  --prompt-len 256 --new-tokens 32 --warmup 1 --repeats 9 --json "$OUT/cpu-smollm2-135m.json"

for shape in llama2-7b llama3-8b; do
  "${BENCH[@]}" --model "$shape" --num-layers 10 --dtype bfloat16 --mode prefill,layer --batch-size 1 --seq-len 1024 \
    --warmup 1 --repeats 7 --json "$OUT/cpu-$shape-10layers.json"
done

"$PY" -m orthorank.harness.reports.speed "$OUT"/cpu-*.json | tee "$OUT/cpu-summary.md"
