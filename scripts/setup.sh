#!/usr/bin/env bash
# Sets up everything embshard needs on a fresh machine, idempotently:
#   1. a project-local Python venv (.venv) holding torch==2.13.0, the libtorch
#      that tch 0.26 links against (LIBTORCH_USE_PYTORCH=1);
#   2. the release build of every binary (target/release/{learner,actor,benchworker}),
#      which find libtorch through an rpath set at build time.
# Source it (`. scripts/setup.sh`) to also get the environment in your shell.
set -euo pipefail

EMBSHARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_VERSION=2.13.0
VENV="$EMBSHARD_ROOT/.venv"

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi

torch_ok() {
  "$VENV/bin/python" - "$TORCH_VERSION" 2>/dev/null <<'PY'
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
}

if ! torch_ok; then
  echo "setup: installing torch==$TORCH_VERSION into $VENV (a few minutes, ~5 GB)" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
  torch_ok || { echo "setup: torch $TORCH_VERSION did not install" >&2; exit 1; }
fi

export LIBTORCH_USE_PYTORCH=1
export PATH="$VENV/bin:$PATH"

echo "setup: building the release binaries" >&2
cargo build --release --workspace --quiet
