//! The cluster as real processes on loopback with ephemeral ports: actors,
//! benchworkers and the learner killed with SIGKILL mid-run, strangers with
//! the wrong token, garbage on the learner's port, a learner that gives up
//! waiting for peers (with a checkpoint). Each test is bounded in
//! time; the recovery times are printed (run with --nocapture to see them).
//!
//! The `actor` and `benchworker` binaries are the ones built beside the
//! learner (scripts/test.sh builds the workspace first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod support;
use support::wait_for;

fn bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_learner"))
        .parent()
        .unwrap()
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A process whose output goes to files, killed if the test fails.
struct Proc {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn start(dir: &Path, label: &str, program: &Path, args: &[&str]) -> Proc {
        let out = dir.join(format!("{label}.out"));
        let err = dir.join(format!("{label}.log"));
        let child = Command::new(program)
            .args(args)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Proc { child, out, err }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap(); // SIGKILL: no chance to clean up
        self.child.wait().unwrap();
    }

    /// Waits (polling) for the process to exit, at most `within`.
    fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < within,
                "{} did not exit within {within:?}",
                self.out.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a clean exit; returns stdout.
    fn finish(&mut self, within: Duration) -> String {
        let status = self.exited(within);
        let err = std::fs::read_to_string(&self.err).unwrap_or_default();
        assert!(status.success(), "{}: {status}\n{err}", self.err.display());
        assert!(!err.contains("panicked"), "{err}");
        std::fs::read_to_string(&self.out).unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// A small run's configuration, with fast heartbeats, and its data.
fn setup(dir: &Path, iterations: usize, extra: &str) -> PathBuf {
    let data = dir.join("data");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nheartbeat_s = 0.25\npeer_timeout_s = 3.0\n\
             [generate]\ntables = 120\n[data]\ndir = {data:?}\ntrain_tasks = 4\ntest_tasks = 2\n\
             suites = [{{ tables = 12, devices = 3, memory_gb = 50.0 }}]\n\
             [train]\nsuite = {:?}\niterations = {iterations}\nmeasure_per_iteration = 3\n\
             cost_steps = 5\npolicy_steps = 3\nepisodes = 4\n{extra}",
            data.join("dlrm-12x3.train.json")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(["generate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    cfg
}

/// Starts a learner that accepts remote peers; returns it and its endpoint.
fn learner(dir: &Path, label: &str, args: &[&str]) -> (Proc, String) {
    let run = dir.join("run");
    let mut all = vec!["train", "--run-dir", run.to_str().unwrap()];
    all.extend_from_slice(args);
    let p = Proc::start(dir, label, &bin("learner"), &all);
    let endpoint = run.join("endpoint");
    wait_for("the learner's endpoint", Duration::from_secs(30), || {
        endpoint.exists()
    });
    let e = std::fs::read_to_string(endpoint)
        .unwrap()
        .trim()
        .to_string();
    (p, e)
}

/// A new run's learner on a free loopback port with `actors` and
/// `benchworkers` threads of its own.
fn fresh_learner(
    dir: &Path,
    label: &str,
    cfg: &Path,
    actors: &str,
    benches: &str,
) -> (Proc, String) {
    learner(
        dir,
        label,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--bind",
            "tcp://127.0.0.1:0",
            "--actors",
            actors,
            "--benchworkers",
            benches,
        ],
    )
}

fn actor(dir: &Path, label: &str, endpoint: &str, token: &Path) -> Proc {
    Proc::start(
        dir,
        label,
        &bin("actor"),
        &[
            "run",
            "--learner",
            endpoint,
            "--token-file",
            token.to_str().unwrap(),
            "--wait-s",
            "60",
        ],
    )
}

fn bench(dir: &Path, label: &str, endpoint: &str, token: &Path, backend: &str) -> Proc {
    Proc::start(
        dir,
        label,
        &bin("benchworker"),
        &[
            "serve",
            "--learner",
            endpoint,
            "--backend",
            backend,
            "--token-file",
            token.to_str().unwrap(),
            "--wait-s",
            "60",
        ],
    )
}

/// `label N` in a peer's summary line.
fn count(text: &str, label: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == label)
        .and_then(|w| w[1].parse().ok())
        .unwrap_or_else(|| panic!("no `{label} N` in {text:?}"))
}

#[test]
fn a_killed_actor_is_replaced_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, 30, "");
    let (mut l, ep) = fresh_learner(d, "learner", &cfg, "0", "1");
    let token = d.join("run").join("token");
    let metrics = d.join("run").join("metrics.jsonl");
    let mut a1 = actor(d, "a1", &ep, &token);
    wait_for(
        "updates from the first actor",
        Duration::from_secs(60),
        || lines(&metrics) >= 6,
    );
    a1.kill();
    let at_kill = lines(&metrics);
    // A stranger with the wrong token is refused for good, at its
    // connection's handshake: it stops at once, saying why.
    let wrong = d.join("wrong-token");
    std::fs::write(&wrong, "not the token\n").unwrap();
    let start = Instant::now();
    let mut stranger = actor(d, "stranger", &ep, &wrong);
    let status = stranger.exited(Duration::from_secs(30));
    let err = std::fs::read_to_string(&stranger.err).unwrap();
    assert!(
        !status.success()
            && err.contains("refused our cluster token at the connection's handshake")
            && err.contains("wrong cluster token"),
        "{err}"
    );
    eprintln!(
        "a stranger with the wrong token stopped {:.2} s after it started",
        start.elapsed().as_secs_f64()
    );
    // Garbage on the learner's port.
    let addr = ep.trim_start_matches("tcp://");
    let mut junk = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut junk, &[0xff; 300]).unwrap();
    drop(junk);
    let start = Instant::now();
    let mut a2 = actor(d, "a2", &ep, &token);
    wait_for(
        "updates from the second actor",
        Duration::from_secs(60),
        || lines(&metrics) >= at_kill + 6,
    );
    eprintln!(
        "actor killed: a new actor's unrolls were learned from {:.2} s after it started",
        start.elapsed().as_secs_f64()
    );
    let out = l.finish(Duration::from_secs(120));
    assert!(out.contains("trained 30 iterations"), "{out}");
    assert!(count(&a2.finish(Duration::from_secs(30)), "sent") > 0);
    let log = std::fs::read_to_string(&l.err).unwrap();
    assert!(
        log.contains("refused a connection from 127.0.0.1 at its handshake: wrong cluster token")
            && log.contains("connections refused at their handshake"),
        "{log}"
    );
    assert_eq!(lines(&metrics), 90);
}

