#!/usr/bin/env bash
# The main job on the embedded default: set up (idempotent), generate the
# default DLRM-like pool and task suites, train with a cluster — one learner,
# actors and benchworkers as separate processes talking ZeroMQ — and compare
# every placement method, the trained policy included, on the test suites
# (tables never seen in training).
#
# Usage: scripts/launch.sh [options]
#   --config FILE        configuration (default: configs/default.toml); a
#                        resumed run keeps its own config.toml, for training,
#                        generate and eval: a --config given then is ignored,
#                        with a warning
#   --run-dir DIR        the run's config, metrics, checkpoints and logs/
#                        (default: runs/default); an existing run there is
#                        resumed, not overwritten (the command that started
#                        a run continues it)
#   --resume DIR         continue the run in DIR; refused if DIR holds no
#                        run (no config.toml)
#   --actors N           actor processes (default: 2)
#   --benchworkers N     benchworker processes (default: 1)
#   --backend sim|cpu|cuda
#                        what benchworkers measure with (default: the
#                        config's [cluster] backend, else sim; a resumed run,
#                        the one it used); cuda builds the binaries
#                        with the cuda backend and needs GPUs (docs/gpu.md)
#   --measurements N     plans the benchworkers measure in training, N /
#                        iterations in each of the config's train.iterations
#                        rounds: a multiple of them (default: iterations ×
#                        train.measure_per_iteration, 200 with
#                        configs/default.toml); a new run only
#   --seed N             the run's seed (train.seed; a new run only): runs
#                        of other seeds place together with `learner plan
#                        --run A --run B`, steadier than one
#   --search-budget N    measurements per task for `search` in the final
#                        evaluation (default: the config's eval.search_budget
#                        on sim, 20 on cpu and cuda)
#   --port P             the learner's TCP port (default: any free port on
#                        loopback; 5555 with --hostfile or --slurm)
#   --bind-host ADDR     the address the learner listens on, which every peer
#                        must reach: an IPv4 address of this host or an
#                        interface name (eth0); or set EMBSHARD_BIND_HOST
#                        (default: 127.0.0.1; with --hostfile or --slurm, the
#                        source address of the default route, else the first
#                        IPv4 address of `hostname -I`)
#   --hostfile FILE      start actors and benchworkers over ssh on the hosts
#                        listed in FILE (one per line, # comments), round
#                        robin; this checkout must be at the same path there,
#                        built, with bash (checked over ssh before anything
#                        starts); a peer there stops when its ssh session ends
#   --slurm              start them with srun inside a Slurm allocation (the
#                        learner runs here, on the first node)
#   --add-actors N --learner ENDPOINT
#                        only start N more actors for a running cluster at
#                        ENDPOINT, on this host (token: --token-file FILE or
#                        EMBSHARD_TOKEN), and wait for them; their logs go
#                        to DIR/logs (--run-dir; default runs/added-actors),
#                        and an actor that fails is named, its log's end
#                        shown, with a non-zero exit
#   --token-file FILE    the cluster token (default: a new one, in DIR/token,
#                        kept on resume; a run started with --token-file
#                        resumes only with the same token; EMBSHARD_TOKEN
#                        counts only with --add-actors)
#   --no-eval            stop after training (no comparison table)
#
# Ctrl-C stops everything cleanly: the learner writes a final checkpoint and
# tells every peer to stop; --resume DIR continues. Per-process logs go to
# DIR/logs/, appended to by each session (a resume keeps the earlier ones).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die() { echo "launch: $*" >&2; exit 2; }
# Logs are appended to, each session under a line of its own: a resume
# keeps what the sessions before it said.
session() { printf '\n=== %s launch.sh: %s ===\n' "$(date '+%F %T')" "$2" >>"$1"; }
need() { [ "$1" -ge 2 ] || { usage >&2; echo "launch: $2 needs a value" >&2; exit 2; }; }

