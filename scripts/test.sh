#!/usr/bin/env bash
# Runs the whole test suite on a fresh or set-up machine: set-up first
# (idempotent), `cargo fmt --check` and clippy with warnings as errors, then
# every test of the workspace with the release profile the
# binaries use, so libtorch's bindings compile once, then launch.sh's
# multi-host modes (scripts/test-launch.sh), the API docs and a short
# run of the fuzz-and-kill script (scripts/fuzz.py --quick). It installs
# chromium from Debian's packages where it can, for the status page's
# browser test. Arguments go to `cargo test`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
# Formatting and lints first: a change that fails them does not land.
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
# The cuda backend is built and its library tests run (no GPU needed: they
# check its arithmetic and its errors), so it never rots; then the plain
# binaries are linked again for the process tests (unless asked for cuda).
if compgen -G "$VENV/lib/python3*/site-packages/torch/lib/libtorch_cuda.so" >/dev/null; then
  echo "test: building and testing the cuda feature" >&2
  cargo build --release --workspace --quiet "${CUDA_FEATURES[@]}"
  cargo test --release --quiet -p embshard-benchworker --lib --features cuda
  cargo build --release --workspace --quiet "${FEATURES[@]}"
else
  echo "test: this torch has no CUDA library: the cuda feature is not built" >&2
fi
# The status page's test renders it in a real headless browser: chromium,
# from Debian's packages where apt-get can install it (as root); that test
# then requires it.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 &&
  [ "$(id -u)" = 0 ]; then
  echo "test: installing chromium (Debian's) for the status page's test" >&2
  { apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 ||
    { apt-get update >/dev/null 2>&1 &&
      apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; } ||
    echo "test: could not install chromium: the status page is not rendered" >&2
fi
if command -v chromium >/dev/null 2>&1; then export EMBSHARD_REQUIRE_BROWSER=1; fi
cargo test --release --workspace "$@"
# The API docs build without a broken link (rustdoc's warnings are errors).
RUSTDOCFLAGS="-D warnings" cargo doc --release --workspace --no-deps --quiet
# launch.sh's ssh and Slurm modes, through stand-ins for ssh and srun (about
# 35 s); skipped when arguments pick some cargo tests.
[ $# -gt 0 ] || "$EMBSHARD_ROOT/scripts/test-launch.sh"
# A short run of the fuzz-and-kill script (about a minute): a learner under
# a flood on loopback, killed and resumed, fed malformed files.
[ $# -gt 0 ] || python3 "$EMBSHARD_ROOT/scripts/fuzz.py" --quick
