#!/usr/bin/env bash
# Issue 45, item 2's last setting: a router fitted on long calibration prompts (8 windows of 4,096 tokens of the
# calibration mix, never evaluation text), on the committed OrthoRank plan, bfloat16, one window per forward. Each
# finished recording pass is checkpointed in the result store, so a killed fit resumes after it. The router plans land
# in studies/long-prompt/plans-long-router/<model>/router-0.2.json, beside links to the SLEB and OrthoRank plans, for
# `orthorank frontier --methods dense,router --plans-dir studies/long-prompt/plans-long-router/<model>`.
#   studies/long-prompt/fit-long-router.sh [MODEL ...]   (default: smollm2-135m gemma3-270m)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
T=${THREADS:-2}
for m in ${*:-smollm2-135m gemma3-270m}; do
  d=studies/long-prompt/plans-long-router/$m
  mkdir -p $d
  for p in sleb-0.2 orthorank-0.2; do ln -sfn ../../../../plans/$m/$p.json $d/$p.json; done
  [ -f $d/router-0.2.json ] && continue
  $O fit-router --model $m --dtype bfloat16 --threads $T --plan plans/$m/orthorank-0.2.json \
    --calib-samples 8 --seq-len 4096 --cost-seq-len 4096 --batch-size 1 --json $d/router-0.2.json \
    > $d/fit-router.log 2>&1
done
