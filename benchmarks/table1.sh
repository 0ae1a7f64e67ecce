#!/usr/bin/env bash
# The paper's Table 1 on the embedded model: dense, SLEB, Shortened-PPL, ShortGPT and OrthoRank at 10% and 20%,
# with OrthoRank's ablations, on WikiText-2 (raw test) and the C4 sample (first 1,100 documents), seq-len 2048.
# By default every window of both test sets (WikiText-2 ~140 windows, C4 ~270: many hours on 2 CPU cores).
# MAX_WINDOWS=N bounds each dataset to its first N windows (the same windows for every method).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/table1-smollm2-135m${MAX_WINDOWS:+-w$MAX_WINDOWS}}
.venv/bin/orthorank compare --model smollm2-135m \
  --methods dense,sleb,shortened-ppl,shortgpt,orthorank --sparsity 0.1,0.2 --datasets wikitext2,c4 \
  --seq-len "${SEQ_LEN:-2048}" ${MAX_WINDOWS:+--max-windows $MAX_WINDOWS} --ablations \
  --threads "${THREADS:-2}" --out "$OUT" --overwrite
