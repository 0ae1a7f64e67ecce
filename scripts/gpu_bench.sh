#!/usr/bin/env bash
# Throughput on one GPU, side by side: dense vs layer removal (ceil(0.2 L) evenly spread layers) vs OrthoRank
# (evenly spread selection layers at ratio 0.33, compute-matched) vs a hybrid (half of removal's layers removed,
# selection layers for the other half's compute), bfloat16, random weights:
#   - prefill, batch 32 x 2048 (halved until it fits), plus one decoder layer alone (dense vs selective, with one
#     query chunk, the scoring/top-K step alone, and a profiler table of each), for llama2-7b, llama3-8b, mistral-7b;
#   - the same for the gemma3-270m shape (sliding-window and full layers, a 262k-token LM head);
#   - prefill with the norm selection policy and with keep-recent 64 (llama2-7b);
#   - decode, batch 1 and 32, prompt 512, 32 new tokens, same shapes (dense decode policy, and threshold), eager and
#     with a static cache and the step compiled (--decode-impl eager,compile: CUDA graphs under Inductor).
# Writes one JSON (and a log) per invocation to OUT_DIR, then OUT_DIR/summary.md (Markdown tables).
#
# Usage: scripts/gpu_bench.sh OUT_DIR
# Needs only torch and transformers (no pip install: runs from the source tree with PYTHONPATH=src).
# Budget: about 7-8 minutes on an H200 (later runs are skipped when it is spent); runs that would start after GPU_BENCH_BUDGET_S seconds (default 400; the CPU smoke test: 850)
# are skipped, and each invocation is killed at the remaining budget, so the script ends within ~8 minutes.
# GPU_BENCH_TINY=1: a CPU smoke test with a tiny shape (used by tests/harness/test_bench.py).
set -uo pipefail

OUT=${1:?usage: scripts/gpu_bench.sh OUT_DIR}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)

if [[ "${GPU_BENCH_TINY:-0}" == "1" ]]; then
  SHAPES=(smollm2-135m-shape gemma3-270m-shape)
  COMMON=(--num-layers 4 --device cpu --dtype float32 --sparsity 0.25)
  PREFILL=(--batch-size 2 --seq-len 64 --warmup 1 --repeats 2)
  DECODE=(--batch-size 1,2 --seq-len 32 --new-tokens 4 --warmup 1 --repeats 2)
  IMPLS=eager,static  # compiling on a CPU takes minutes; the GPU run compiles
  # a smoke test checks that every run works, not how fast: its budget is the test's own timeout, so a busy
  # machine slows it down instead of skipping runs
  BUDGET=${GPU_BENCH_BUDGET_S:-850}
else
  BUDGET=${GPU_BENCH_BUDGET_S:-400}
  SHAPES=(llama2-7b llama3-8b mistral-7b gemma3-270m-shape)
  COMMON=(--dtype bfloat16 --sparsity 0.2)
  PREFILL=(--batch-size 32 --seq-len 2048 --warmup 1 --repeats 5 --fit-batch)
  DECODE=(--batch-size 1,32 --seq-len 512 --new-tokens 32 --warmup 1 --repeats 4 --fit-batch)
  IMPLS=eager,compile
fi

# Environment, and which entry point works: the full CLI imports every subcommand; if one of them needs a package
# this machine lacks, fall back to the bench subcommand alone.
"$PY" - >"$OUT/environment.txt" 2>&1 <<'EOF'
import platform, torch, transformers
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.1f} GiB", "capability", f"{p.major}.{p.minor}")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi >>"$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
if "$PY" -c "import orthorank.harness.cli.main as m; m.build_parser()" >"$OUT/preflight.log" 2>&1; then
  ENTRY=(-m orthorank.harness.cli.main bench)
else
  echo "warning: the full CLI does not import here (see $OUT/preflight.log); using python -m orthorank.harness.cli.bench"
  ENTRY=(-m orthorank.harness.cli.bench)
fi

FAILED=0
run() {  # run NAME ARGS...: one bench invocation, JSON to OUT/NAME.json, log to OUT/NAME.log
  local name=$1; shift
  local left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 20)); then
    echo "=== $name: skipped, time budget spent" | tee "$OUT/$name.skipped"
    return
  fi
  echo "=== $name ($((left))s of budget left)"
  timeout --signal=INT --kill-after=15 "$((left + 20))" \
    "$PY" "${ENTRY[@]}" "$@" --json "$OUT/$name.json" --overwrite 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if ((rc != 0)); then
    echo "=== $name: exit status $rc" | tee -a "$OUT/$name.log"
    FAILED=1
  fi
}

for shape in "${SHAPES[@]}"; do
  run "prefill-$shape" --model "$shape" "${COMMON[@]}" --mode prefill,layer --profile "${PREFILL[@]}" \
    --methods dense,spread-prune,spread-orthorank,spread-hybrid
done
for shape in "${SHAPES[@]}"; do
  run "decode-$shape" --model "$shape" "${COMMON[@]}" --mode decode "${DECODE[@]}" --decode-impl "$IMPLS"
done
# selection policies beyond the paper's rule (the norm rule and keeping the last 64 tokens cost extra work per layer)
run "prefill-policies-${SHAPES[0]}" --model "${SHAPES[0]}" "${COMMON[@]}" --mode prefill "${PREFILL[@]}" \
  --methods dense,spread-orthorank --policy norm
run "prefill-keep-recent-${SHAPES[0]}" --model "${SHAPES[0]}" "${COMMON[@]}" --mode prefill "${PREFILL[@]}" \
  --methods dense,spread-orthorank --keep-recent 64
for shape in "${SHAPES[@]}"; do  # the threshold policy (random weights: the share it skips is not a model's)
  run "decode-threshold-$shape" --model "$shape" "${COMMON[@]}" --methods dense,spread-orthorank --decode threshold \
    --mode decode "${DECODE[@]}"
done

"$PY" -m orthorank.harness.reports.speed "$OUT" >"$OUT/summary.md" 2>>"$OUT/preflight.log" && cat "$OUT/summary.md"
echo "total $(($(date +%s) - START))s; results in $OUT"
exit $FAILED
