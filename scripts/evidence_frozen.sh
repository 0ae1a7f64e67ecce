#!/bin/bash
# scripts/evidence.sh from a worktree of a frozen commit (default: the local branch `evidence`), so that main's
# numeric modules can change while the queue runs for hours without one process mixing code versions. The
# worktree's result store, studies and plans are links to this checkout's, so results land here (and record the
# frozen commit); commit them from here as they come.
#   nohup bash scripts/evidence_frozen.sh [REV] > evidence.log 2>&1 &
set -eu
main="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-evidence}"
wt="${EVIDENCE_WORKTREE:-$main/../evq}"
git -C "$main" worktree prune
[ -d "$wt" ] || git -C "$main" worktree add --detach "$wt" "$rev"
for p in scripts/results/store studies plans .venv; do
  [ -L "$wt/$p" ] || { rm -rf "${wt:?}/$p"; ln -s "$main/$p" "$wt/$p"; }
done
cd "$wt"
PYTHONPATH="$wt/src" exec bash scripts/evidence.sh
