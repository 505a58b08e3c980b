#!/usr/bin/env bash
# The real-GPU checks of the cuda backend (docs/gpu.md), on a host with at
# least one NVIDIA GPU:
#   0. the measuring engine's tests on the GPU (each test written once runs
#      on the CPU and on GPU 0; a missing GPU fails them here);
#   1. measures one plan of 20 tables on one GPU (D = 1: the compute phases
#      and a one-rank NCCL all-to-all), next to sim's figures for it;
#   2. the fusion sweep (one fused call over k tables vs k single-table
#      calls) on cuda and on sim, for the same mixes; every mix is saved
#      (fusion-BACKEND.jsonl) for a side-by-side reading;
#   3. calibrates sim to the cuda backend on one-device plans (CALIBRATE_PLANS,
#      default 400: three in four fitted, the fourth held out) and keeps the
#      measurements and the calibration in data/measured/GPU-NAME-KERNEL/.
# Usage: scripts/gpu-check.sh [OUT_DIR]   (default runs/gpu-check)
#
# The kernel is FBGEMM's where the benchworker measures a probe plan with
# it, else libtorch's, the reason saved (EMBSHARD_KERNEL=fbgemm|torch
# chooses); every figure names it. A step that fails says so and the
# script goes on to the next.
#
# By default it sets up and builds here (scripts/setup.sh with the cuda
# feature). With EMBSHARD_PREBUILT=DIR it runs the learner and benchworker
# binaries in DIR instead, built elsewhere against the libtorch of this
# host's python3 torch (docs/gpu.md, "Prebuilt binaries"), with that
# libtorch and the NCCL of its wheel on the library path; DIR/benchworker-tests,
# the library's test binary, runs step 0 (skipped, and said, without it).
# DIR is taken from where the script is called; OUT_DIR from the
# repository's root.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n ${EMBSHARD_PREBUILT:-} ]]; then
  BIN=$(cd "$EMBSHARD_PREBUILT" && pwd)
  SITE=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  # cudarc asks for libnccl.so by that name; the wheel ships libnccl.so.2.
  NCCL=$SITE/nvidia/nccl/lib/libnccl.so.2
  [[ -e $NCCL ]] || { echo "gpu-check: no $NCCL (torch's NCCL) on this host" >&2; exit 1; }
  NCCL_LINK=$(mktemp -d)
  trap 'rm -rf "$NCCL_LINK"' EXIT
  ln -s "$NCCL" "$NCCL_LINK/libnccl.so"
  export LD_LIBRARY_PATH=$SITE/torch/lib:$NCCL_LINK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # FBGEMM beside this host's torch, not where the binaries were built.
  [[ -d $SITE/fbgemm_gpu ]] && export EMBSHARD_FBGEMM_DIR=${EMBSHARD_FBGEMM_DIR:-$SITE/fbgemm_gpu}
  python3 -c 'import torch; print("torch", torch.__version__)'
  TESTS=$BIN/benchworker-tests
else
  export EMBSHARD_CUDA=1
  . "$ROOT/scripts/setup.sh"
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
  TESTS_LOG=${TMPDIR:-/tmp}/gpu-check-tests-build.log
  TESTS=$(cargo test --release -p embshard-benchworker --features cuda --lib --no-run \
    --message-format=json 2>"$TESTS_LOG" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])') || { echo "gpu-check: building the tests failed (see $TESTS_LOG)" >&2; TESTS=""; }
fi
cd "$ROOT"
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
"$BIN/learner" generate --config configs/default.toml >/dev/null
POOL=data/generated/pool.csv

# The kernel: FBGEMM's if the benchworker measures a one-table plan with it.
if [[ -z ${EMBSHARD_KERNEL:-} ]]; then
  printf 'name,rows,dim\nprobe,1000,16\n' >"$OUT/probe.csv"
  echo '{"devices": 1, "assignment": [{"table": "probe", "device": 0}]}' >"$OUT/probe.json"
  if "$BIN/benchworker" measure --backend cuda --kernel fbgemm --tables "$OUT/probe.csv" \
    --placement "$OUT/probe.json" >"$OUT/kernel-probe.txt" 2>&1; then
    EMBSHARD_KERNEL=fbgemm
  else
    EMBSHARD_KERNEL=torch
    echo "gpu-check: FBGEMM's kernel does not run here (see $OUT/kernel-probe.txt)" >&2
  fi
fi
KERNEL=$EMBSHARD_KERNEL
echo "gpu-check: the $KERNEL kernel" | tee "$OUT/kernel.txt"

# 0. The engine's tests, on GPU 0 as on the CPU; at least one must run.
if [[ -n ${TESTS:-} && -x $TESTS ]]; then
  EMBSHARD_REQUIRE_GPU=1 EMBSHARD_KERNEL=$KERNEL "$TESTS" --test-threads 1 ::cuda \
    >"$OUT/tests.txt" 2>&1 || true
  cat "$OUT/tests.txt"
  grep -qE 'test result: ok\. [1-9]' "$OUT/tests.txt" ||
    echo "gpu-check: the engine's tests on the GPU FAILED or none ran (see $OUT/tests.txt); going on" >&2
else
  echo "gpu-check: no test binary (${TESTS:-none}): step 0 skipped" | tee "$OUT/tests.txt" >&2
fi

# 1. One plan: the pool's first 20 tables, all on device 0.
head -n 21 "$POOL" >"$OUT/tables.csv"
{
  printf '{"devices": 1, "assignment": ['
  tail -n +2 "$OUT/tables.csv" | cut -d, -f1 | awk '{printf "%s{\"table\": \"%s\", \"device\": 0}", (NR > 1 ? ", " : ""), $1}'
  printf ']}\n'
} >"$OUT/placement.json"
for backend in sim cuda; do
  "$BIN/benchworker" measure --backend "$backend" --kernel "$KERNEL" --tables "$OUT/tables.csv" \
    --placement "$OUT/placement.json" --json | tee "$OUT/plan-$backend.json" ||
    echo "gpu-check: measuring the plan on $backend FAILED; going on" >&2
done

# 2. The fusion sweep, same mixes (same seed) on both backends.
for backend in sim cuda; do
  "$BIN/benchworker" fusion --backend "$backend" --kernel "$KERNEL" --sizes "${FUSION_SIZES:-1,2,4,8,16,32}" \
    --mixes "${FUSION_MIXES:-3}" --save "$OUT/fusion-$backend.jsonl" | tee "$OUT/fusion-$backend.txt" ||
    echo "gpu-check: the fusion sweep on $backend FAILED; going on" >&2
done
# 3. sim calibrated to this GPU, on one-device plans (one GPU or more).
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9.\n-' '_' || true)
MEASURED=data/measured/${GPU_NAME:-unknown-gpu}-$KERNEL
mkdir -p "$MEASURED"
"$BIN/benchworker" calibrate --backend cuda --kernel "$KERNEL" --plans "${CALIBRATE_PLANS:-400}" --max-devices 1 \
  --out "$MEASURED/calibration.toml" --save "$MEASURED/plans.jsonl" | tee "$OUT/calibrate.txt"
echo "gpu-check: figures in $OUT, measurements and calibration in $MEASURED" >&2
