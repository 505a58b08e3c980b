#!/usr/bin/env bash
# Sets up everything embshard needs on a fresh machine, idempotently:
#   1. a project-local Python venv (.venv) holding torch==2.13.0, the libtorch
#      that tch 0.26 links against (LIBTORCH_USE_PYTORCH=1);
#   2. the release build of every binary (target/release/{learner,actor,benchworker}),
#      which find libtorch through an rpath set at build time. EMBSHARD_CUDA=1
#      builds the learner and benchworker with the `cuda` backend (docs/gpu.md).
# The other scripts source this file; running it alone is fine too.
set -euo pipefail

EMBSHARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_VERSION=2.13.0
VENV="$EMBSHARD_ROOT/.venv"

for tool in cargo python3 c++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup: '$tool' not found: embshard needs a Rust toolchain (https://rustup.rs)," \
         "Python 3.10+ with venv, and a C++ compiler" >&2
    exit 1
  fi
done

# Refuses early, with the numbers, when a step would run the disk full: a
# full disk halfway through pip or cargo leaves only an obscure error. Where
# the free space cannot be read, the check is skipped.
existing_dir() { # PATH: the nearest folder at or above it that exists
  local dir=$1
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  echo "$dir"
}
free_kib() { # DIR: free KiB on its file system, or nothing
  local dir kib
  dir=$(existing_dir "$1")
  kib=$(df -Pk -- "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }') || true
  [[ $kib =~ ^[0-9]+$ ]] && echo "$kib"
  return 0
}
need_space() { # DIR GIB WHAT
  local free
  free=$(free_kib "$1")
  if [ -n "$free" ] && [ "$free" -lt $(($2 * 1024 * 1024)) ]; then
    echo "setup: $3 needs about $2 GiB free in $1, which has $((free / 1024)) MiB;" \
         "free some space and run this again" >&2
    exit 1
  fi
}
same_fs() { # DIR DIR: whether both lie on one file system (unknown: yes)
  local a b
  a=$(existing_dir "$1")
  b=$(existing_dir "$2")
  [ "$(stat -c %d -- "$a" 2>/dev/null)" = "$(stat -c %d -- "$b" 2>/dev/null)" ]
}

# The mark that every requirement of torch went in: torch alone imports
# without some of its CUDA libraries, and tch's cuda build needs them all.
TORCH_MARK="$VENV/.embshard-torch-$TORCH_VERSION"
torch_ok() {
  [ -e "$TORCH_MARK" ] && "$VENV/bin/python" - "$TORCH_VERSION" 2>/dev/null <<'PY'
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
}

# torch's requirements, one `name==version` a line, as pip resolves them for
# this venv's Python: every one but triton (the compiler of torch.compile,
# about 700 MB, which neither tch nor the scripts use).
torch_requirements() {
  local report
  report=$(mktemp "${TMPDIR:-/tmp}/embshard-torch-report.XXXXXX")
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run \
    --ignore-installed --report "$report" "torch==$TORCH_VERSION" >&2 || { rm -f "$report"; return 1; }
  "$VENV/bin/python" - "$report" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name = item["metadata"]["name"]
    if name.lower() != "triton":
        print(f"{name}=={item['metadata']['version']}")
PY
  local rc=$?
  rm -f "$report"
  return $rc
}

if ! torch_ok; then
  echo "setup: installing torch==$TORCH_VERSION into $VENV (a few minutes, ~4 GB)" >&2
  # torch and its CUDA libraries take about 4 GB installed. One pip call
  # would keep every wheel it downloads (about 2.5 GB more) until it ends;
  # one call per requirement keeps at most one download (under 1 GB).
  PIP_TMP=${TMPDIR:-/tmp}
  if same_fs "$VENV" "$PIP_TMP"; then
    need_space "$VENV" 5 "installing torch (with pip's downloads in $PIP_TMP)"
  else
    need_space "$VENV" 4 "installing torch"
    need_space "$PIP_TMP" 1 "pip's downloads of torch"
  fi
  # A venv without a working pip (an interrupted or failed creation) is rebuilt.
  if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" || {
      echo "setup: 'python3 -m venv' failed; install your distribution's python3-venv" >&2
      exit 1
    }
  fi
  # pip's --report (the resolved requirements) came in pip 22.2.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "pip>=22.2"
  REQUIREMENTS=$(torch_requirements) ||
    { echo "setup: pip could not resolve torch==$TORCH_VERSION's requirements" >&2; exit 1; }
  # In pip's order: torch and its CUDA libraries first, small ones last.
  for req in $REQUIREMENTS; do
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
      --no-deps "$req"
  done
  touch "$TORCH_MARK"
  torch_ok || { echo "setup: torch $TORCH_VERSION did not install into $VENV" >&2; exit 1; }
fi

# FBGEMM's table-batched embedding kernel (the cpu backend's kernel =
# "fbgemm"): the CPU wheel, or the CUDA one with EMBSHARD_CUDA=1. Each
# FBGEMM release pairs with one torch minor (1.8 with 2.13). Both wheels
# fill the same fbgemm_gpu folder: the other one goes first.
FBGEMM_VERSION=1.8.0
FBGEMM_PACKAGE=fbgemm-gpu-cpu
FBGEMM_OTHER=fbgemm-gpu
if [ "${EMBSHARD_CUDA:-0}" != 0 ]; then
  FBGEMM_PACKAGE=fbgemm-gpu
  FBGEMM_OTHER=fbgemm-gpu-cpu
fi
installed() { # PACKAGE: its installed version, or nothing
  "$VENV/bin/python" - "$1" 2>/dev/null <<'PY' || true
import sys, importlib.metadata as m
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
PY
}
if [ "$(installed "$FBGEMM_PACKAGE")" != "$FBGEMM_VERSION" ]; then
  echo "setup: installing $FBGEMM_PACKAGE==$FBGEMM_VERSION into $VENV" >&2
  if [ -n "$(installed "$FBGEMM_OTHER")" ]; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes "$FBGEMM_OTHER"
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --no-deps "$FBGEMM_PACKAGE==$FBGEMM_VERSION"
  [ "$(installed "$FBGEMM_PACKAGE")" = "$FBGEMM_VERSION" ] ||
    { echo "setup: $FBGEMM_PACKAGE $FBGEMM_VERSION did not install into $VENV" >&2; exit 1; }
fi

export LIBTORCH_USE_PYTORCH=1
export PATH="$VENV/bin:$PATH"

# The cargo features of the binaries: the cuda backend only when asked for.
CUDA_FEATURES=(--features embshard-benchworker/cuda,embshard-learner/cuda)
FEATURES=()
[ "${EMBSHARD_CUDA:-0}" = 0 ] || FEATURES=("${CUDA_FEATURES[@]}")

TARGET_DIR=${CARGO_TARGET_DIR:-$EMBSHARD_ROOT/target}
# target/ holds 1.3 GB after scripts/test.sh.
[ -x "$TARGET_DIR/release/learner" ] || need_space "$TARGET_DIR" 2 "the release build and its tests"
echo "setup: building the release binaries${FEATURES[*]:+ (with the cuda backend)}" >&2
(cd "$EMBSHARD_ROOT" && cargo build --release --workspace "${FEATURES[@]}")
