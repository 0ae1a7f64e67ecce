#!/usr/bin/env bash
# The retrieval frontier (issue 45): both models at 4k and 8k tokens, bfloat16, two queues at 1 thread each.
#
# Rows: dense; SLEB, OrthoRank (the paper's rule), the router, LazyLLM-style progressive pruning and local prefill
# attention with a global question tail (method/local_attention.py) at 5% to 20% (Gemma 3 270M) or 10% to 40%
# (SmolLM2-135M) of the prefill (levels: the compute of pruning that share of the layers); the question-scored policy
# (attention of the prompt's last 64 queries, SnapKV's observation window) on the OrthoRank plan. Scored on two
# needle tasks, 10 samples each (20 items) at 4k and 5 (10 items) at 8k, for time (one 8k prefill takes 35 s on one
# core); timed in 5 interleaved rounds at 4k and 3 at 8k; LongBench multi_news (first 3 examples, 64 new tokens) on each method's free
# point. A setting's levels above one that already lost against dense are not scored (--stop-after-loss: at 4k every
# selecting and pruning method's score fell with its level). Levels past 20% exist for local attention, whose share
# of the prefill grows with the prompt (at 8k SmolLM2-135M's attention is over half of a layer's FLOPs); a level out
# of a schedule's reach is logged and left out. ShortGPT is left out for time on 2 cores: it is the same family as
# SLEB and loses to it on every domain at 10% and 20% in the committed SmolLM2 study
# (studies/smollm2-135m/perplexity).
#
# Not in these runs, for time on 2 cores: the depth schedule and the tail candidates W = 0 / 64 chosen on
# calibration prompts (both are in the committed 4k SmolLM2 run, studies/long-prompt/smollm2-135m/4k: depth lost at
# every level as the paper's rule did, and both tails scored 0 on calibration prompts at 20%, so W = 0 was kept); a
# router fitted on long prompts (its fit at 4096 tokens in float32 ran over 50 minutes for SmolLM2-135M alone and
# was stopped): the router row is the committed router (plans/<model>/router-0.2.json, fitted on 512-token windows),
# linked into studies/long-prompt/plans/<model>/ beside the SLEB and OrthoRank plans.
#
# Each (model, length) lands in its own folder; resumable (the result store keeps every generation; a folder whose
# frontier.json is complete under the same settings is skipped). THREADS=1 while other jobs share the cores: the
# scores are the same and come back from the store when a quiet rerun times the rows.
#   studies/long-prompt/run.sh [MODEL:LENGTH ...]   (default: smollm2-135m:8k gemma3-270m:4k gemma3-270m:8k smollm2-135m:4k-local)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
T=${THREADS:-2}
RUNS=${*:-smollm2-135m:8k gemma3-270m:4k gemma3-270m:8k smollm2-135m:4k-local}
COMMON="--policies attention+window=64 --longbench 3 --longbench-new-tokens 64 --stop-after-loss"
# Not the depth schedule (it lost at every level at 4k on SmolLM2-135M, as the paper's rule did), for time
METHODS="--methods dense,sleb,orthorank,router,progressive,local"
settings_for() {  # $1 model:length
  case $1 in
    # SmolLM2-135M at 4k, local attention's levels to its reach (the other methods' rows are in 4k/, measured before
    # local attention existed; SLEB's rows here repeat its scores from the store)
    smollm2-135m:4k-local) echo "--methods dense,sleb,local --levels 0.05,0.1,0.2,0.3 --samples 10 --repeats 5 $COMMON" ;;
    # Gemma 3 270M: local attention reaches 5% of the prefill at most (3 full-attention layers of 18)
    gemma3-270m:4k) echo "$METHODS --levels 0.05,0.1,0.2 --samples 10 --repeats 5 $COMMON" ;;
    # at 8k, for time: no router or question-scored rows, 5% and 10% only (local attention reaches 10% at most
    # there), 3 timing rounds
    gemma3-270m:8k) echo "--methods dense,sleb,orthorank,progressive,local --levels 0.05,0.1 --samples 5 --repeats 3 ${COMMON#--policies attention+window=64 }" ;;
    # SmolLM2-135M: 5% is left out (at 4k every method but local lost there already); 10%, 20% and 40%, the last
    # for local attention; 3 timing rounds, for time
    *) echo "$METHODS --levels 0.1,0.2,0.4 --samples 5 --repeats 3 $COMMON" ;;
  esac
}

plans_dir() {  # $1 model: links to the committed SLEB, OrthoRank and router plans
  local m=$1 pd=studies/long-prompt/plans/$1
  mkdir -p $pd
  for p in sleb-0.2 orthorank-0.2 router-0.2; do ln -sfn ../../../../plans/$m/$p.json $pd/$p.json; done
}

for run in $RUNS; do
  m=${run%%:*}
  len=${run##*:}
  d=studies/long-prompt/$m/$len
  settings=$(settings_for $run)
  len=${len%-local}
  if [ -f $d/frontier.json ] && grep -q '"complete": true' $d/frontier.json && [ -f $d/settings.txt ] \
      && [ "$(cat $d/settings.txt)" = "$settings" ]; then continue; fi
  plans_dir $m
  mkdir -p $d
  # shellcheck disable=SC2086
  $O frontier --model $m --dtype bfloat16 --threads $T --lengths $len $settings \
    --plans-dir studies/long-prompt/plans/$m --out $d --overwrite > $d/frontier.log 2>&1
  printf '%s' "$settings" > $d/settings.txt
done
