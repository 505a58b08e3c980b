#!/usr/bin/env python3
"""Attack a learner on loopback and check that it holds.

Three parts, each bounded in count and time:

  flood  A learner trains with --bind on 127.0.0.1 under an open-files
         limit of 512. A hostile peer opens idle connections, sends
         crafted frames with the cluster token, then garbage frames as fast
         as it can. The learner must keep training, keep its memory and log
         small, count what it dropped, and stop cleanly on SIGTERM.
  kill   A training run is killed with SIGKILL again and again (half of the
         kills while a checkpoint is being written) and resumed each time.
         No measurement logged before a kill may be missing after it; the
         run must end with exactly its budget of measurements.
  files  Malformed input files (tables, configs, suites, placements,
         checkpoints, cost logs, metrics, tokens) are given to the commands
         that read them. Each must end with an error message or accept the
         file; none may panic, hang or die of a signal.

Usage:
  scripts/fuzz.py                 # the full run (about 5 minutes)
  scripts/fuzz.py --quick         # a short run (about a minute; scripts/test.sh runs it)
  scripts/fuzz.py --parts kill    # one part only

It prints one line per check and a JSON summary (--out FILE keeps it),
and exits 1 if any check failed. Binaries come from target/release
(built first unless --no-build).
"""

import argparse
import glob
import json
import re
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
LEARNER = os.path.join(BIN, "learner")
BENCHWORKER = os.path.join(BIN, "benchworker")
PEER = os.path.join(BIN, "examples", "fuzz_peer")

FAILURES = []

# The flood's learner runs under this open-files limit: its connection cap
# (the limit less 256) is then within an attacker's reach on loopback.
LIMIT = 512


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def build():
    # libtorch comes from the project's venv (scripts/setup.sh makes it).
    venv = os.path.join(ROOT, ".venv", "bin")
    env = dict(os.environ, LIBTORCH_USE_PYTORCH="1",
               PATH=venv + os.pathsep + os.environ.get("PATH", ""))
    for args in (
        ["-p", "embshard-learner", "-p", "embshard-benchworker", "--bins"],
        ["-p", "embshard-net", "--example", "fuzz_peer"],
    ):
        subprocess.run(["cargo", "build", "--release", "--quiet", *args], cwd=ROOT, env=env, check=True)


def run(args, timeout=120, **kw):
    """Runs a command; returns (returncode or 'timeout', stdout, stderr)."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout, **kw)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", e.stdout or "", e.stderr or ""


def small_config(work, name, iterations, measure=3, extra=""):
    """A small training configuration (12 tables on 3 devices), its data generated."""
    data = os.path.join(work, "data")
    cfg = os.path.join(work, name)
    steps = extra or "cost_steps = 20\npolicy_steps = 5"
    with open(cfg, "w") as f:
        f.write(
            f"""[generate]
