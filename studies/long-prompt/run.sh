#!/usr/bin/env bash
# The retrieval frontier (issue 45): both models at 4k and 8k tokens, bfloat16 on 2 threads, every method at 5%, 10%
# and 20% of compute, the question-scored policy (attention of the last 64 queries) and a tail chosen on calibration
# prompts on the selecting methods, 10 samples of two needle tasks, 5 interleaved timing rounds, and LongBench
# multi_news (first 5 examples, 128 new tokens) on each method's free point. Each (model, length) lands in its own
# folder; resumable (the result store keeps every generation; a finished folder is skipped). THREADS=1 while other
# jobs share the cores: the scores are the same and come back from the store when a quiet rerun times the rows.
#   studies/long-prompt/run.sh [MODEL:LENGTH ...]   (default: smollm2-135m:4k gemma3-270m:4k smollm2-135m:8k gemma3-270m:8k)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
RUNS=${*:-smollm2-135m:4k gemma3-270m:4k smollm2-135m:8k gemma3-270m:8k}
for run in $RUNS; do
  m=${run%%:*}
  len=${run##*:}
  d=studies/long-prompt/$m/$len
  if [ -f $d/frontier.json ] && grep -q '"complete": true' $d/frontier.json; then continue; fi
  mkdir -p $d
  $O frontier --model $m --dtype bfloat16 --threads ${THREADS:-2} --lengths $len \
    --methods dense,sleb,shortgpt,orthorank,depth,progressive --levels 0.05,0.1,0.2 \
    --policies attention+window=64 --tails 0,64 --samples 10 --calib-samples 8 --repeats 5 \
    --longbench 5 --longbench-new-tokens 128 --out $d --overwrite > $d/frontier.log 2>&1
done
