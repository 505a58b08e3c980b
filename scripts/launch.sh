#!/usr/bin/env bash
# The main job on the embedded default: set up (idempotent), generate the
# default DLRM-like pool and task suites, and compare every placement method
# on the test suites with the `sim` oracle.
#
# Usage: scripts/launch.sh [--config FILE] [--backend sim|cpu]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"

CONFIG=configs/default.toml
BACKEND=sim
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "launch: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

BIN=target/release
SUITES=()
while read -r line; do
  echo "$line" >&2
  case "$line" in
    "wrote "*.test.json) SUITES+=(--suite "${line#wrote }") ;;
  esac
done < <("$BIN/learner" generate --config "$CONFIG")
[ ${#SUITES[@]} -gt 0 ] || { echo "launch: generate wrote no test suite" >&2; exit 1; }
"$BIN/learner" eval --config "$CONFIG" --backend "$BACKEND" --methods all "${SUITES[@]}"