#[test]
fn a_killed_benchworkers_job_is_measured_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(
        d,
        6,
        "[cpu]\nbatch = 256\nmax_rows = 2000\nwarmup = 1\nrepeats = 3\n",
    );
    let (mut l, ep) = fresh_learner(d, "learner", &cfg, "1", "0");
    let token = d.join("run").join("token");
    let log = d.join("run").join("cost_buffer.jsonl");
    let mut b1 = bench(d, "b1", &ep, &token, "cpu");
    let mut b2 = bench(d, "b2", &ep, &token, "cpu");
    wait_for("a few measurements", Duration::from_secs(60), || {
        lines(&log) >= 4
    });
    b1.kill();
    let start = Instant::now();
    let at_kill = lines(&log);
    wait_for(
        "measurements after the kill",
        Duration::from_secs(60),
        || lines(&log) > at_kill + 2,
    );
    eprintln!(
        "benchworker killed: measuring went on within {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let out = l.finish(Duration::from_secs(120));
    assert!(out.contains("18 measurements"), "{out}");
    // Each plan of the budget logged exactly once.
    assert_eq!(lines(&log), 18);
    let summary = b2.finish(Duration::from_secs(30));
    assert!(
        count(&summary, "measured") >= (18 - at_kill) as u64,
        "{summary}"
    );
}

