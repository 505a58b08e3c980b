#!/usr/bin/env bash
# Tests scripts/launch.sh's multi-host modes on this host: a stand-in `ssh`
# (runs the remote command here under sh, not bash, as a login shell would,
# in a session of its own as sshd does, without the caller's cluster token,
# so the token must come over stdin as launch.sh sends it; the remote
# command's stdin ends when the stand-in ends, killed or not, as when sshd
# closes a session) and a stand-in `srun` (runs --ntasks copies here) come
# first on PATH. Each mode trains the small configuration (in a temporary
# folder) and must: start the peers where the hostfile or srun says, finish
# training with every measurement, keep the token off every command line;
# when the learner dies mid-run, launch.sh must exit and leave nothing
# running on the "remote" hosts; a second launch on a run in training must
# be refused without touching it; a resumed run must keep its own config
# (a --config given is ignored, with a warning); and launch.sh must refuse
# a mode it cannot run (no srun, no hosts, a host that does not answer or
# lacks the binaries) or --resume on a folder with no run, before starting
# anything. scripts/test.sh runs it after the cargo tests; it sets up
# through launch.sh like any user.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
FAILS=0
fail() { echo "test-launch: FAILED: $*" >&2; FAILS=$((FAILS + 1)); }
check() { # check WHAT COMMAND...
  local what=$1; shift
  if "$@"; then echo "test-launch: ok: $what" >&2; else fail "$what"; fi
}

mkdir -p "$T/bin"
cat >"$T/bin/ssh" <<'SH'
#!/usr/bin/env bash
set -euo pipefail
printf '%s\n' "$*" >>"$FAKE_LOG/ssh.args"
while [ "${1:-}" = -o ]; do shift 2; done
host=$1; shift
case "$host" in
  down) echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255 ;;
  bare) exit 1 ;; # a host without the binaries: every command fails
esac
# The connection: this client feeds the remote command's stdin through a
# pipe, and stopping, however, stops feeding it.
fifo=$(mktemp -u "$FAKE_LOG/ssh-stdin.XXXXXX")
mkfifo "$fifo"
env -u EMBSHARD_TOKEN FAKE_HOST="$host" setsid sh -c "$*" <"$fifo" &
remote=$!
echo "$remote" >>"$FAKE_LOG/ssh.sessions"
cat <&0 >"$fifo" &
feed=$!
trap 'kill "$feed" 2>/dev/null; exit 255' TERM HUP
status=0
wait "$remote" || status=$?
kill "$feed" 2>/dev/null || true
rm -f "$fifo"
exit "$status"
SH
cat >"$T/bin/srun" <<'SH'
#!/usr/bin/env bash
set -euo pipefail
printf '%s\n' "$*" >>"$FAKE_LOG/srun.args"
n=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --ntasks=*) n=${1#--ntasks=} ;;
    --export=ALL) ;;
    *) echo "srun stand-in: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for i in $(seq 0 $((n - 1))); do SLURM_PROCID=$i "$@" & done
wait
SH
chmod +x "$T/bin/ssh" "$T/bin/srun"
export FAKE_LOG=$T
sed -e "s#^dir = \"data/small\"#dir = \"$T/data\"#" \
    -e "s#^suite = \"data/small/#suite = \"$T/data/#" \
    "$ROOT/configs/small.toml" >"$T/small.toml"
grep -q "$T/data" "$T/small.toml" || { echo "test-launch: could not relocate configs/small.toml" >&2; exit 1; }
WANT=$(awk -F' *= *' '/^iterations/ {i=$2} /^measure_per_iteration/ {m=$2} END {print i * m}' "$T/small.toml")
printf 'token-%s\n' "$RANDOM$RANDOM$RANDOM" >"$T/token"
chmod 600 "$T/token"
TOKEN=$(cat "$T/token")
TIMEOUT=$(command -v timeout)
launch() { PATH="$T/bin:$PATH" "$TIMEOUT" 300 "$ROOT/scripts/launch.sh" --config "$T/small.toml" \
  --token-file "$T/token" --port 0 --no-eval "$@"; }
