#!/usr/bin/env bash
# Issue 55: the long-prompt preset, chosen on calibration prompts (calibrate.sh, then python -m
# orthorank.harness.study.presets), checked once on the evaluation split of the RULER-grade suite: every task, all three
# layouts, with and without the chat template, dense beside the preset's row, paired item by item and judged by the
# non-inferiority rule (harness/evaluation/noninferiority.py). SAMPLES per task, layout and template (10 tasks x 3 layouts x 2
# templates x SAMPLES items); 5 interleaved timing rounds. Resumable through the committed result store.
#   studies/long-prompt/suite/check.sh [MODEL:LENGTH ...]   (default: smollm2-135m:4096)
set -euo pipefail
cd "$(dirname "$0")/../../.."
O=${O:-.venv/bin/orthorank}
T=${THREADS:-2}
# sliding-window layers (Gemma 3) run the exact blocked kernel in every row, dense included (issue 57); no effect on
# models without them. frontier.json records which kernel ran (sliding_kernel).
SLIDING=${SLIDING_KERNEL:-blocked}
RUNS=${*:-smollm2-135m:4096}
SAMPLES=${SAMPLES:-3}
TASKS=$(.venv/bin/python -c "from orthorank.harness.evaluation.longctx_suite import RULER_TASKS; print(','.join(RULER_TASKS))")
for run in $RUNS; do
  m=${run%%:*}
  len=${run##*:}
  # with and without the chat template where the model's tokenizer has one (Gemma 3 270M's has none: plain only)
  case $m in gemma3-270m) chat=off ;; *) chat=${CHAT:-both} ;; esac
  d=studies/long-prompt/suite/check/$m/$len-s$SAMPLES
  settings="--methods dense --preset long-prompt --levels 0.4 --tasks $TASKS --layouts last,first,long --chat $chat --samples $SAMPLES --repeats 5"
  if [ -f $d/frontier.json ] && grep -q '"complete": true' $d/frontier.json && [ -f $d/settings.txt ] \
      && [ "$(cat $d/settings.txt)" = "$settings" ]; then continue; fi
  mkdir -p $d
  # shellcheck disable=SC2086
  $O frontier --model $m --dtype bfloat16 --threads $T --sliding-kernel $SLIDING --lengths $len $settings \
    --plans-dir studies/long-prompt/plans/$m --store studies/long-prompt/suite/store --out $d --overwrite \
    > $d/frontier.log 2>&1
  printf '%s' "$settings" > $d/settings.txt
done
