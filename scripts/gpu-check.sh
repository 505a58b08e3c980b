#!/usr/bin/env bash
# The real-GPU checks of the cuda backend (docs/gpu.md), on a host with at
# least one NVIDIA GPU: builds the binaries with the cuda backend, then
#   1. measures one plan of 20 tables on one GPU (D = 1: the compute phases
#      and a one-rank NCCL all-to-all), next to sim's figures for it;
#   2. the fusion sweep (one fused call over k tables vs k single-table
#      calls) on cuda and on sim, for the same mixes.
# Usage: scripts/gpu-check.sh [OUT_DIR]   (default runs/gpu-check)
set -euo pipefail
export EMBSHARD_CUDA=1
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
BIN=$EMBSHARD_ROOT/target/release
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
"$BIN/learner" generate --config configs/default.toml >/dev/null
POOL=data/generated/pool.csv

# 1. One plan: the pool's first 20 tables, all on device 0.
head -n 21 "$POOL" >"$OUT/tables.csv"
{
  printf '{"devices": 1, "assignment": ['
  tail -n +2 "$OUT/tables.csv" | cut -d, -f1 | awk '{printf "%s{\"table\": \"%s\", \"device\": 0}", (NR > 1 ? ", " : ""), $1}'
  printf ']}\n'
} >"$OUT/placement.json"
for backend in sim cuda; do
  "$BIN/benchworker" measure --backend "$backend" --tables "$OUT/tables.csv" \
    --placement "$OUT/placement.json" --json | tee "$OUT/plan-$backend.json"
done

# 2. The fusion sweep, same mixes (same seed) on both backends.
for backend in sim cuda; do
  "$BIN/benchworker" fusion --backend "$backend" --sizes 1,2,4,8,16,32 --mixes 3 | tee "$OUT/fusion-$backend.txt"
done
echo "gpu-check: figures in $OUT" >&2
