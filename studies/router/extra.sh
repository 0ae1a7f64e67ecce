#!/usr/bin/env bash
# After evidence.sh: the router stage of both committed standard studies (their report and claims gain the router's
# rows), then zero-shot and the offline long-context suite at 20% (router against SLEB and the paper's rule), then
# the router's spread over fits with other seeds (SmolLM2-135M, 20%). Resumable: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
for m in smollm2-135m gemma3-270m; do
  $O study --model $m --budget standard --dtype float32 --threads 2 --out studies/$m --stages router \
    2> studies/router/$m/study-router.log
done
for m in smollm2-135m gemma3-270m; do
  bs=16; [ "$m" = gemma3-270m ] && bs=8
  z=studies/router/$m/zeroshot
  [ -f $z/compare.json ] || $O compare --model $m --methods dense,sleb,orthorank,router --sparsity 0.2 --no-ppl \
    --seq-len 512 --zeroshot --tasks piqa,winogrande,hellaswag,arc_easy,arc_challenge --limit 100 \
    --zeroshot-batch-size $bs --dtype bfloat16 --threads 2 --out $z --overwrite 2> studies/router/$m/zeroshot.log
  l=studies/router/$m/longctx-0.2
  [ -f $l/longctx.json ] || $O longctx --model $m --methods dense,sleb,orthorank,router --sparsity 0.2 \
    --lengths 1k --samples 6 --batch-size 6 --dtype bfloat16 --threads 2 --out $l --overwrite 2> studies/router/$m/longctx.log
done
m=smollm2-135m
for seed in 1 2; do
  d=studies/router/$m/seed-$seed
  mkdir -p $d/plans
  [ -f $d/plans/router-0.2.json ] || { $O fit-router --model $m --plan plans/$m/orthorank-0.2.json \
      --out $d/plans/router-0.2.json.tmp --overwrite --seed $seed --iterations 1 --threads 2 \
      --match-compute-of plans/$m/sleb-0.2.json --cost-seq-len 512 > $d/fit.json 2> $d/fit.log \
      && mv $d/plans/router-0.2.json.tmp $d/plans/router-0.2.json; }
  cp -n plans/$m/sleb-0.2.json $d/plans/ 2>/dev/null || true
  [ -f $d/compare/compare.json ] || $O compare --model $m --methods sleb,router --sparsity 0.2 \
    --datasets wikitext2,c4,code,news --seq-len 512 --skip-windows 16 --max-windows 16 --batch-size 4 --dtype bfloat16 \
    --plans-dir $d/plans --threads 2 --out $d/compare --overwrite 2> $d/compare.log
done