trained() { grep -q "trained .*: ${2:-$WANT} measurements" "$1/logs/learner.out"; }
no_token() { ! grep -qF "$TOKEN" "$1"; }
joined() { # joined LOG... : distinct actor ids that joined, over the logs
  cat "$@" | grep -o 'Actor [0-9]* joined' | sort -u | wc -l
}

# Hostfile mode: comments, blank lines and extra fields are skipped; actors
# then benchworkers go round robin over the hosts.
printf 'nodeA\n# a comment\n\nnodeB  slots=4\n' >"$T/hosts"
if launch --run-dir "$T/ssh" --hostfile "$T/hosts" --actors 2 --benchworkers 1 >"$T/ssh.out" 2>&1; then
  L=$T/ssh/logs
  check "hostfile: peers on the hosts round robin" \
    test -s "$L/actor-1-nodeA.log" -a -s "$L/actor-2-nodeB.log" -a -s "$L/benchworker-1-nodeA.log"
  check "hostfile: training finished with $WANT measurements" trained "$T/ssh"
  check "hostfile: both actors joined (the token came over ssh's stdin)" \
    test "$(joined "$L/actor-1-nodeA.log" "$L/actor-2-nodeB.log")" -ge 2
  check "hostfile: one check per host, then three peers started, no token on any command" \
    test "$(grep -c "^-o BatchMode=yes .* node[AB] bash -c 'test -x .* embshard-check " "$T/ssh.args")" = 2 \
    -a "$(grep -c "^-o BatchMode=yes node[AB] bash -c '.* embshard-peer '" "$T/ssh.args")" = 3 \
    -a "$(wc -l <"$T/ssh.args")" = 5 -a "$(no_token "$T/ssh.args" && echo y)" = y
else
  tail -n 20 "$T/ssh.out" >&2
  fail "hostfile mode exited with an error"
fi

# Hostfile mode, the learner killed mid-run: launch.sh exits with its
# status, and its exit trap leaves nothing running in the stand-in ssh's
# sessions (the remote peers see their ssh stdin end). With --bind-host, the
# learner listens where it says.
sed -e 's/^iterations = .*/iterations = 100000/' "$T/small.toml" >"$T/long.toml"
: >"$T/ssh.sessions"
PATH="$T/bin:$PATH" "$TIMEOUT" 120 "$ROOT/scripts/launch.sh" --config "$T/long.toml" \
  --token-file "$T/token" --no-eval --run-dir "$T/crash" --hostfile "$T/hosts" \
  --actors 2 --benchworkers 1 --bind-host 127.0.0.1 --port 0 >"$T/crash.out" 2>&1 &
LAUNCH=$!
L=$T/crash/logs
for _ in $(seq 1 300); do
  [ "$(joined "$L"/actor-*.log 2>/dev/null)" -ge 2 ] && break
  sleep 0.2
done
check "hostfile, learner killed: both actors joined first" test "$(joined "$L"/actor-*.log 2>/dev/null)" -ge 2
check "--bind-host: the learner listened on 127.0.0.1" grep -q '^tcp://127\.0\.0\.1:' "$T/crash/endpoint"
# A second launch on the run in training stops before touching it.
SECOND=0
launch --run-dir "$T/crash" >"$T/second.out" 2>&1 || SECOND=$?
check "a second launch on a run in training is refused and leaves it alone" \
  test "$SECOND" = 2 -a -f "$T/crash/endpoint" \
  -a "$(grep -c "another learner (pid [0-9]*) is training in" "$T/second.out")" = 1
