#!/usr/bin/env bash
# Benchmark of the training cluster on this host: environment steps per second
# that the learner learns from, policy updates per second and policy lag, with
# 1, 2 and 4 actor processes (scripts/launch.sh) next to the same counts of
# actor threads in one process. The learner's summary gives the rate over the
# whole run and from its first update to its last (without the peers' start
# and the stop). A benchmark, not a test: the figures depend on the machine
# and on what else runs on it.
#
# Usage: scripts/bench-cluster.sh [ACTOR COUNTS…]   (default: 1 2 4)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
COUNTS=("$@")
[ $# -gt 0 ] || COUNTS=(1 2 4)
for n in "${COUNTS[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cluster: '$n' is not an actor count" >&2; exit 2; }
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# Policy updates dominate: 4 rounds of 5 measured plans, 100 updates each,
# from fresh networks (the figures of docs/scaling.md; the main job's
# train.init would bring the shipped model's three-member cost network).
sed -e 's/^iterations = .*/iterations = 4/' \
    -e '/^init = /d' \
    -e 's/^measure_per_iteration = .*/measure_per_iteration = 5/' \
    -e 's/^cost_steps = .*/cost_steps = 50/' \
    -e 's/^policy_steps = .*/policy_steps = 100/' \
    -e 's/^extra_suites = .*/extra_suites = []/' \
    configs/default.toml >"$OUT/bench.toml"
target/release/learner generate --config "$OUT/bench.toml" >/dev/null
for n in "${COUNTS[@]}"; do
  scripts/launch.sh --config "$OUT/bench.toml" --run-dir "$OUT/procs-$n" --actors "$n" --no-eval 2>/dev/null |
    sed "s|^|$n actor processes: |; s|; run in .*||"
  target/release/learner train --config "$OUT/bench.toml" --run-dir "$OUT/threads-$n" \
    --actors "$n" --benchworkers 1 2>/dev/null | sed "s|^|$n actor threads:   |; s|; run in .*||"
done
