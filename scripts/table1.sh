#!/usr/bin/env bash
# The paper's Table 1 on the embedded model: dense, SLEB, Shortened-PPL, ShortGPT and OrthoRank (compute-matched)
# at 10% and 20%, OrthoRank's ablations at 20%, on WikiText-2 (raw test) and C4 (its standard 256 x 2048 tokens),
# seq-len 2048, bfloat16, 95% bootstrap intervals and paired ratios. Every finished window is kept in the result
# store, so the run resumes where it stopped; raise MAX_WINDOWS (or unset it for every window) to extend it.
#   MAX_WINDOWS=40 scripts/table1.sh        # the committed table (first 40 windows of each set)
#   torchrun --nproc-per-node 2 ...            # the same command split across processes (see docs/design.md)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_WINDOWS=${MAX_WINDOWS-40}
OUT=${OUT:-scripts/results/table1-smollm2-135m${MAX_WINDOWS:+-w$MAX_WINDOWS}}
${ORTHORANK:-.venv/bin/orthorank} compare --model smollm2-135m --dtype bfloat16 \
  --methods dense,sleb,shortened-ppl,shortgpt,orthorank --sparsity 0.1,0.2 --datasets wikitext2,c4 \
  --seq-len 2048 ${MAX_WINDOWS:+--max-windows $MAX_WINDOWS} --ablations --ablation-levels 0.2 \
  --store "${STORE:-scripts/results/store}" --threads "${THREADS:-2}" --out "$OUT" --overwrite
