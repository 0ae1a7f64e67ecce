#!/usr/bin/env bash
# Plans searched under the router (issue 43 item 3), resumable: each step is skipped when its output exists.
# 1. A router bank on the dense model for every inner layer (`fit-router --layers inner`, one target: the one the
#    20% fit chose on OrthoRank's layers, loss-abs on both models; calibration text only, one recording pass).
# 2. The greedy layer search under that bank (`calibrate --method orthorank --policy router --router BANK`) at 10%
#    and 20%, compute matched with the router's FLOPs. bfloat16 to halve its time on 2 cores (the committed
#    OrthoRank plans were searched in float32; every comparison below runs in bfloat16).
# 3. The router refitted on each plan found, under its own selection, every target, compute matched exactly to
#    SLEB's (plans/<model>/router-searched-<s>.json), in the dtype of the committed router fits.
# 4. compare against SLEB, the paper's rule and the router on OrthoRank's layers on windows 33-48 of every domain
#    (no fit, search or choice saw them), bfloat16.
#   studies/router/searched.sh [MODEL ...]     (default: smollm2-135m gemma3-270m)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
MODELS=${*:-smollm2-135m gemma3-270m}
for m in $MODELS; do
  d=studies/router/$m/searched
  mkdir -p $d
  if [ "$m" = gemma3-270m ]; then bs=2 samples=16 fitdt=bfloat16; else bs=4 samples=32 fitdt=float32; fi
  bank=$d/bank.json
  [ -f $bank ] || { $O fit-router --model $m --plan plans/$m/orthorank-0.2.json --layers inner --targets loss-abs \
      --iterations 1 --calib-samples $samples --batch-size $bs --dtype bfloat16 --threads 2 --json $bank.tmp --overwrite \
      > $d/bank.out 2> $d/bank.log && mv $bank.tmp $bank; }
  [ -f $d/search/orthorank-0.2.json ] || $O calibrate --model $m --method orthorank --policy router --router $bank \
      --sparsity 0.1,0.2 --cost-seq-len 512 --dtype bfloat16 --threads 2 --out $d/search 2> $d/search.log
  for s in 0.1 0.2; do
    p=plans/$m/router-searched-$s.json
    [ -f $p ] || { $O fit-router --model $m --plan $d/search/orthorank-$s.json --json $p.tmp --overwrite \
        --calib-samples $samples --iterations $([ $m = gemma3-270m ] && echo 1 || echo 2) --batch-size $bs \
        --dtype $fitdt --threads 2 --match-compute-of plans/$m/sleb-$s.json --cost-seq-len 512 \
        > $d/refit-$s.out 2> $d/refit-$s.log && mv $p.tmp $p; }
  done
  [ -f $d/compare/compare.json ] || $O compare --model $m --methods sleb,orthorank,router,router-searched \
    --sparsity 0.1,0.2 --datasets wikitext2,c4,code,news --seq-len 512 --skip-windows 32 --max-windows 16 \
    --batch-size $bs --dtype bfloat16 --threads 2 --out $d/compare --overwrite 2> $d/compare.log
done
