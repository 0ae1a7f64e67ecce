#!/bin/bash
# The committed evidence, in the issues' order; every step resumes where it stopped (searches from their
# checkpoints, evaluations from the result store), so it can span sessions: run it again to go on.
#   nohup bash scripts/evidence.sh > evidence.log 2>&1 &
# float32 throughout, so that machines without native bfloat16 resume the same searches and stored windows.
set -u
cd "$(dirname "$0")/.."
O=".venv/bin/orthorank"
S="--dtype float32 --threads 2 --store scripts/results/store"
if [ -n "${WAIT_PID:-}" ]; then while kill -0 "$WAIT_PID" 2>/dev/null; do sleep 20; done; fi  # a step already running
step() { echo "=== $(date -u +%FT%TZ) $*"; "$@" || { echo "=== failed: $*"; exit 1; }; }
# 1. the transfer matrix (docs/transfer.md), then the hybrid search on the calibration it chooses
step $O study --model smollm2-135m --budget standard $S --stages transfer --out studies/smollm2-135m
# 2. that setting's hybrid plans become the committed ones the study's hybrid stage uses
chosen=$(python3 -c "import json;print(json.load(open('studies/smollm2-135m/transfer/transfer.json'))['default_calibration']['chosen'])")
for l in 0.1 0.2; do [ -f plans/smollm2-135m/hybrid-$l.json ] || cp plans/smollm2-135m/transfer/$chosen/hybrid-$l.json plans/smollm2-135m/; done
# 3. the standard studies of both shipped models (Gemma's plans searched with the default calibration), the summary
step $O study --model smollm2-135m --budget standard $S --out studies/smollm2-135m
step $O study --model gemma3-270m --budget standard $S --out studies/gemma3-270m
step $O study --summary studies/smollm2-135m studies/gemma3-270m --out studies/summary
# 4. selection policies against the oracle, and the long-input decision (docs/policies.md)
step $O study --model smollm2-135m --budget standard $S --stages policies --out studies/smollm2-135m
