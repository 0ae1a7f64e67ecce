#!/usr/bin/env bash
# After evidence.sh: the router stage of both committed standard studies (their report and claims gain the router's
# rows), the router's spread over fits with other seeds and its transfer matrix (SmolLM2-135M, 20%), zero-shot and
# the offline long-context suite at 20% (the winning router plan of each model against SLEB), then prefill speed of
# Gemma's router plans at 1k and 4k (8k takes about 20 minutes more on 2 cores). Resumable: finished steps are
# skipped. Evaluation windows are windows 33-48 of 512 tokens as in evidence.sh; no fit reads them.
#   studies/router/extra.sh [STEP ...]    (default: study seeds transfer zeroshot longctx bench; gemma-seeds and
#   gemma-transfer when named)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
STEPS=${*:-study seeds transfer zeroshot longctx bench}
EVAL=(--datasets wikitext2,c4,code,news --seq-len 512 --skip-windows 32 --max-windows 16 --dtype bfloat16 --threads 2)
want() { [[ " $STEPS " == *" $1 "* ]]; }
# the plan each model's router claims rest on at 20%: OrthoRank's layers on SmolLM2, the hybrid plan's on Gemma
best() { [ "$1" = gemma3-270m ] && echo router-hybrid || echo router; }

if want study; then
  for m in smollm2-135m gemma3-270m; do
    $O study --model $m --budget standard --dtype float32 --threads 2 --out studies/$m --stages router \
      2> studies/router/$m/study-router.log
  done
fi

m=smollm2-135m
if want seeds; then  # the 20% router fitted again with seeds 1 and 2 (other calibration windows and held-out split)
  for seed in 1 2; do
    d=studies/router/$m/seed-$seed
    mkdir -p $d/plans
    [ -f $d/plans/router-0.2.json ] || { $O fit-router --model $m --plan plans/$m/orthorank-0.2.json \
        --json $d/plans/router-0.2.json.tmp --overwrite --seed $seed --iterations 2 --batch-size 4 --threads 2 \
        --match-compute-of plans/$m/sleb-0.2.json --cost-seq-len 512 > $d/fit.json 2> $d/fit.log \
        && mv $d/plans/router-0.2.json.tmp $d/plans/router-0.2.json; }
    cp -n plans/$m/sleb-0.2.json $d/plans/
    [ -f $d/compare/compare.json ] || $O compare --model $m --methods sleb,router --sparsity 0.2 "${EVAL[@]}" \
      --batch-size 4 --plans-dir $d/plans --out $d/compare --overwrite 2> $d/compare.log
  done
fi

if want gemma-seeds; then  # Gemma 3 270M's 20% router (on the hybrid plan's layers) fitted again with seeds 1 and 2
  g=gemma3-270m
  for seed in 1 2; do
    d=studies/router/$g/seed-$seed
    mkdir -p $d/plans
    [ -f $d/plans/router-hybrid-0.2.json ] || { $O fit-router --model $g --plan plans/$g/hybrid-0.2.json \
        --json $d/plans/router-hybrid-0.2.json.tmp --overwrite --seed $seed --iterations 2 --batch-size 2 \
        --calib-samples 16 --dtype bfloat16 --threads 2 --match-compute-of plans/$g/sleb-0.2.json --cost-seq-len 512 \
        > $d/fit.json 2> $d/fit.log && mv $d/plans/router-hybrid-0.2.json.tmp $d/plans/router-hybrid-0.2.json; }
    cp -n plans/$g/sleb-0.2.json $d/plans/
    [ -f $d/compare/compare.json ] || $O compare --model $g --methods sleb,router-hybrid --sparsity 0.2 "${EVAL[@]}" \
      --batch-size 2 --plans-dir $d/plans --out $d/compare --overwrite 2> $d/compare.log
  done
fi

