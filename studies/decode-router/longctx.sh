#!/usr/bin/env bash
# Issue 58: long-context answers under causal decoding. The offline suite (needles, multi-key, multi-value, variable
# tracking, common words) at LENGTHS, SAMPLES prompts per task, each plan under the decode policy it is deployed with
# (--decode-modes own): dense, SLEB, the top-K router plan (dense decoding, the library's default) and the causal
# router plan on the same layers (every prompt token and every generated token decided by its threshold). Generated
# tokens are where the causal plan's thresholds, set on text, update about a tenth of the tokens instead of a third:
# this is the test of what that costs. Per-item answers go to the result store, so a stopped run resumes.
#   studies/decode-router/longctx.sh [MODEL ...]   (default smollm2-135m; LEVELS="0.2"; LENGTHS=1k; SAMPLES=20)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
MODELS=${*:-smollm2-135m}
LENGTHS=${LENGTHS:-1k}
SAMPLES=${SAMPLES:-20}
for m in $MODELS; do
  for s in ${LEVELS:-0.2}; do
    d=studies/decode-router/$m/longctx-$s-${LENGTHS//,/-}-s$SAMPLES
    [ -f $d/longctx.json ] && continue
    $O longctx --model $m --sparsity $s --methods dense,sleb,router-searched,router-searched-causal \
      --decode-modes own --lengths $LENGTHS --samples $SAMPLES --batch-size 4 --dtype bfloat16 --threads 2 \
      --store studies/decode-router/store --out $d --overwrite 2> $d.log
  done
done
