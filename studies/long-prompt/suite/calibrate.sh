#!/usr/bin/env bash
# Issue 55: the long-prompt preset re-earned on the RULER-grade suite, on calibration prompts only.
#
# Every task of the suite (harness/evaluation/longctx_suite.py RULER_TASKS), in all three layouts (question last, question
# first ending in "Answer:", a long question after over 100 tokens of instructions), with and without the chat
# template, built from calibration text (C4's and news' calibration parts, BoolQ's calibration rows) with the
# calibration seed. Rows: dense and local prefill attention at the level of the current preset (0.4), with its own
# spans (head 0, tail 64) and with the candidate spans below; the rule (harness/evaluation/noninferiority.py) decides which
# pass, and `python -m orthorank.harness.study.presets` chooses among those that pass. 5 interleaved timing rounds.
# Resumable through the result store, kept in this folder (studies/long-prompt/suite/store) and committed as it
# fills, so a run stopped by a session's end resumes in the next one from a clean clone.
#   studies/long-prompt/suite/calibrate.sh [MODEL:LENGTH ...]   (default: smollm2-135m:4096)
#   SAMPLES=2 SPANS=192:64 studies/long-prompt/suite/calibrate.sh ...
# SAMPLES per task, layout and template: the first run (issue 55's stop) used 2 (120 items), and dense SmolLM2-135M
# solved 23 of them at 4k, under the rule's 30, so nothing could be decided; 3 (180 items) is the default since.
set -euo pipefail
cd "$(dirname "$0")/../../.."
O=${O:-.venv/bin/orthorank}
T=${THREADS:-2}
# sliding-window layers (Gemma 3) run the exact blocked kernel in every row, dense included (issue 57); no effect on
# models without them. frontier.json records which kernel ran (sliding_kernel).
SLIDING=${SLIDING_KERNEL:-blocked}
RUNS=${*:-smollm2-135m:4096}
SAMPLES=${SAMPLES:-3}
SPANS=${SPANS:-192:64}
TASKS=$(.venv/bin/python -c "from orthorank.harness.evaluation.longctx_suite import RULER_TASKS; print(','.join(RULER_TASKS))")
for run in $RUNS; do
  m=${run%%:*}
  len=${run##*:}
  # with and without the chat template where the model's tokenizer has one (Gemma 3 270M's has none: plain only)
  case $m in gemma3-270m) chat=off ;; *) chat=${CHAT:-both} ;; esac
  d=studies/long-prompt/suite/calibration/$m/$len-s$SAMPLES  # a run per sample size: a larger one is a new run
  settings="--score-on calibration --methods dense,local --levels 0.4 --tasks $TASKS --layouts last,first,long --chat $chat --samples $SAMPLES --spans $SPANS --repeats 5"
  if [ -f $d/frontier.json ] && grep -q '"complete": true' $d/frontier.json && [ -f $d/settings.txt ] \
      && [ "$(cat $d/settings.txt)" = "$settings" ]; then continue; fi
  mkdir -p $d
  # shellcheck disable=SC2086
  $O frontier --model $m --dtype bfloat16 --threads $T --sliding-kernel $SLIDING --lengths $len $settings \
    --plans-dir studies/long-prompt/plans/$m --store studies/long-prompt/suite/store --out $d --overwrite > $d/frontier.log 2>&1
  printf '%s' "$settings" > $d/settings.txt
done
