#!/usr/bin/env bash
# Issue 58: the causal router, a first measurement. Resumable: each step is skipped when its output exists.
# 1. Thresholds fitted on calibration text (the default mix, 32 windows of 512 tokens, a quarter held out) for the
#    router plan on the layers searched under it (router-searched-<s>.json, compute-matched to SLEB), each layer
#    updating its keep ratio of the calibration tokens: plans/<model>/router-searched-causal-<s>.json.
# 2. Quality on windows 33-48 of every domain (no fit, search or choice saw them), against dense, SLEB, ShortGPT and
#    the top-K router plan, paired per window. A causal plan's teacher-forced perplexity is the quality its
#    generation gets (the decisions are the same, tests/method/test_causal_router.py), as it is for layer removal.
# 3. Decode speed side by side after 256-token prompts of calibration text (a causal router's skips depend on the
#    text, so no random tokens): batch 1 with 128 greedy steps and batch 32 with 32, 5 interleaved rounds, the
#    causal row's ideal taken at the share of decoded tokens it updated.
# Where the router fit declined the router for a level (Gemma 3 270M at 10%: router-searched-0.1.json keeps the paper's
# rule), a router is fitted on the same layers anyway (fit-router --always-route, re-matched to the same compute:
# router-searched-forced-<s>.json; the study's decode-router stage names its own, on OrthoRank's layers,
# router-forced-<s>.json), since the paper's top-K rule is not causal and cannot decode per token.
#   studies/decode-router/run.sh [MODEL ...]   (default smollm2-135m; LEVELS="0.1 0.2"; BENCH=0; REPEATS=5 timing
#   rounds; SPECS="1:128 32:32" the batch:new-tokens benches; delete a bench's json to time it again; REPLICATE=1
#   writes a second run of each bench to $MODEL/replicate/, which the summary also requires to agree)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
MODELS=${*:-smollm2-135m}
LEVELS=${LEVELS:-0.2}
BENCH=${BENCH:-1}   # BENCH=0: fits and quality only (timings need a quiet machine)
for m in $MODELS; do
  d=studies/decode-router/$m
  mkdir -p $d
  for s in $LEVELS; do
    out=plans/$m/router-searched-causal-$s.json
    base=plans/$m/router-searched-$s.json
    if ! grep -q '"policy": "router"' $base; then
      forced=plans/$m/router-searched-forced-$s.json
      if [ ! -f $forced ]; then
        $O fit-router --model $m --plan $base --always-route --json $forced.tmp --overwrite --dtype bfloat16 \
          --threads 2 > $d/fit-router-searched-forced-$s.log 2>&1
        mv $forced.tmp $forced
      fi
      base=$forced
    fi
    if [ ! -f $out ]; then
      $O fit-thresholds --model $m --plan $base --out $out.tmp --overwrite \
        --dtype bfloat16 --threads 2 > $d/fit-thresholds-$s.json 2> $d/fit-thresholds-$s.log
      mv $out.tmp $out
    fi
    [ -f $d/compare-$s/compare.json ] || $O compare --model $m --sparsity $s \
      --methods dense,sleb,shortgpt,router-searched,router-searched-causal --datasets wikitext2,c4,code,news \
      --seq-len 512 --skip-windows 32 --max-windows 16 --batch-size 4 --dtype bfloat16 --threads 2 \
      --out $d/compare-$s --overwrite 2> $d/compare-$s.log
    # batch 1: 128 new tokens; batch 32: 32 (a first look: 128 at batch 32 takes about 20 minutes on 2 cores)
    [ "$BENCH" = 1 ] || continue
    for spec in ${SPECS:-1:128 32:32}; do
      b=${spec%%:*}; n=${spec##*:}; f=$d${REPLICATE:+/replicate}/bench-decode-$s-b$b-n$n
      mkdir -p "$(dirname $f)"
      [ -f $f.json ] || $O bench --model $m --sparsity $s --methods dense,sleb,shortgpt,router-searched-causal \
        --mode decode --batch-size $b --seq-len 256 --new-tokens $n --repeats ${REPEATS:-5} --prompt-text mix --dtype bfloat16 \
        --threads 2 --json $f.json > $f.log 2>&1
    done
  done
done