CONFIG=""
BACKEND=""
BUDGET=""
MEASUREMENTS=""
SEED=""
RUN_DIR=""
ACTORS=2
BENCHES=1
PORT=""
BIND_HOST=${EMBSHARD_BIND_HOST:-}
HOSTFILE=""
SLURM=0
ADD=""
LEARNER=""
TOKEN_FILE=""
EVAL=1
RESUME_ASKED=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need $# --config; CONFIG=$(realpath -m "$2"); shift 2 ;;
    --backend) need $# --backend; BACKEND=$2; shift 2 ;;
    --search-budget) need $# --search-budget; BUDGET=$2; shift 2 ;;
    --measurements) need $# --measurements; MEASUREMENTS=$2; shift 2 ;;
    --seed) need $# --seed; SEED=$2; shift 2 ;;
    --run-dir) need $# --run-dir; RUN_DIR=$(realpath -m "$2"); RESUME_ASKED=0; shift 2 ;;
    --resume) need $# --resume; RUN_DIR=$(realpath -m "$2"); RESUME_ASKED=1; shift 2 ;;
    --actors) need $# --actors; ACTORS=$2; shift 2 ;;
    --benchworkers) need $# --benchworkers; BENCHES=$2; shift 2 ;;
    --port) need $# --port; PORT=$2; shift 2 ;;
    --bind-host) need $# --bind-host; BIND_HOST=$2; shift 2 ;;
    --hostfile) need $# --hostfile; HOSTFILE=$(realpath "$2"); shift 2 ;;
    --slurm) SLURM=1; shift ;;
    --no-eval) EVAL=0; shift ;;
    --add-actors) need $# --add-actors; ADD=$2; shift 2 ;;
    --learner) need $# --learner; LEARNER=$2; shift 2 ;;
    --token-file) need $# --token-file; TOKEN_FILE=$(realpath "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "launch: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for n in "$ACTORS" "$BENCHES" ${ADD:+"$ADD"} ${PORT:+"$PORT"}; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "'$n' is not a number"
done
[ -z "$PORT" ] || [ "$PORT" -le 65535 ] || die "--port $PORT: a port is 0..65535 (0: any free one)"
# Checked before anything is built: the learner would refuse them only then.
case "$BACKEND" in
  ""|sim|cpu|cuda) ;;
  *) die "--backend '$BACKEND': the backends are sim, cpu and cuda" ;;
