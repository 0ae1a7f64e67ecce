#!/usr/bin/env bash
# Issue 58: decoding under torch.compile with a static cache, beside eager decoding, in one bench: dense, SLEB and
# the two causal router plans (on the layers searched under the router, and on OrthoRank's layers) at batch 1,
# 64 greedy steps after 256-token prompts of calibration text, ROUNDS interleaved rounds per implementation (eager
# first, then compile; each method compiles its own copy of the model once, untimed). A causal layer's decision is
# host arithmetic (method/one_token_step.py) and runs eagerly between the compiled parts of the step.
#   studies/decode-router/compile.sh [MODEL ...]   (default smollm2-135m; LEVELS="0.2"; ROUNDS=5)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
for m in ${*:-smollm2-135m}; do
  for s in ${LEVELS:-0.2}; do
    f=studies/decode-router/$m/compile/bench-decode-$s-b1-n64
    mkdir -p "$(dirname $f)"
    [ -f $f.json ] || $O bench --model $m --sparsity $s --methods dense,sleb,router-searched-causal,router-causal \
      --mode decode --decode-impl eager,compile --batch-size 1 --seq-len 256 --new-tokens 64 --repeats ${ROUNDS:-5} \
      --prompt-text mix --dtype bfloat16 --threads 2 --json $f.json > $f.log 2>&1
  done
done
