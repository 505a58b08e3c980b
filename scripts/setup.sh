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

# torch at the pinned version imports from the venv. That needs its CUDA
# libraries too: torch loads them as it starts.
torch_imports() {
  "$VENV/bin/python" - "$TORCH_VERSION" 2>/dev/null <<'PY'
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
}
# The mark that every requirement of torch went in, written once the last
# one has: some libraries (cupti, nvtx) load only when used.
TORCH_MARK="$VENV/.embshard-torch-$TORCH_VERSION"
torch_ok() { [ -e "$TORCH_MARK" ] && torch_imports; }

# One pip call per requirement: pip keeps every wheel that one call
# downloads until it ends, so a single call for torch and its CUDA
# libraries (about 2.6 GB of wheels) would hold them all beside what it
# has installed.
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --no-warn-conflicts "$@"
}

if ! torch_ok; then
  if torch_imports; then
    # A venv set up before the mark was kept: pip finds everything there.
    echo "setup: checking torch==$TORCH_VERSION's requirements in $VENV" >&2
  else
    echo "setup: installing torch==$TORCH_VERSION into $VENV (a few minutes, ~4 GB)" >&2
    # Installed, torch and its CUDA libraries take about 4 GB; the largest
    # call's downloads (the CUDA toolkit's libraries) add about 1 GB.
    PIP_TMP=${TMPDIR:-/tmp}
    if same_fs "$VENV" "$PIP_TMP"; then
      need_space "$VENV" 5 "installing torch (with pip's downloads in $PIP_TMP)"
    else
      need_space "$VENV" 4 "installing torch"
      need_space "$PIP_TMP" 1 "pip's downloads of torch"
    fi
  fi
  # A venv without a working pip (an interrupted or failed creation) is rebuilt.
  if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" || {
      echo "setup: 'python3 -m venv' failed; install your distribution's python3-venv" >&2
      exit 1
    }
  fi
  pip_install --no-deps "torch==$TORCH_VERSION"
  # Then each requirement torch declares, with its own (PIP_NO_DEPS from
  # the environment or a pip.conf would leave those out). pip skips those
  # whose markers do not hold here. All but triton: the compiler of
  # torch.compile (about 700 MB), which neither tch nor the scripts use.
  REQUIREMENTS=$("$VENV/bin/python" - <<'PY'
import importlib.metadata, re
for r in importlib.metadata.requires("torch") or []:
    name = re.match(r"[A-Za-z0-9._-]+", r).group(0)
    if re.sub(r"[-_.]+", "-", name).lower() != "triton":
        print(r)
PY
  ) || { echo "setup: cannot read torch's requirements in $VENV" >&2; exit 1; }
  while IFS= read -r req; do
    PIP_NO_DEPS=0 pip_install "$req"
  done <<<"$REQUIREMENTS"
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