esac
[ -z "$BUDGET" ] || [[ "$BUDGET" =~ ^[0-9]+$ ]] || die "--search-budget '$BUDGET' is not a number"
[ -z "$MEASUREMENTS" ] || [[ "$MEASUREMENTS" =~ ^[0-9]+$ ]] || die "--measurements '$MEASUREMENTS' is not a number"
[ -z "$SEED" ] || [[ "$SEED" =~ ^[0-9]+$ ]] || die "--seed '$SEED' is not a whole number"
[ -z "$CONFIG" ] || [ -f "$CONFIG" ] || die "--config $CONFIG: no such file"
# An IPv4 address or one of this host's interfaces (ZeroMQ binds nothing
# else; no IPv6: the learner's socket does not enable it).
[ -z "$BIND_HOST" ] || [[ "$BIND_HOST" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] ||
  { [[ "$BIND_HOST" =~ ^[A-Za-z0-9._-]+$ ]] && [ -e "/sys/class/net/$BIND_HOST" ]; } ||
  die "--bind-host/EMBSHARD_BIND_HOST: '$BIND_HOST' is neither an IPv4 address nor an interface of this host"
# --resume continues a run; it never starts one.
[ "$RESUME_ASKED" = 0 ] || [ -f "$RUN_DIR/config.toml" ] ||
  die "--resume: no run to resume in $RUN_DIR (it holds no config.toml); --run-dir $RUN_DIR starts one there"
[ -z "$ADD" ] || [ -n "$LEARNER" ] || die "--add-actors needs --learner ENDPOINT"
[ -n "$ADD" ] || [ -z "$LEARNER" ] || die "--learner goes with --add-actors"
[ "$BENCHES" -ge 1 ] || [ -n "$ADD" ] || die "training needs at least one benchworker"
[ -z "$HOSTFILE" ] || [ "$SLURM" = 0 ] || die "--hostfile and --slurm exclude each other"
[ -z "$HOSTFILE" ] || [ -s "$HOSTFILE" ] || die "hostfile $HOSTFILE is empty or missing"
# Where peers run is checked before anything starts.
if [ -n "$HOSTFILE" ]; then
  mapfile -t HOSTS < <(tr -d '\r' <"$HOSTFILE" | sed -e 's/#.*//' -e '/^[[:space:]]*$/d' | awk '{print $1}')
  [ ${#HOSTS[@]} -gt 0 ] || die "no hosts in $HOSTFILE"
  command -v ssh >/dev/null || die "--hostfile: ssh not found"
fi
[ "$SLURM" = 0 ] || command -v srun >/dev/null || die "--slurm: srun not found (run inside an allocation)"

. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$EMBSHARD_ROOT"
BIN=$EMBSHARD_ROOT/target/release
# What is still running: LEARNER_PID and PIDS are cleared once waited for, so
# that no signal goes to a recycled PID. KEEP holds the write ends of the
# pipes on remote peers' ssh stdin (--hostfile): a remote peer stops when its
# pipe closes (see remote()), whether closed here or by launch.sh's death.
LEARNER_PID=""
PIDS=()
KEEP=()
close_keep() {
  local f
  for f in "${KEEP[@]}"; do exec {f}>&-; done
  KEEP=()
}
# The `backend = "…"` line of a configuration file (in [cluster], the only
# key of that name), if it has one.
config_backend() {
  { sed -n 's/^backend = "\([a-z]*\)".*/\1/p' "$1" 2>/dev/null || true; } | head -n 1
}
# However launch.sh ends, nothing it started outlives it (on success they
# have all ended already).
cleanup() {
  [ -z "$LEARNER_PID" ] || kill -TERM "$LEARNER_PID" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  close_keep
  [ -z "${FIFO_DIR:-}" ] || rm -rf "$FIFO_DIR"
}
trap cleanup EXIT

stop_all() {
  trap - INT TERM
  if [ -n "$LEARNER_PID" ]; then
    echo "launch: stopping (the learner writes a checkpoint)..." >&2
    kill -INT "$LEARNER_PID" 2>/dev/null || true
    wait "$LEARNER_PID" 2>/dev/null || true
    LEARNER_PID=""
    # What the learner said of its stop, from this session's log.
    tail -c +"$((LOG_START + 1))" "$LOGS/learner.log" 2>/dev/null |
      sed 's/\x1b\[[0-9;]*m//g' | grep -E 'checkpoint|stopped' | tail -n 2 >&2 || true
    echo "launch: continue with: scripts/launch.sh --resume $RUN_DIR" >&2
  else
    echo "launch: stopping..." >&2
  fi
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  close_keep
  wait 2>/dev/null || true
  PIDS=()
  exit 130
}

if [ -n "$ADD" ]; then
  # Scale out a running cluster: N more actors here.
  if [ -n "$TOKEN_FILE" ]; then
    [ -r "$TOKEN_FILE" ] || die "--token-file $TOKEN_FILE: no such readable file"
    export EMBSHARD_TOKEN; EMBSHARD_TOKEN=$(cat "$TOKEN_FILE")
  fi
  [ -n "${EMBSHARD_TOKEN:-}" ] || die "--add-actors needs --token-file FILE or EMBSHARD_TOKEN"
  LOGS=${RUN_DIR:-$EMBSHARD_ROOT/runs/added-actors}/logs
  mkdir -p "$LOGS"
  trap stop_all INT TERM
  ADDED=()
  for i in $(seq 1 "$ADD"); do
    log=$LOGS/actor-added-$$-$i.log
    session "$log" "actor for $LEARNER"
    "$BIN/actor" run --learner "$LEARNER" >>"$log" 2>&1 &
    PIDS+=($!)
    ADDED+=("$log")
  done
  echo "launch: started $ADD actors for $LEARNER (logs in $LOGS); they run until the learner stops them or Ctrl-C" >&2
  # Each actor's end as it comes (not in the order they started).
  FAILED=0
  LEFT=("${PIDS[@]}")
  while [ ${#LEFT[@]} -gt 0 ]; do
    status=0
    wait -n -p done "${LEFT[@]}" || status=$?
    for i in "${!PIDS[@]}"; do [ "${PIDS[$i]}" != "$done" ] || break; done
    mapfile -t LEFT < <(printf '%s\n' "${LEFT[@]}" | grep -vx "$done")
    if [ "$status" != 0 ]; then
      FAILED=$((FAILED + 1))
      echo "launch: actor $((i + 1)) failed; the end of ${ADDED[$i]}:" >&2
      tail -n 5 "${ADDED[$i]}" >&2
    fi
  done
  PIDS=()
  [ "$FAILED" = 0 ] || die "$FAILED of $ADD actors failed"
  echo "launch: the $ADD actors stopped (the learner ended)" >&2
  exit 0
fi

# A new cluster's token is --token-file's, or a new one that the learner
# writes to DIR/token: an EMBSHARD_TOKEN meant for --add-actors stays out.
[ -n "$TOKEN_FILE" ] || unset EMBSHARD_TOKEN

# Words for a remote login shell, whichever it is (sh, bash, zsh, csh, fish):
# each in single quotes, a ' in it as '\''. Remote commands run under
# `bash -c SCRIPT NAME ARGS...`, SCRIPT free of newlines and backslashes.
shq() { local w=("${@//\'/\'\\\'\'}"); printf "'%s' " "${w[@]}"; }

if [ -n "$HOSTFILE" ]; then
  # Every host that gets a peer answers over ssh and has bash and the
  # binaries at this checkout's path, before anything starts.
  USED=$((ACTORS + BENCHES < ${#HOSTS[@]} ? ACTORS + BENCHES : ${#HOSTS[@]}))
  mapfile -t CHECK < <(printf '%s\n' "${HOSTS[@]:0:$USED}" | sort -u)
  for h in "${CHECK[@]}"; do
    status=0
    # shellcheck disable=SC2016 # "$1" and "$2" expand there
    why=$(ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 \
      -o ServerAliveCountMax=2 "$h" \
      "bash -c $(shq 'test -x "$1" && test -x "$2"') embshard-check $(shq "$BIN/actor" "$BIN/benchworker")" \
      2>&1 </dev/null) ||
      status=$?
    case "$status" in
      0) ;;
      255) die "host $h does not answer over ssh (BatchMode): ${why:-no message}" ;;
      *) die "host $h has no bash or no $BIN/actor and benchworker${why:+ ($why)}: check out and build embshard at this same path there (scripts/setup.sh)" ;;
    esac
  done
fi

RUN_DIR=${RUN_DIR:-$EMBSHARD_ROOT/runs/default}
# A run with a finished checkpoint, or one stopped before its first with
# measurements logged (both what `learner train --resume` takes), or any
# run --resume names, is continued with its own configuration and backend.
# Its config.toml is what it trains with, so generate and eval take it too.
RESUME=0
if [ "$RESUME_ASKED" = 1 ] || compgen -G "$RUN_DIR/checkpoints/step-[0-9]*[0-9]" >/dev/null ||
  { [ -s "$RUN_DIR/cost_buffer.jsonl" ] && [ -f "$RUN_DIR/config.toml" ]; }; then
  RESUME=1
  [ -z "$CONFIG" ] || [ "$CONFIG" = "$RUN_DIR/config.toml" ] ||
    echo "launch: warning: continuing the run in $RUN_DIR with its own config.toml; --config $CONFIG is ignored (by training, generate and eval)" >&2
  [ -z "$MEASUREMENTS" ] ||
    echo "launch: warning: continuing the run in $RUN_DIR with its own budget (its config.toml); --measurements $MEASUREMENTS is ignored" >&2
  [ -z "$SEED" ] ||
    echo "launch: warning: continuing the run in $RUN_DIR with its own seed (its config.toml); --seed $SEED is ignored" >&2
  CONFIG=$RUN_DIR/config.toml
  # Recorded in its config.toml ([cluster] backend); runs from before that
  # record kept it in RUN/backend.
  RECORDED=$(config_backend "$RUN_DIR/config.toml")
  [ -n "$RECORDED" ] || RECORDED=$(cat "$RUN_DIR/backend" 2>/dev/null || echo sim)
  [ -z "$BACKEND" ] || [ "$BACKEND" = "$RECORDED" ] ||
    die "the run in $RUN_DIR measures with '$RECORDED', not '$BACKEND'"
  BACKEND=$RECORDED
fi
# A run another learner trains in is left alone, its endpoint and logs
# included (that learner holds RUN/lock; a second one would stop anyway).
# (flock -E 75: only a lock held elsewhere, not a file it cannot open or
# lock, counts as another learner.)
if [ -f "$RUN_DIR/lock" ] && command -v flock >/dev/null &&
  { flock -n -E 75 "$RUN_DIR/lock" true; [ $? = 75 ]; }; then
  die "another learner (pid $(cat "$RUN_DIR/lock" 2>/dev/null)) is training in $RUN_DIR: stop it first, or pick another --run-dir"
fi
CONFIG=${CONFIG:-$EMBSHARD_ROOT/configs/default.toml}
# A new run: --backend, else its configuration's [cluster] backend, else sim.
[ -n "$BACKEND" ] || BACKEND=$(config_backend "$CONFIG")
BACKEND=${BACKEND:-sim}
case "$BACKEND" in
  sim) ;;
  cpu) BUDGET=${BUDGET:-20} ;;
  cuda)
    BUDGET=${BUDGET:-20}
    # One cuda benchworker drives every GPU of its host (docs/gpu.md).
    [ -n "$HOSTFILE" ] || [ "$SLURM" = 1 ] || [ "$BENCHES" = 1 ] ||
      die "--backend cuda on one host: one benchworker drives all its GPUs; give --benchworkers 1"
    if [ "${EMBSHARD_CUDA:-0}" = 0 ]; then
      echo "launch: building the binaries with the cuda backend" >&2
      (cd "$EMBSHARD_ROOT" && cargo build --release --workspace --quiet "${CUDA_FEATURES[@]}")
    fi ;;
  *) die "--backend must be sim, cpu or cuda, not '$BACKEND'" ;;
esac
GENERATED=$("$BIN/learner" generate --config "$CONFIG")
SUITES=()
while read -r line; do
  echo "$line" >&2
  case "$line" in
    "wrote "*.test.json) SUITES+=(--suite "${line#wrote }") ;;
  esac
