#!/usr/bin/env bash
# Prefill speed of Gemma 3 270M's 20% router plan, which is a hybrid plan (removed layers plus per-layer keep
# ratios): `bench` times plans with one keep ratio only, so this times it as the study's hybrid stage does, with
# `compare --measure-speed` (dense and every plan interleaved in each round on one window, the median of the
# per-round speed-ups over dense and their range). Perplexity of that one window comes with it and is not evidence.
# Resumable. Run it on a quiet machine.
#   studies/router/speed-hybrid.sh [LENGTH ...]     (default: 1024 4096 8192)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
m=gemma3-270m
for T in ${*:-1024 4096 8192}; do
  d=studies/router/$m/speed-0.2-$T
  [ -f $d/compare.json ] || $O compare --model $m --methods sleb,orthorank,hybrid,router-hybrid --sparsity 0.2 \
    --datasets wikitext2 --seq-len $T --max-windows 1 --measure-speed 9 --dtype bfloat16 --threads 2 --no-store \
    --out $d --overwrite 2> studies/router/$m/speed-0.2-$T.log
done
