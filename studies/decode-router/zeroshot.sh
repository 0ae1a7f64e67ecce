#!/usr/bin/env bash
# Issue 58: zero-shot accuracy of the causal router plans (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c; the first LIMIT
# items of each, a slice), paired item by item with dense, SLEB and the top-K router plan on the same layers. A causal
# plan decides per token in the scoring forward as it would when generating, so this is its accuracy as deployed.
# Per-item outcomes go to the result store, so a stopped run resumes where it stopped.
#   studies/decode-router/zeroshot.sh [MODEL ...]   (default smollm2-135m; LEVELS="0.1 0.2"; LIMIT=200)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
MODELS=${*:-smollm2-135m}
LIMIT=${LIMIT:-200}
for m in $MODELS; do
  for s in ${LEVELS:-0.1 0.2}; do
    d=studies/decode-router/$m/zeroshot-$s-n$LIMIT
    [ -f $d/compare.json ] && continue
    $O compare --model $m --sparsity $s --methods dense,sleb,router-searched,router-searched-causal \
      --no-ppl --zeroshot --tasks piqa,winogrande,hellaswag,arc_easy,arc_challenge --limit $LIMIT \
      --zeroshot-batch-size 16 --dtype bfloat16 --threads 2 --store studies/decode-router/store \
      --out $d --overwrite 2> $d.log
  done
done
