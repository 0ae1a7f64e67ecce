#!/usr/bin/env bash
# The shipped long-prompt preset, checked on the evaluation samples (issue 45): chosen on calibration prompts
# (calibrate.sh), it gets its own row beside dense on the needle items of the evaluation runs (run.sh: same tasks,
# seed and item counts, so dense's scores come back from the result store) and LongBench multi_news, at each model
# and length. Timed in 3 interleaved rounds after a warm-up.
#   studies/long-prompt/check-preset.sh [MODEL:LENGTH ...]   (default: both models at 4k and 8k)
set -euo pipefail
cd "$(dirname "$0")/../.."
O=${O:-.venv/bin/orthorank}
T=${THREADS:-2}
RUNS=${*:-smollm2-135m:4096 smollm2-135m:8192 gemma3-270m:4096 gemma3-270m:8192}
for run in $RUNS; do
  m=${run%%:*}
  len=${run##*:}
  samples=5; [ "$len" = 4096 ] && samples=10   # as the evaluation runs
  d=studies/long-prompt/preset-check/$m/$len
  settings="--methods dense --preset long-prompt --samples $samples --repeats 3 --longbench 3 --longbench-new-tokens 64"
  if [ -f $d/frontier.json ] && grep -q '"complete": true' $d/frontier.json && [ -f $d/settings.txt ] \
      && [ "$(cat $d/settings.txt)" = "$settings" ] && cmp -s src/orthorank/presets/long-prompt.json $d/preset.json; then
    continue
  fi
  mkdir -p $d
  # shellcheck disable=SC2086
  $O frontier --model $m --dtype bfloat16 --threads $T --lengths $len $settings \
    --plans-dir studies/long-prompt/plans/$m --out $d --overwrite > $d/frontier.log 2>&1
  cp src/orthorank/presets/long-prompt.json $d/preset.json
  printf '%s' "$settings" > $d/settings.txt
done
