#!/usr/bin/env bash
# Runs the whole test suite on a fresh or set-up machine: set-up first
# (idempotent), then every test of the workspace with the release profile the
# binaries use, so libtorch's bindings compile once.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
cargo test --release --workspace "$@"