if want gemma-transfer; then  # Gemma 3 270M: the router refitted on each calibration source, the hybrid plan's layers
  # and removals held fixed (per-source hybrid searches take hours each on 2 cores), evaluated on every domain against
  # the committed SLEB (mix 8K): does the router overfit the text it is fitted on?
  g=gemma3-270m
  for src in c4 wikitext2 code mix; do
    d=studies/router/$g/transfer/$src-8k
    mkdir -p $d/plans
    cp -n plans/$g/sleb-0.2.json plans/$g/hybrid-0.2.json $d/plans/
    [ -f $d/plans/router-hybrid-0.2.json ] || { $O fit-router --model $g --plan plans/$g/hybrid-0.2.json \
        --calib-data $src --json $d/plans/router-hybrid-0.2.json.tmp --overwrite --iterations 2 --batch-size 2 \
        --calib-samples 16 --dtype bfloat16 --threads 2 --match-compute-of plans/$g/sleb-0.2.json --cost-seq-len 512 \
        > $d/fit.json 2> $d/fit.log && mv $d/plans/router-hybrid-0.2.json.tmp $d/plans/router-hybrid-0.2.json; }
    [ -f $d/compare/compare.json ] || $O compare --model $g --methods sleb,hybrid,router-hybrid --sparsity 0.2 \
      "${EVAL[@]}" --batch-size 2 --plans-dir $d/plans --out $d/compare --overwrite 2> $d/compare.log
  done
fi

if want transfer; then  # the router calibrated on each source of the transfer matrix, on that source's OrthoRank plan
  for src in c4-8k wikitext2-8k code-8k mix-8k; do
    data=${src%-8k}
    d=studies/router/$m/transfer/$src
    mkdir -p $d/plans
    cp -n plans/$m/transfer/$src/sleb-0.2.json plans/$m/transfer/$src/orthorank-0.2.json $d/plans/
    [ -f $d/plans/router-0.2.json ] || { $O fit-router --model $m --plan plans/$m/transfer/$src/orthorank-0.2.json \
        --calib-data $data --json $d/plans/router-0.2.json.tmp --overwrite --iterations 1 --batch-size 4 --threads 2 \
        --match-compute-of plans/$m/transfer/$src/sleb-0.2.json --cost-seq-len 512 > $d/fit.json 2> $d/fit.log \
        && mv $d/plans/router-0.2.json.tmp $d/plans/router-0.2.json; }
    [ -f $d/compare/compare.json ] || $O compare --model $m --methods sleb,orthorank,router --sparsity 0.2 \
      "${EVAL[@]}" --batch-size 4 --plans-dir $d/plans --out $d/compare --overwrite 2> $d/compare.log
  done
fi

for m in smollm2-135m gemma3-270m; do
  bs=16; [ "$m" = gemma3-270m ] && bs=8
  if want zeroshot; then
    z=studies/router/$m/zeroshot
    [ -f $z/compare.json ] || $O compare --model $m --methods dense,sleb,orthorank,$(best $m) --sparsity 0.2 --no-ppl \
      --seq-len 512 --zeroshot --tasks piqa,winogrande,hellaswag,arc_easy,arc_challenge --limit 100 \
      --zeroshot-batch-size $bs --dtype bfloat16 --threads 2 --out $z --overwrite 2> studies/router/$m/zeroshot.log
  fi
  if want longctx; then
    l=studies/router/$m/longctx-0.2
    [ -f $l/longctx.json ] || $O longctx --model $m --methods dense,sleb,orthorank,$(best $m) --sparsity 0.2 \
      --lengths 1k --samples 6 --batch-size 6 --dtype bfloat16 --threads 2 --out $l --overwrite \
      2> studies/router/$m/longctx.log
  fi
done

if want bench; then
  m=gemma3-270m
  for s in 0.1 0.2; do
    rows=dense,sleb,orthorank,router
    [ -f plans/$m/router-hybrid-$s.json ] && rows=$rows,hybrid,router-hybrid
    b=studies/router/$m/bench-$s.json
    [ -f $b ] || $O bench --model $m --methods $rows --sparsity $s --mode prefill --seq-len 1024,4096 --repeats 5 \
      --dtype bfloat16 --threads 2 --json $b --overwrite 2> studies/router/$m/bench-$s.log
  done
fi