#[test]
fn a_killed_learner_resumes_and_its_peers_come_back_by_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, 30, "");
    let (mut l1, ep) = fresh_learner(d, "learner1", &cfg, "0", "0");
    let run = d.join("run");
    let token = run.join("token");
    let log = run.join("cost_buffer.jsonl");
    let metrics = run.join("metrics.jsonl");
    let mut a = actor(d, "a", &ep, &token);
    let mut b = bench(d, "b", &ep, &token, "sim");
    wait_for("two checkpoints", Duration::from_secs(60), || {
        learner::checkpoint::list(&run).len() >= 2
    });
    l1.kill();
    let killed = Instant::now();
    let logged_at_kill = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(run.join("endpoint")).unwrap();
    // The same endpoint (peers know no other), the run's own token.
    let (mut l2, ep2) = learner(
        d,
        "learner2",
        &[
            "--resume",
            "--bind",
            &ep,
            "--actors",
            "0",
            "--benchworkers",
            "0",
        ],
    );
    assert_eq!(ep2, ep);
    let resumed_at = lines(&metrics);
    wait_for("updates after the resume", Duration::from_secs(60), || {
        lines(&metrics) > resumed_at + 3
    });
    eprintln!(
        "learner killed: training went on {:.2} s after the kill (restart included)",
        killed.elapsed().as_secs_f64()
    );
    let out = l2.finish(Duration::from_secs(120));
    assert!(out.contains("trained 30 iterations"), "{out}");
    let steps: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (1..=90).collect::<Vec<u64>>(), "the curve continues");
    // Every measurement logged before the kill is kept; the budget is spent
    // exactly (an entry the kill tore would be a line to skip).
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.starts_with(logged_at_kill.trim_end_matches(|c| c != '\n')),
        "the log kept what it held"
    );
    let read = learner::costlog::CostLog::read(&log).unwrap();
    assert!(read.skipped <= 1, "{} entries skipped", read.skipped);
    assert_eq!(read.samples.len(), 90);
    let a_out = a.finish(Duration::from_secs(30));
    let b_out = b.finish(Duration::from_secs(30));
    assert!(count(&a_out, "rejoined") >= 1, "{a_out}");
    assert!(count(&b_out, "rejoined") >= 1, "{b_out}");
}

#[test]
fn ctrl_c_while_the_learner_waits_for_peers_stops_it_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), 5, "");
    // No peers of its own and none come: once it has written its endpoint
    // (after its signal handler is in place, just before its loop starts),
    // the learner spends its time waiting on its socket, where the signal
    // finds it.
    let (mut l, _) = fresh_learner(dir.path(), "learner", &cfg, "0", "0");
    let sent = Command::new("kill")
        .args(["-INT", &l.child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    // It exits as the shell says a process SIGINT ended does.
    let status = l.exited(Duration::from_secs(20));
    let err = std::fs::read_to_string(&l.err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("--resume continues") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(learner::checkpoint::list(&dir.path().join("run")).len(), 1);
}

#[test]
fn a_learner_that_stops_for_want_of_progress_checkpoints_first_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, 3, "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let short = text.replace(
        "peer_timeout_s = 3.0\n",
        "peer_timeout_s = 3.0\nstall_timeout_s = 2.0\n",
    );
    assert_ne!(short, text);
    std::fs::write(&cfg, short).unwrap();
    // A benchworker and no actor: the first round's plans are measured and
    // the cost network fitted to them, then no unroll comes.
    let (mut l1, ep) = fresh_learner(d, "learner1", &cfg, "0", "1");
    let status = l1.exited(Duration::from_secs(60));
    let err = std::fs::read_to_string(&l1.err).unwrap();
    assert!(!status.success() && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("no progress for 2 s")
            && err.contains("what it learned is in checkpoint")
            && err.contains(&format!("--resume --bind {ep}")),
        "{err}"
    );
    let run = d.join("run");
    let checkpoints = learner::checkpoint::list(&run);
    assert_eq!(checkpoints.len(), 1, "{err}");
    let counters: serde_json::Value =
        serde_json::from_slice(&std::fs::read(checkpoints[0].join("counters.json")).unwrap())
            .unwrap();
    assert_eq!(counters["policy_updates"], 0);
    assert_eq!(
        counters["cost_steps"], 5,
        "the cost network's steps are kept"
    );
    let log = run.join("cost_buffer.jsonl");
    assert_eq!(lines(&log), 3);

    // Resumed with threads this time: it goes on from that checkpoint and
    // measures no plan twice.
    std::fs::remove_file(run.join("endpoint")).unwrap();
    let (mut l2, _) = learner(
        d,
        "learner2",
        &[
            "--resume",
            "--bind",
            &ep,
            "--actors",
            "1",
            "--benchworkers",
            "1",
        ],
    );
    let out = l2.finish(Duration::from_secs(120));
    assert!(out.contains("trained 3 iterations"), "{out}");
    let err = std::fs::read_to_string(&l2.err).unwrap();
    assert!(
        err.contains(&format!(
            "resuming from {} (0 rounds done, 3 measurements)",
            checkpoints[0].display()
        )),
        "{err}"
    );
    assert_eq!(lines(&log), 9);
    assert_eq!(lines(&run.join("metrics.jsonl")), 9);
}
