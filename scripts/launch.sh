#!/usr/bin/env bash
# The main job on the embedded default: set up (idempotent), generate the
# default DLRM-like pool and task suites, train the cost and policy networks
# on the training tasks, and compare every placement method, the trained
# policy included, on the test suites (tables never seen in training).
#
# Usage: scripts/launch.sh [--config FILE] [--backend sim|cpu] [--run-dir DIR]
#                          [--search-budget N]
#   --config FILE        configuration (default: configs/default.toml)
#   --backend sim|cpu    the oracle that measures plans (default: sim)
#   --run-dir DIR        where the run's config, metrics and checkpoints go
#                        (default: runs/default); an existing run there is
#                        resumed, not overwritten
#   --search-budget N    measurements per task for `search` (default: the
#                        config's eval.search_budget on sim, 20 on cpu)
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

CONFIG=""
BACKEND=sim
BUDGET=""
RUN_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || { usage >&2; exit 2; }; CONFIG=$(realpath "$2"); shift 2 ;;
    --backend) [ $# -ge 2 ] || { usage >&2; exit 2; }; BACKEND=$2; shift 2 ;;
    --search-budget) [ $# -ge 2 ] || { usage >&2; exit 2; }; BUDGET=$2; shift 2 ;;
    --run-dir) [ $# -ge 2 ] || { usage >&2; exit 2; }; RUN_DIR=$(realpath -m "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "launch: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$BACKEND" in
  sim) ;;
  cpu) BUDGET=${BUDGET:-20} ;;
  *) echo "launch: --backend must be sim or cpu, not '$BACKEND'" >&2; exit 2 ;;
esac

. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
CONFIG=${CONFIG:-configs/default.toml}
RUN_DIR=${RUN_DIR:-runs/default}

BIN=target/release
SUITES=()
while read -r line; do
  echo "$line" >&2
  case "$line" in
    "wrote "*.test.json) SUITES+=(--suite "${line#wrote }") ;;
  esac
done < <("$BIN/learner" generate --config "$CONFIG")
[ ${#SUITES[@]} -gt 0 ] || { echo "launch: generate wrote no test suite" >&2; exit 1; }
if [ -d "$RUN_DIR/checkpoints" ] && [ -n "$(ls -A "$RUN_DIR/checkpoints" 2>/dev/null)" ]; then
  # The run exists: continue it (a finished run just goes on to the evaluation).
  echo "launch: continuing the run in $RUN_DIR" >&2
  "$BIN/learner" train --backend "$BACKEND" --run-dir "$RUN_DIR" --resume
else
  "$BIN/learner" train --config "$CONFIG" --backend "$BACKEND" --run-dir "$RUN_DIR"
fi
EXTRA=()
[ -z "$BUDGET" ] || EXTRA=(--search-budget "$BUDGET")
"$BIN/learner" eval --config "$CONFIG" --backend "$BACKEND" --methods all \
  --checkpoint "$RUN_DIR" "${EXTRA[@]}" "${SUITES[@]}"
