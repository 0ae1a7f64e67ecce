#!/usr/bin/env bash
# The router's evidence (issue 43), resumable: each step is skipped when its output exists. Fits routers on the
# committed plans' layers (calibration text only: 32 windows of 512 tokens of the default mix), then compares them
# with SLEB, ShortGPT, Shortened-PPL and the paper's rule on windows 16-47 of every domain (no fit or choice saw them).
#   studies/router/run.sh [MODEL ...]     (default: smollm2-135m gemma3-270m)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
MODELS=${*:-smollm2-135m gemma3-270m}
for m in $MODELS; do
  bs=4; [ "$m" = gemma3-270m ] && bs=2
  for s in 0.2 0.1; do
    out=plans/$m/router-$s.json
    if [ ! -f "$out" ]; then
      mkdir -p studies/router/$m
      $O fit-router --model $m --plan plans/$m/orthorank-$s.json --out "$out.tmp" --overwrite --batch-size $bs \
        --threads 2 > studies/router/$m/fit-$s.json 2> studies/router/$m/fit-$s.log
      mv "$out.tmp" "$out"
    fi
  done
  d=studies/router/$m/compare
  if [ ! -f $d/compare.json ]; then
    $O compare --model $m --methods sleb,shortgpt,shortened-ppl,orthorank,router --sparsity 0.1,0.2 \
      --datasets wikitext2,c4,code,news --seq-len 512 --skip-windows 16 --max-windows 32 --batch-size $bs \
      --policies random,oracle,loss-oracle --threads 2 --out $d --overwrite 2> studies/router/$m/compare.log
  fi
done