tables = 120
[data]
dir = "{data}"
train_tasks = 4
test_tasks = 2
suites = [{{ tables = 12, devices = 3, memory_gb = 50.0 }}]
[train]
suite = "{data}/dlrm-12x3.train.json"
iterations = {iterations}
measure_per_iteration = {measure}
{steps}
episodes = 8
checkpoint_every = 1
"""
        )
    if not os.path.exists(os.path.join(data, "dlrm-12x3.train.json")):
        code, _, err = run([LEARNER, "generate", "--config", cfg])
        if code != 0:
            sys.exit(f"learner generate failed: {err}")
    return cfg, data


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def wait_for(what, seconds, cond):
    end = time.time() + seconds
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    sys.exit(f"gave up waiting for {what} after {seconds} s")


def open_files(n):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return set_limit


def raise_open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def peer(args, timeout):
    code, out, err = run([PEER, *args], timeout=timeout, preexec_fn=raise_open_files)
    if code != 0 or not out.strip():
        check(False, f"fuzz_peer {args[0]} ran ({code}): {err.strip()[-300:]}")
        return {}
    return json.loads(out.strip().splitlines()[-1])


def flood(work, quick):
    """A training learner under attack on loopback."""
    cfg, _ = small_config(work, "flood.toml", iterations=100000)
    rundir = os.path.join(work, "flood-run")
    log_path = os.path.join(work, "flood.log")
    log = open(log_path, "w")
    learner = subprocess.Popen(
        [LEARNER, "train", "--config", cfg, "--run-dir", rundir, "--bind", "tcp://127.0.0.1:0",
         "--actors", "1", "--benchworkers", "1"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=open_files(LIMIT),
    )
    try:
        endpoint = wait_for("the learner's endpoint", 120,
                            lambda: open(os.path.join(rundir, "endpoint")).read().strip()
                            if os.path.exists(os.path.join(rundir, "endpoint")) else None)
        token = os.path.join(rundir, "token")
        metrics = os.path.join(rundir, "metrics.jsonl")
        wait_for("a first policy update", 120, lambda: lines(metrics) > 0)
        out = {"endpoint": endpoint, "open_files_limit": LIMIT}
        out["rss_kib_before"] = rss_kib(learner.pid)
        out["log_bytes_before"] = os.path.getsize(log_path)
        seconds = 5 if quick else 60

        def alive(phase, since):
            check(learner.poll() is None, f"flood/{phase}: the learner is running "
                  f"({lines(metrics) - since} policy updates meanwhile)")

        # Idle connections, more than the open-files limit allows. How many
        # the learner counts open at once depends on how fast it accepts
        # them; a burst that never takes it past its cap is tried again (at
        # most three bursts), so that the cap's check below has something
        # to check.
        since = start = lines(metrics)
        for burst in range(3):
            conns = peer(["connect", endpoint, "--count", "1000" if quick else "2000", "--hold-s", "8"], 120)
            log.flush()
            if "connections open to the learner" in open(log_path, errors="replace").read():
                break
        out["connect"] = conns
        out["connect_bursts"] = burst + 1
        alive("connect", since)
        if conns:
            lived = (f"; they lived {conns['lived_median_s']:.2f} s at the median, "
                     f"{conns['lived_max_s']:.2f} s at most" if conns["closed_by_learner"] else "")
            check(conns["closed_by_learner"] == conns["opened"],
                  f"flood/connect: the learner closed all {conns['opened']} idle connections "
                  f"({conns['closed_by_learner']}{lived})")

        # Crafted frames from a token holder.
        since = lines(metrics)
        frames = "20000" if quick else "250000"
        out["crafted"] = peer(["crafted", endpoint, "--token-file", token, "--frames", frames,
                               "--seconds", str(seconds), "--seed", "1"], seconds + 60)
        alive("crafted", since)

        # Garbage as fast as the socket takes it.
        since = lines(metrics)
        out["garbage"] = peer(["garbage", endpoint, "--token-file", token, "--seconds", str(seconds),
                               "--seed", "2"], seconds + 60)
        alive("garbage", since)
        time.sleep(1)
        out["policy_updates_meanwhile"] = lines(metrics) - start
        check(lines(metrics) > start, f"flood: it kept training ({lines(metrics) - start} policy updates)")
        out["rss_kib_after"] = rss_kib(learner.pid)
        out["log_bytes_after"] = os.path.getsize(log_path)
        grew_kib = (out["rss_kib_after"] or 0) - (out["rss_kib_before"] or 0)
        check(grew_kib < 200 * 1024, f"flood: the learner's memory grew by {grew_kib} KiB (under 200 MiB)")
        log_grew = out["log_bytes_after"] - out["log_bytes_before"]
        check(log_grew < 1 << 20, f"flood: its log grew by {log_grew} bytes (under 1 MiB)")

        learner.send_signal(signal.SIGTERM)
        try:
            code = learner.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = "timeout"
        log.flush()
        text = open(log_path, errors="replace").read()
        check(code == 143, f"flood: SIGTERM stopped it with status 143 ({code})")
        check("panicked" not in text, "flood: no panic in its log")
        counted = [l for l in text.splitlines() if "undecodable frames" in l]
        out["learner_counted"] = counted[-1].split("WARN", 1)[-1].strip() if counted else None
        check(bool(counted), "flood: the learner's last lines count what it dropped")
        # More connections came at once than its cap allows: some were shed.
        shed = re.search(r"(\d+) connections closed at the cap", out["learner_counted"] or "")
        out["shed"] = int(shed.group(1)) if shed else 0
        check(out["shed"] > 0, f"flood: {out['shed']} connections closed at the cap of {LIMIT - 256}")
        return out
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        log.close()


def complete_lines(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return b""
    return data[: data.rfind(b"\n") + 1]


def kill(work, quick):
    """SIGKILL a training run again and again; resume it each time."""
    iterations = 20 if quick else 100
    kills = 4 if quick else 30
    # More steps per round: a round, and so a checkpoint, every second or so.
    cfg, _ = small_config(work, "kill.toml", iterations=iterations,
                          extra="cost_steps = 300\npolicy_steps = 20")
    rundir = os.path.join(work, "kill-run")
    costlog = os.path.join(rundir, "cost_buffer.jsonl")
    rng = random.Random(3)
    out = {"kills": 0, "mid_checkpoint": 0, "lost": 0, "failed_resumes": 0}
    # The complete lines of the cost log at each kill: each must still begin
    # the log once the next run has read it back and written after it.
    before = b""

    def lost_since(previous):
        now = complete_lines(costlog)
        if now.startswith(previous):
            return 0
        return previous.count(b"\n") - os.path.commonprefix([previous, now]).count(b"\n")

    first = True
    for k in range(kills):
        args = ([LEARNER, "train", "--config", cfg, "--run-dir", rundir] if first
                else [LEARNER, "train", "--run-dir", rundir, "--resume"])
        errlog = open(os.path.join(work, f"kill-{k}.log"), "w")
        p = subprocess.Popen(args, stdout=errlog, stderr=subprocess.STDOUT)
        if first:
            # A run exists to resume once its config.toml is written.
            wait_for("the run's config.toml", 120,
                     lambda: os.path.exists(os.path.join(rundir, "config.toml")) or p.poll() is not None)
        first = False
        mid = k % 2 == 1
        end = time.time() + (rng.uniform(0.3, 2.0) if not mid else 20)
        while time.time() < end and p.poll() is None:
            if mid and glob.glob(os.path.join(rundir, "checkpoints", "*.tmp")):
                break
            time.sleep(0.002 if mid else 0.05)
        if p.poll() is not None:
            errlog.close()
            if p.returncode == 0:
                break  # the run ended before this kill
            out["failed_resumes"] += 1
            check(False, f"kill: run {k} ended by itself with status {p.returncode} "
                  f"(see {errlog.name})")
            break
        in_checkpoint = bool(glob.glob(os.path.join(rundir, "checkpoints", "*.tmp")))
        out["lost"] += lost_since(before)
        before = complete_lines(costlog)
        p.kill()
        p.wait()
        errlog.close()
        out["kills"] += 1
        out["mid_checkpoint"] += in_checkpoint
    # The rest of the run, unharmed.
    code, _, err = run([LEARNER, "train", "--run-dir", rundir, "--resume"], timeout=600)
    check(code == 0, f"kill: the run resumed to its end after {out['kills']} kills ({code})")
    out["lost"] += lost_since(before)
    picks = []
    with open(costlog, "rb") as f:
        for line in f:
            try:
                pick = json.loads(line)["sample"]["pick"]
                picks.append((pick["round"], pick["place"]))
            except (ValueError, KeyError, TypeError):
                pass
    metrics = [json.loads(l) for l in open(os.path.join(rundir, "metrics.jsonl"))]
    steps = [m["step"] for m in metrics]
    budget = iterations * 3
    every = sorted((r, i) for r in range(iterations) for i in range(3))
    out["measurements"] = len(picks)
    out["budget"] = budget
    least = 2 if quick else kills // 2
    check(out["kills"] >= least, f"kill: {out['kills']} kills before the run ended (at least {least})")
    if not quick:
        check(out["mid_checkpoint"] > 0, f"kill: {out['mid_checkpoint']} kills while a checkpoint was written")
    check(out["lost"] == 0, f"kill: no measurement lost over {out['kills']} kills "
          f"({out['mid_checkpoint']} while a checkpoint was written)")
    check(sorted(picks) == every, f"kill: the cost log holds each of the {budget} picks once "
          f"({len(picks)} lines, {len(set(picks))} picks)")
    check(metrics[-1]["measurements"] == budget,
          f"kill: the last metrics line counts {metrics[-1]['measurements']} measurements")
    check(steps == list(range(1, len(steps) + 1)), f"kill: policy updates 1 to {len(steps)}, in order")
    left = glob.glob(os.path.join(rundir, "checkpoints", "*.tmp"))
    check(not left, f"kill: no half-written checkpoint left ({len(left)})")
    return out, rundir


def mutations(data, rng):
    """Malformed versions of a file's bytes, with what was done."""
    n = len(data)
    flipped = bytearray(data)
    for _ in range(8):
        if n:
            i = rng.randrange(n)
            flipped[i] ^= 1 << rng.randrange(8)
    text = data.decode("utf-8", "replace")
    digits = "".join("9" * 400 if c.isdigit() and rng.random() < 0.05 else c for c in text)
    yield "empty", b""
    yield "cut in half", data[: n // 2]
    yield "cut at random", data[: rng.randrange(n)] if n else b"x"
    yield "bits flipped", bytes(flipped)
    yield "random bytes", bytes(rng.randrange(256) for _ in range(max(n, 64)))
    yield "not UTF-8", b"\xff\xfe" + data
    yield "huge numbers", digits.encode()
    yield "negatives and NaN", text.replace("1", "-1").replace("0.", "NaN").encode()
    yield "twice over", data + data
    yield "a 2 MiB line", data + b"\n" + b"A" * (2 << 20) + b"\n"


def files(work, quick, trained):
    """Malformed input files, given to the commands that read them."""
    rng = random.Random(4)
    d = os.path.join(work, "files")
    os.makedirs(d, exist_ok=True)
    cfg, data = small_config(work, "files.toml", iterations=2)
    tables = os.path.join(d, "tables.csv")
    with open(tables, "w") as f:
        f.write("name,rows,dim,pooling_factor\n")
        for i in range(12):
            f.write(f"t{i},{rng.randrange(1000, 2000000)},{rng.choice([16, 32, 64, 128])},"
                    f"{rng.uniform(1, 40):.2f}\n")
    placement = os.path.join(d, "plan.json")
    code, _, err = run([LEARNER, "plan", "--tables", tables, "--devices", "3", "--memory-gb", "50",
                        "--method", "lookup", "--out", placement])
    if code != 0:
        sys.exit(f"learner plan failed: {err}")
    suite = os.path.join(data, "dlrm-12x3.test.json")
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("a-cluster-token\n")
    ckpt = sorted(glob.glob(os.path.join(trained, "checkpoints", "step-*[0-9]")))[-1]

    def in_copy(rel):
        """A copy of the trained run, `rel` in it to be damaged."""
        def make(path_bytes, k):
            copy = os.path.join(d, f"run-{k}")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(trained, copy)
            target = os.path.join(copy, os.path.relpath(rel, trained))
            with open(target, "wb") as f:
                f.write(path_bytes)
            return copy
        return make

    cases = [
        ("tables CSV", tables, lambda p, k: [LEARNER, "plan", "--tables", p, "--devices", "3",
                                             "--memory-gb", "50", "--method", "lookup"]),
        ("config TOML", cfg, lambda p, k: [LEARNER, "config", "--config", p]),
        ("suite JSON", suite, lambda p, k: [LEARNER, "eval", "--suite", p, "--methods", "lookup,size"]),
        ("placement JSON", placement, lambda p, k: [BENCHWORKER, "measure", "--backend", "sim",
                                                   "--tables", tables, "--placement", p,
                                                   "--memory-gb", "50"]),
        # With threads beside it the learner needs no peer: a token it
        # takes ends in a run of two rounds.
        ("token file", token, lambda p, k: [LEARNER, "train", "--config", cfg, "--run-dir",
                                           os.path.join(d, f"token-run-{k}"), "--token-file", p,
                                           "--bind", "tcp://127.0.0.1:0", "--actors", "1",
                                           "--benchworkers", "1"]),
    ]
    damaged = [
        ("checkpoint policy", os.path.join(ckpt, "policy.ot"), "plan"),
        ("checkpoint state", next(iter(sorted(glob.glob(os.path.join(ckpt, "*.json")))), None), "plan"),
        ("run config", os.path.join(trained, "config.toml"), "plan"),
        ("cost log", os.path.join(trained, "cost_buffer.jsonl"), "resume"),
        ("metrics log", os.path.join(trained, "metrics.jsonl"), "report"),
    ]
    for what, path, how in damaged:
        if path is None:
            continue
        make = in_copy(path)

        def command(p, k, make=make, how=how):
            copy = make(open(p, "rb").read(), k)
            if how == "plan":
                return [LEARNER, "plan", "--tables", tables, "--devices", "3", "--memory-gb", "50",
                        "--run", copy]
            if how == "resume":
                return [LEARNER, "train", "--run-dir", copy, "--resume"]
            return [LEARNER, "report", copy]

        cases.append((what, path, command))

    out = {"files": 0, "refused": 0, "accepted": 0, "accepted_cases": [], "bad": []}
    k = 0
    for what, path, command in cases:
        original = open(path, "rb").read()
        for how, damaged_bytes in mutations(original, rng):
            if quick and rng.random() < 0.6:
                continue
            k += 1
            bad = os.path.join(d, f"bad-{k}{os.path.splitext(path)[1]}")
            with open(bad, "wb") as f:
                f.write(damaged_bytes)
            code, _, err = run(command(bad, k), timeout=120, cwd=ROOT)
            out["files"] += 1
            if code == 0:
                out["accepted"] += 1
                out["accepted_cases"].append(f"{what}, {how}")
            elif isinstance(code, int) and code in (1, 2) and "panicked" not in err and err.strip():
                out["refused"] += 1
            else:
                last = err.strip().splitlines()[-1:] if err.strip() else ["(no message)"]
                out["bad"].append(f"{what}, {how}: status {code}: {last[0][:200]}")
    check(not out["bad"], f"files: {out['files']} malformed files, {out['refused']} refused with an "
          f"error, {out['accepted']} accepted, {len(out['bad'])} panicked, hung or died")
    for b in out["bad"]:
        print("      " + b)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    ap.add_argument("--parts", default="flood,kill,files", help="which parts (default: all three)")
    ap.add_argument("--no-build", action="store_true", help="use the binaries in target/release as they are")
    ap.add_argument("--out", help="write the JSON summary here too")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"flood", "kill", "files"}
    if unknown:
        ap.error(f"unknown parts: {', '.join(sorted(unknown))} (flood, kill, files)")
    if not args.no_build:
        build()
    work = tempfile.mkdtemp(prefix="embshard-fuzz-")
    print(f"working in {work}", flush=True)
    summary = {"quick": args.quick}
    start = time.time()
    try:
        if "flood" in parts:
            summary["flood"] = flood(work, args.quick)
        trained = None
        if "kill" in parts or "files" in parts:
            summary["kill"], trained = kill(work, args.quick)
        if "files" in parts:
            summary["files"] = files(work, args.quick, trained)
    finally:
        summary["seconds"] = round(time.time() - start, 1)
        summary["failures"] = FAILURES
        print(json.dumps(summary, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)
        if args.keep or FAILURES:
            print(f"kept {work} (its logs)", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