LEARNER_PID=$(pgrep -f -- "learner train --run-dir $T/crash " || true)
[ -z "$LEARNER_PID" ] || kill -KILL "$LEARNER_PID"
STATUS=0
wait "$LAUNCH" || STATUS=$?
check "hostfile, learner killed: launch.sh exited with the learner's status" test "$STATUS" = 137
sessions() { pgrep -s "$(paste -sd, "$T/ssh.sessions")"; }
for _ in $(seq 1 50); do sessions >/dev/null || break; sleep 0.2; done
mapfile -t LEFT < <(sessions || true)
if [ ${#LEFT[@]} -gt 0 ]; then
  fail "hostfile, learner killed: processes left on the remote hosts: ${LEFT[*]}"
  kill -KILL "${LEFT[@]}" 2>/dev/null || true
else
  echo "test-launch: ok: hostfile, learner killed: nothing left on the remote hosts" >&2
fi
[ "$STATUS" = 137 ] || tail -n 20 "$T/crash.out" >&2

# Slurm mode: one srun step for the actors, one for the benchworkers.
if launch --run-dir "$T/slurm" --slurm --actors 2 --benchworkers 1 >"$T/slurm.out" 2>&1; then
  L=$T/slurm/logs
  check "slurm: training finished with $WANT measurements" trained "$T/slurm"
  check "slurm: two actors joined from one srun step" test "$(joined "$L/actors.log")" -ge 2
  check "slurm: srun asked for 2 actor tasks and 1 benchworker task" \
    grep -qx -- "--export=ALL --ntasks=2 .*/actor run --learner tcp://.*" "$T/srun.args"
  check "slurm: ... and 1 benchworker task" \
    grep -qx -- "--export=ALL --ntasks=1 .*/benchworker serve --learner tcp://.* --backend sim" "$T/srun.args"
  check "slurm: no token on srun's command lines" no_token "$T/srun.args"
else
  tail -n 20 "$T/slurm.out" >&2
  fail "slurm mode exited with an error"
fi

# On this host, with an EMBSHARD_TOKEN left in the environment (one meant
# for --add-actors) and no --token-file: the cluster makes its own token.
# --measurements doubles the config's budget over the same rounds; --seed
# sets the run's train.seed.
if EMBSHARD_TOKEN=stray "$TIMEOUT" 300 "$ROOT/scripts/launch.sh" --config "$T/small.toml" \
  --run-dir "$T/local" --actors 1 --benchworkers 1 --measurements $((2 * WANT)) --seed 3 \
  --no-eval >"$T/local.out" 2>&1; then
  check "local: training finished with the $((2 * WANT)) measurements of --measurements" \
    trained "$T/local" $((2 * WANT))
  check "local: --seed 3 is the run's train.seed" \
    awk '/^\[/ { s = $0 } s == "[train]" && $0 == "seed = 3" { f = 1 } END { exit !f }' \
    "$T/local/config.toml"
  check "local: a token of its own in DIR/token, not the environment's" \
    test -s "$T/local/token" -a "$(cat "$T/local/token" 2>/dev/null)" != stray
  check "local: the learner's progress lines shown while it trained" \
    grep -q "INFO update [0-9]*/[0-9]*, round" "$T/local.out"
else
  tail -n 20 "$T/local.out" >&2
  fail "local mode with a stray EMBSHARD_TOKEN exited with an error"
fi

# A run stopped before its first checkpoint, with measurements logged: a
# plain launch resumes it (fresh networks, every logged measurement kept),
# with its own config.toml for generate too, whatever --config says.
mkdir -p "$T/early"
cp "$T/small.toml" "$T/early/config.toml"
head -n 3 "$T/local/cost_buffer.jsonl" >"$T/early/cost_buffer.jsonl" 2>/dev/null || true
sed -e "s#$T/data#$T/other-data#" "$T/small.toml" >"$T/other.toml"
if launch --run-dir "$T/early" --config "$T/other.toml" --actors 1 --benchworkers 1 >"$T/early.out" 2>&1; then
  check "early stop: resumed, training finished with $WANT measurements" trained "$T/early"
  check "early stop: --config warned about and unused (generate took the run's config)" \
    test ! -e "$T/other-data" -a "$(grep -c "warning: continuing the run in .*--config .*/other.toml is ignored" "$T/early.out")" = 1
  check "early stop: the 3 logged measurements kept, first in the log" \
    cmp -s <(head -n 3 "$T/local/cost_buffer.jsonl") <(head -n 3 "$T/early/cost_buffer.jsonl")
  check "early stop: fresh networks trained on them" grep -q "fresh networks" "$T/early/logs/learner.log"
else
  tail -n 20 "$T/early.out" >&2
  fail "resuming a run stopped before its first checkpoint exited with an error"
fi

# Modes that cannot run are refused before anything starts.
R=0
refused() { # refused MESSAGE PATH ARGS...
  local message=$1 path=$2; shift 2
  local out status=0 run=$T/refused-$((R += 1))
  out=$(PATH="$path" "$TIMEOUT" 120 "$ROOT/scripts/launch.sh" --config "$T/small.toml" --run-dir "$run" "$@" 2>&1) ||
    status=$?
  [ "$status" = 2 ] && grep -qF -- "$message" <<<"$out" && [ ! -e "$run" ] || { echo "$out" | tail -n 5 >&2; false; }
}
NO_SRUN=$(mktemp -d "$T/path.XXXX")
for tool in bash env sed awk cat mkdir dirname realpath grep tr sort; do
  ln -s "$(command -v "$tool")" "$NO_SRUN/$tool"
done
printf '# nothing but a comment\n' >"$T/comments"
check "refused: --hostfile and --slurm together" \
  refused "exclude each other" "$T/bin:$PATH" --hostfile "$T/hosts" --slurm
check "refused: a --bind-host that is no IPv4 address or interface" \
  refused "neither an IPv4 address nor an interface" "$T/bin:$PATH" --bind-host example.com
check "refused: a hostfile without hosts" refused "no hosts in" "$T/bin:$PATH" --hostfile "$T/comments"
check "refused: an unknown --backend, before building" \
  refused "the backends are sim, cpu and cuda" "$NO_SRUN" --backend gpu
check "refused: a --measurements that is not a number" \
  refused "--measurements 'lots' is not a number" "$NO_SRUN" --measurements lots
check "refused: a --seed that is not a whole number" \
  refused "--seed '-1' is not a whole number" "$NO_SRUN" --seed -1
check "refused: a --config that does not exist" \
  refused "no such file" "$NO_SRUN" --config "$T/missing.toml"
check "refused: --slurm without srun" refused "srun not found" "$NO_SRUN" --slurm
printf 'nodeA\ndown\n' >"$T/hosts-down"
check "refused: a host that does not answer over ssh" \
  refused "host down does not answer over ssh" "$T/bin:$PATH" --hostfile "$T/hosts-down"
printf 'bare\nnodeA\n' >"$T/hosts-bare"
check "refused: a host without the binaries" \
  refused "host bare has no" "$T/bin:$PATH" --hostfile "$T/hosts-bare"
mkdir "$T/no-run"
check "refused: --resume on a folder with no run in it" \
  refused "no run to resume in" "$T/bin:$PATH" --resume "$T/no-run"
check "... and its folder stays empty" test -z "$(ls -A "$T/no-run")"
# The learner itself refuses a budget under one plan a round: launch.sh
# shows why and takes away the folder it made for the run.
learner_refused() { # learner_refused MESSAGE ARGS...
  local message=$1; shift
  local out status=0 run=$T/learner-refused
  out=$(PATH="$T/bin:$PATH" "$TIMEOUT" 120 "$ROOT/scripts/launch.sh" --config "$T/small.toml" \
    --run-dir "$run" "$@" 2>&1) || status=$?
  [ "$status" = 1 ] && grep -qF -- "$message" <<<"$out" && [ ! -e "$run" ] ||
    { echo "$out" | tail -n 5 >&2; false; }
}
check "refused by the learner: --measurements under the rounds, its new folder gone" \
  learner_refused "is fewer than the" --measurements 1

if [ "$FAILS" != 0 ]; then
  echo "test-launch: $FAILS checks failed" >&2
  exit 1
fi
echo "test-launch: all checks passed" >&2