done <<<"$GENERATED"
[ ${#SUITES[@]} -gt 0 ] || { echo "launch: generate wrote no test suite" >&2; exit 1; }

# Where the learner listens: --bind-host, else loopback unless peers run on
# other hosts; then the address this host reaches the rest of the network
# from (the default route's source), not whatever `hostname -I` lists first
# (an IPv6 or a docker bridge address, say).
HOST=${BIND_HOST:-127.0.0.1}
if [ -n "$HOSTFILE" ] || [ "$SLURM" = 1 ]; then
  if [ -z "$BIND_HOST" ]; then
    HOST=$(ip -4 route get 1.1.1.1 2>/dev/null |
      awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }') || HOST=""
    [ -n "$HOST" ] || HOST=$(hostname -I 2>/dev/null |
      awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$/) { print $i; exit } }') || HOST=""
    [ -n "$HOST" ] || HOST=$(hostname)
  fi
  PORT=${PORT:-5555}
fi
PORT=${PORT:-0}
# A new folder that the learner refuses to start a run in is removed again,
# so that a retry with other flags starts clean.
NEW_RUN_DIR=0
[ -e "$RUN_DIR" ] || NEW_RUN_DIR=1
mkdir -p "$RUN_DIR/logs"
LOGS=$RUN_DIR/logs
rm -f "$RUN_DIR/endpoint"
TRAIN=(train --run-dir "$RUN_DIR" --backend "$BACKEND" --actors 0 --benchworkers 0)
if [ "$RESUME" = 1 ]; then
  echo "launch: continuing the run in $RUN_DIR" >&2
  TRAIN+=(--resume)
  # Peers that survived a learner crash know only the old endpoint.
  if [ "$PORT" = 0 ] && [ -f "$RUN_DIR/endpoint.last" ]; then
    OLD=$(cat "$RUN_DIR/endpoint.last")
    case "$OLD" in "tcp://$HOST:"*) PORT=${OLD##*:} ;; esac
  fi
else
  TRAIN+=(--config "$CONFIG")
  [ -z "$MEASUREMENTS" ] || TRAIN+=(--measurements "$MEASUREMENTS")
  [ -z "$SEED" ] || TRAIN+=(--seed "$SEED")
fi
[ -z "$TOKEN_FILE" ] || TRAIN+=(--token-file "$TOKEN_FILE")
session "$LOGS/learner.log" "learner"
LOG_START=$(stat -c %s "$LOGS/learner.log")
trap stop_all INT TERM
"$BIN/learner" "${TRAIN[@]}" --bind "tcp://$HOST:$PORT" >"$LOGS/learner.out" 2>>"$LOGS/learner.log" &
LEARNER_PID=$!
for _ in $(seq 1 600); do
  [ -f "$RUN_DIR/endpoint" ] && break
  if ! kill -0 "$LEARNER_PID" 2>/dev/null; then
    tail -c +"$((LOG_START + 1))" "$LOGS/learner.log" >&2
    [ "$NEW_RUN_DIR" = 0 ] || [ -e "$RUN_DIR/config.toml" ] || rm -rf "$RUN_DIR"
    exit 1
  fi
  sleep 0.1
done
[ -f "$RUN_DIR/endpoint" ] || die "the learner did not start listening (see $LOGS/learner.log)"
ENDPOINT=$(cat "$RUN_DIR/endpoint")
cp "$RUN_DIR/endpoint" "$RUN_DIR/endpoint.last"
TOKEN_FILE=${TOKEN_FILE:-$RUN_DIR/token}
echo "launch: learner at $ENDPOINT; $ACTORS actors, $BENCHES $BACKEND benchworkers; logs in $LOGS" >&2
# No actors: nothing rolls out, and the learner waits for some to join.
[ "$ACTORS" != 0 ] || echo "launch: no actors (--actors 0): training waits until some join;" \
  "from another shell: scripts/launch.sh --add-actors N --learner $ENDPOINT --token-file $TOKEN_FILE" >&2

ACTOR=("$BIN/actor" run --learner "$ENDPOINT")
BENCH=("$BIN/benchworker" serve --learner "$ENDPOINT" --backend "$BACKEND")
if [ "$SLURM" = 1 ]; then
  # The token travels in the environment (srun --export), never in arguments.
  export EMBSHARD_TOKEN; EMBSHARD_TOKEN=$(cat "$TOKEN_FILE")
  session "$LOGS/actors.log" "actors"; session "$LOGS/benchworkers.log" "benchworkers"
  [ "$ACTORS" = 0 ] || { srun --export=ALL --ntasks="$ACTORS" "${ACTOR[@]}" >>"$LOGS/actors.log" 2>&1 & PIDS+=($!); }
  srun --export=ALL --ntasks="$BENCHES" "${BENCH[@]}" >>"$LOGS/benchworkers.log" 2>&1 &
  PIDS+=($!)
elif [ -n "$HOSTFILE" ]; then
  # The token goes over ssh's stdin, never on a command line; then that
  # stdin stays open, a pipe whose write end only launch.sh holds (in KEEP).
  # On the remote host, under bash whatever the login shell, the peer runs
  # beside a watchdog that reads the rest of stdin: when it ends (launch.sh
  # closed the pipe or died, or the ssh client was killed and sshd closed
  # the session), the peer gets SIGTERM, its clean stop, and SIGKILL if it
  # is still there 10 s later. A peer that ends ends its ssh session.
  # (The script's lines are joined by spaces: no newline goes to csh.)
  PEER_SH=$(tr '\n' ' ' <<'SH'
exec 3<&0 </dev/null;
read -r EMBSHARD_TOKEN <&3; export EMBSHARD_TOKEN;
"$@" 3<&- & p=$!;
{ while read -r _; do :; done; kill -TERM $p; i=0;
  while kill -0 $p; do [ $i -lt 100 ] || kill -KILL $p; sleep 0.1; i=$((i + 1)); done;
} <&3 >/dev/null 2>&1 & w=$!;
exec 3<&-; wait $p; s=$?; kill $w 2>/dev/null; exit $s
SH
)
  FIFO_DIR=$(mktemp -d)
  remote() { # remote HOST LOG COMMAND...
    local host=$1 log=$2 r w; shift 2
    session "$log" "on $host"
    mkfifo -m 600 "$FIFO_DIR/stdin"
    # shellcheck disable=SC2094 # a pipe: both ends, neither blocks
    exec {w}<>"$FIFO_DIR/stdin" {r}<"$FIFO_DIR/stdin"
    rm -f "$FIFO_DIR/stdin"
    printf '%s\n' "$(<"$TOKEN_FILE")" >&"$w"
    { # ssh alone reads the pipe; no other peer's write end goes with it
      close_keep
      exec ssh -o BatchMode=yes "$host" "bash -c $(shq "$PEER_SH") embshard-peer $(shq "$@")" \
        <&"$r" {r}<&- {w}>&- >>"$log" 2>&1
    } &
    PIDS+=($!)
    exec {r}<&-
    KEEP+=("$w")
  }
  k=0
  for i in $(seq 1 "$ACTORS"); do
    h=${HOSTS[$((k % ${#HOSTS[@]}))]}; k=$((k + 1))
    remote "$h" "$LOGS/actor-$i-$h.log" "${ACTOR[@]}"
  done
  for i in $(seq 1 "$BENCHES"); do
    h=${HOSTS[$((k % ${#HOSTS[@]}))]}; k=$((k + 1))
    remote "$h" "$LOGS/benchworker-$i-$h.log" "${BENCH[@]}"
  done
  rmdir "$FIFO_DIR"; FIFO_DIR=""
else
  for i in $(seq 1 "$ACTORS"); do
    session "$LOGS/actor-$i.log" "actor"
    "${ACTOR[@]}" --token-file "$TOKEN_FILE" >>"$LOGS/actor-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in $(seq 1 "$BENCHES"); do
    session "$LOGS/benchworker-$i.log" "benchworker"
    "${BENCH[@]}" --token-file "$TOKEN_FILE" >>"$LOGS/benchworker-$i.log" 2>&1 &
    PIDS+=($!)
  done
fi

# The learner's progress lines (it writes one every 30 s or twentieth of
# its updates to its log), shown here until it ends.
tail -c +"$((LOG_START + 1))" --pid="$LEARNER_PID" -F "$LOGS/learner.log" 2>/dev/null |
  sed -u 's/\x1b\[[0-9;]*m//g' | grep --line-buffered -E 'INFO update [0-9]+/[0-9]+, round' >&2 &
PROGRESS_PID=$!

STATUS=0
wait "$LEARNER_PID" || STATUS=$?
wait "$PROGRESS_PID" 2>/dev/null || true
LEARNER_PID=""
trap - INT TERM
cat "$LOGS/learner.out"
if [ "$STATUS" != 0 ]; then
  tail -n 20 "$LOGS/learner.log" >&2
  exit "$STATUS" # cleanup stops the peers
fi
# The learner told every peer to stop; give them a moment, then make sure.
for p in "${PIDS[@]}"; do
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -INT "$p" 2>/dev/null || true
done
close_keep # remote peers: ssh clients ignore SIGINT
wait 2>/dev/null || true
PIDS=()
[ "$EVAL" = 1 ] || exit 0

EXTRA=()
[ -z "$BUDGET" ] || EXTRA=(--search-budget "$BUDGET")
"$BIN/learner" eval --config "$CONFIG" --backend "$BACKEND" --methods all \
  --checkpoint "$RUN_DIR" "${EXTRA[@]}" "${SUITES[@]}"
