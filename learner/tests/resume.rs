//! The real `learner` binary stopped and resumed: killed mid-run, killed
//! before its first checkpoint, resumed in one thread, locked against a
//! second learner, a cluster run's token, relative paths.

mod support;

use std::process::Command;

use support::{append, eval_methods, learner, small_run_config, train_args, wait_for};

/// `learner train --run-dir RUN --resume`.
fn resume(run: &std::path::Path) -> (bool, String, String) {
    learner(&["train", "--run-dir", run.to_str().unwrap(), "--resume"])
}

/// Starts `learner train` on `cfg` into `run` in the background, its output
/// thrown away (for a test to kill it).
fn start_training(cfg: &std::path::Path, run: &std::path::Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(train_args(cfg, run))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_training_run_resumes_with_every_counter_and_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 40);
    let run = dir.path().join("run");
    let mut child = start_training(&cfg, &run);
    wait_for(
        "a second checkpoint",
        std::time::Duration::from_secs(60),
        || learner::checkpoint::list(&run).len() >= 2,
    );
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    let logged_before = std::fs::read_to_string(run.join("cost_buffer.jsonl")).unwrap();
    assert!(logged_before.lines().count() >= 6);

    // A plain start refuses to overwrite the run.
    let (ok, _, err) = learner(&train_args(&cfg, &run));
    assert!(!ok && err.contains("--resume"), "{err}");
    // Damage the newest checkpoint: the resume falls back to the one before.
    let newest = learner::checkpoint::list(&run).remove(0);
    std::fs::write(newest.join("policy.ot"), b"garbage").unwrap();

    let (ok, _, err) = resume(&run);
    assert!(ok, "{err}");
    assert!(err.contains("damaged"), "{err}");
    // Set aside, out of the run's checkpoints, not deleted.
    let mut aside = newest.clone().into_os_string();
    aside.push(".damaged");
    assert!(std::path::Path::new(&aside).join("policy.ot").exists());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let field =
        |name: &str| -> Vec<u64> { lines.iter().map(|l| l[name].as_u64().unwrap()).collect() };
    assert_eq!(
        field("step"),
        (1..=120).collect::<Vec<u64>>(),
        "one line per policy update, in order"
    );
    assert!(field("iteration").windows(2).all(|w| w[1] >= w[0]));
    assert!(field("policy_version").windows(2).all(|w| w[1] > w[0]));
    // The training clock goes on from the checkpoint's, not from zero.
    let clock: Vec<f64> = lines
        .iter()
        .map(|l| l["elapsed_s"].as_f64().unwrap())
        .collect();
    assert!(clock.windows(2).all(|w| w[1] >= w[0]), "{clock:?}");
    let log = std::fs::read_to_string(run.join("cost_buffer.jsonl")).unwrap();
    // Every measurement logged before the kill is still there and counted,
    // and none is measured twice: the budget is spent exactly. (An entry
    // the kill tore is a line to skip; one it left without its newline is
    // kept whole and ended.)
    assert!(log.starts_with(logged_before.trim_end_matches(|c| c != '\n')));
    let read = learner::costlog::CostLog::read(&run.join("cost_buffer.jsonl")).unwrap();
    assert!(read.skipped <= 1, "{} entries skipped", read.skipped);
    let logged = read.samples.len();
    assert_eq!(logged, 120);
    assert_eq!(
        lines.last().unwrap()["measurements"].as_u64().unwrap() as usize,
        logged
    );
    let steps: Vec<u64> = lines
        .iter()
        .map(|l| l["env_steps"].as_u64().unwrap())
        .collect();
    assert!(
        steps.windows(2).all(|w| w[1] > w[0]),
        "env steps keep growing: {steps:?}"
    );
}

#[test]
fn measurements_of_a_run_killed_before_its_first_checkpoint_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 40);
    // Checkpoints only at the end.
    append(&cfg, "checkpoint_every = 1000\n");
    let run = dir.path().join("run");
    let log = run.join("cost_buffer.jsonl");
    let mut child = start_training(&cfg, &run);
    let logged = || learner::costlog::CostLog::read(&log).map_or(0, |r| r.samples.len());
    wait_for(
        "four measurements",
        std::time::Duration::from_secs(60),
        || logged() >= 4,
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        learner::checkpoint::list(&run).is_empty(),
        "killed before any checkpoint"
    );
    let before = logged();
    assert!(before < 120, "killed before the end");

    // A fresh start refuses to throw the measurements away...
    let (ok, _, err) = learner(&train_args(&cfg, &run));
    assert!(
        !ok && err.contains("measurements") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(logged(), before);
    // ...and --resume trains on with them: the budget is spent exactly.
    let (ok, _, err) = resume(&run);
    assert!(ok, "{err}");
    assert!(err.contains("fresh networks"), "{err}");
    assert_eq!(logged(), 120);
    let lines = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 120, "one line per policy update");
    let checkpoints = learner::checkpoint::list(&run);
    assert_eq!(checkpoints.len(), 1);

    // A checkpoint that is intact but does not fit the configuration (edited
    // since) is an error, and nothing is set aside.
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let edited = text.replace("cost_table_hidden = ", "cost_table_hidden = 1");
    assert_ne!(edited, text);
    std::fs::write(&config, &edited).unwrap();
    let (ok, _, err) = resume(&run);
    assert!(!ok && err.contains("loading"), "{err}");
    assert_eq!(learner::checkpoint::list(&run), checkpoints);
    std::fs::write(&config, &text).unwrap();

    // Every checkpoint damaged: they are set aside and the resume stops to
    // say so; resumed once more, fresh networks train on the measurements.
    std::fs::write(checkpoints[0].join("cost.ot"), b"garbage").unwrap();
    let (ok, _, err) = resume(&run);
    assert!(!ok && err.contains("every checkpoint"), "{err}");
    assert!(learner::checkpoint::list(&run).is_empty());
    let (ok, _, err) = resume(&run);
    assert!(ok && err.contains("fresh networks"), "{err}");
    assert_eq!(logged(), 120, "nothing measured twice");
    assert_eq!(learner::checkpoint::list(&run).len(), 1);
}

#[test]
fn resuming_where_no_run_is_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("none");
    let (ok, _, err) = resume(&run);
    assert!(!ok && err.contains("no run to resume"), "{err}");
    // A file's error names the file and its reason once.
    let (ok, _, err) = learner(&train_args(dir.path(), &run));
    assert!(!ok && err.contains(dir.path().to_str().unwrap()), "{err}");
    assert_eq!(err.matches("Is a directory").count(), 1, "{err}");
}

/// Trains `cfg` (4 rounds) in one thread into `NAME-whole`, and again into
/// `NAME-halves` stopped after 2 rounds and resumed for the other 2; with
/// `init`, both fine-tune that run's networks. Returns both run folders.
fn whole_and_resumed(
    dir: &std::path::Path,
    cfg: &std::path::Path,
    name: &str,
    init: Option<&std::path::Path>,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let whole = dir.join(format!("{name}-whole"));
    train_in_one_thread(cfg, &whole, init);
    // The same run stopped after 2 of its 4 rounds, then resumed with its
    // configuration asking for all 4.
    let text = std::fs::read_to_string(cfg).unwrap();
    let short = dir.join(format!("{name}-short.toml"));
    std::fs::write(&short, text.replace("iterations = 4", "iterations = 2")).unwrap();
    let halves = dir.join(format!("{name}-halves"));
    train_in_one_thread(&short, &halves, init);
    let resolved = halves.join("config.toml");
    let text = std::fs::read_to_string(&resolved).unwrap();
    assert_eq!(text.matches("\niterations = 2\n").count(), 1, "{text}");
    std::fs::write(
        &resolved,
        text.replace("\niterations = 2\n", "\niterations = 4\n"),
    )
    .unwrap();
    // In one thread again: the run's config.toml keeps `--actors 0
    // --benchworkers 0`.
    let (ok, _, err) = resume(&halves);
    assert!(ok, "{err}");
    (whole, halves)
}

/// `learner train` of `cfg` into `run` in one thread, from `init`'s
/// networks where given; it must succeed.
fn train_in_one_thread(
    cfg: &std::path::Path,
    run: &std::path::Path,
    init: Option<&std::path::Path>,
) {
    let mut args = train_args(cfg, run).to_vec();
    args.extend(["--actors", "0", "--benchworkers", "0"]);
    if let Some(init) = init {
        args.extend(["--init", init.to_str().unwrap()]);
    }
    let (ok, _, err) = learner(&args);
    assert!(ok, "{err}");
}

/// Every metric of every update of `run` (but the clock), and the plans
/// it measured, in order, with their costs' bits.
fn what_a_run_did(
    run: &std::path::Path,
) -> (
    Vec<serde_json::Value>,
    Vec<impl PartialEq + std::fmt::Debug>,
) {
    let lines = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("elapsed_s");
            v
        })
        .collect();
    let measured = learner::costlog::CostLog::read(&run.join("cost_buffer.jsonl"))
        .unwrap()
        .samples
        .iter()
        .map(|s| {
            let m = &s.measurement;
            (s.placed.assignment.clone(), s.pick, m.cost_ms.to_bits())
        })
        .collect();
    (lines, measured)
}

#[test]
fn a_run_in_one_thread_resumed_after_a_round_goes_on_as_if_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 4);
    let (whole, halves) = whole_and_resumed(dir.path(), &cfg, "fresh", None);
    // Every metric of every update the same, bit for bit, but the clock;
    // and the same plans measured, in the same order.
    let (a, b) = (what_a_run_did(&whole), what_a_run_did(&halves));
    assert_eq!(a.0.len(), 12, "4 rounds of 3 updates");
    assert_eq!(a, b);
    // A run whose learner listened for peer processes is not resumed in
    // one thread behind their backs.
    std::fs::write(halves.join("endpoint.last"), "tcp://127.0.0.1:5555\n").unwrap();
    let (ok, _, err) = resume(&halves);
    assert!(
        !ok && err.contains("is a cluster run") && err.contains("--bind"),
        "{err}"
    );

    // Fine-tuning `whole`'s networks: the decay pulls toward them
    // (`train.cost_decay_to = "init"`), and a resume pulls toward them
    // too, not toward the checkpoint it resumes from.
    let (tuned, tuned_halves) = whole_and_resumed(dir.path(), &cfg, "tuned", Some(&whole));
    let (a, b) = (what_a_run_did(&tuned), what_a_run_did(&tuned_halves));
    assert_eq!(a.0.len(), 12);
    assert_eq!(a, b);
    // The anchor travels in the checkpoint's optimizer state.
    let newest = learner::checkpoint::list(&tuned_halves).remove(0);
    let state = tch::Tensor::load_multi(newest.join("optimizer.ot")).unwrap();
    assert!(state.iter().any(|(n, _)| n.starts_with("cost.a.")));
    // Toward zero instead, the same fine-tuning ends elsewhere.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let zero = dir.path().join("zero.toml");
    std::fs::write(
        &zero,
        text.replace("[train]\n", "[train]\ncost_decay_to = \"zero\"\n"),
    )
    .unwrap();
    let toward_zero = dir.path().join("toward-zero");
    train_in_one_thread(&zero, &toward_zero, Some(&whole));
    assert_ne!(what_a_run_did(&toward_zero).0, a.0);
    // Its checkpoint holds no anchor: asked to resume pulling toward the
    // init, it says which setting to write.
    let resolved = toward_zero.join("config.toml");
    let text = std::fs::read_to_string(&resolved).unwrap();
    assert!(text.contains("cost_decay_to = \"zero\""), "{text}");
    std::fs::write(
        &resolved,
        text.replace("cost_decay_to = \"zero\"", "cost_decay_to = \"init\"")
            .replace("\niterations = 4\n", "\niterations = 5\n"),
    )
    .unwrap();
    let (ok, _, err) = resume(&toward_zero);
    assert!(
        !ok && err.contains("train.cost_decay_to = \"zero\"") && err.contains("a.cost"),
        "{err}"
    );
}

/// Everything of a run that a learner writes but its logs, file by file.
fn snapshot(run: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(run, &mut out);
    out.sort();
    out
}

#[test]
fn a_second_learner_on_a_run_in_training_is_refused_and_a_killed_ones_lock_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, data) = small_run_config(dir.path(), 2);
    let run = dir.path().join("run");
    let mut args = train_args(&cfg, &run).to_vec();
    args.extend(["--actors", "0", "--benchworkers", "0"]);
    let (ok, _, err) = learner(&args);
    assert!(ok, "{err}");
    // Two more rounds, resumed as a cluster whose peers never come: the
    // learner holds the run while it waits for them.
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\niterations = 2\n", "\niterations = 4\n"),
    )
    .unwrap();
    let bind = ["--resume", "--bind", "tcp://127.0.0.1:0"];
    let mut first = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(["train", "--run-dir", run.to_str().unwrap()])
        .args(bind)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "the first learner's endpoint",
        std::time::Duration::from_secs(60),
        || run.join("endpoint").exists(),
    );
    let before = snapshot(&run);
    let mut second = vec!["train", "--run-dir", run.to_str().unwrap()];
    second.extend(bind);
    let (ok, _, err) = learner(&second);
    let held = format!(
        "another learner (pid {}) is training in {}",
        first.id(),
        run.display()
    );
    assert!(!ok && err.contains(&held), "{err}");
    // A new run over it is refused the same way, before its own checks.
    let (ok, _, err) = learner(&train_args(&cfg, &run));
    assert!(!ok && err.contains(&held), "{err}");
    assert!(
        before == snapshot(&run),
        "the refused learners wrote nothing"
    );
    // Readers of the run are not held up.
    let (ok, _, err) = learner(&[
        "plan",
        "--tables",
        data.join("pool.test.csv").to_str().unwrap(),
        "--devices",
        "4",
        "--memory-gb",
        "64",
        "--checkpoint",
        run.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = eval_methods(&data.join("dlrm-12x3.test.json"), &run, "lookup,policy");
    assert!(ok, "{err}");

    // SIGKILL: the lock goes with the process, and the run resumes (with
    // threads this time) to its end.
    first.kill().unwrap();
    first.wait().unwrap();
    let (ok, stdout, err) = learner(&[
        "train",
        "--run-dir",
        run.to_str().unwrap(),
        "--resume",
        "--actors",
        "1",
        "--benchworkers",
        "1",
    ]);
    assert!(ok && stdout.contains("trained 4 iterations"), "{err}");
    // The rate between this session's first update and its last, beside
    // the whole run's.
    let between: f64 = stdout
        .find(" from the first update to the last")
        .and_then(|at| stdout[..at].rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no rate between updates in {stdout:?}"));
    assert!(between > 0.0, "{stdout}");
}

#[test]
fn a_cluster_run_resumes_only_with_the_token_its_peers_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 2);
    // Learners with no peers give up after a second: one that got past its
    // token has run (and, having learned nothing, leaves no checkpoint).
    append(&cfg, "[cluster]\nstall_timeout_s = 1.0\n");
    let stalled = "no progress for 1 s";
    let secret = "the cluster's own token";
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{secret}\n")).unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "another token\n").unwrap();
    // `learner train` on `run` with --bind, the token from `file` or in
    // EMBSHARD_TOKEN (and none from the test's environment).
    let train = |run: &std::path::Path, file: Option<&std::path::Path>, env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_learner"));
        c.args(["train", "--run-dir", run.to_str().unwrap()])
            .args([
                "--bind",
                "tcp://127.0.0.1:0",
                "--actors",
                "0",
                "--benchworkers",
                "0",
            ])
            .env_remove("EMBSHARD_TOKEN");
        if run.join("config.toml").exists() {
            c.arg("--resume");
        } else {
            c.args(["--config", cfg.to_str().unwrap()]);
        }
        if let Some(f) = file {
            c.args(["--token-file", f.to_str().unwrap()]);
        }
        if let Some(t) = env {
            c.env("EMBSHARD_TOKEN", t);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    let run = dir.path().join("given");
    let (ok, err) = train(&run, Some(&token), None);
    assert!(!ok && err.contains(stalled), "{err}");
    assert!(err.contains("before learning anything"), "{err}");
    assert!(learner::checkpoint::list(&run).is_empty());
    // Its fingerprint is kept, not the token, and no token of its own made.
    let printed = run.join("token.fingerprint");
    let print = std::fs::read_to_string(&printed).unwrap();
    assert!(
        print.starts_with("sha256:") && !print.contains(secret),
        "{print}"
    );
    assert!(!run.join("token").exists());
    // A resume without the token would lock its peers out: refused, and
    // it makes no token.
    let (ok, err) = train(&run, None, None);
    assert!(
        !ok && err.contains(&format!("the run in {} was started with", run.display()))
            && err.contains("resume it with the same --token-file or EMBSHARD_TOKEN"),
        "{err}"
    );
    assert!(!run.join("token").exists());
    // Another token is refused; the same one, from a file or the
    // environment, is taken.
    let (ok, err) = train(&run, Some(&wrong), None);
    assert!(
        !ok && err.contains(&format!(
            "the cluster token in {} is not the one the run in {} was started with",
            wrong.display(),
            run.display()
        )),
        "{err}"
    );
    let (ok, err) = train(&run, None, Some(secret));
    assert!(!ok && err.contains(stalled), "{err}");
    let (ok, err) = train(&run, Some(&token), None);
    assert!(!ok && err.contains(stalled), "{err}");
    assert_eq!(std::fs::read_to_string(&printed).unwrap(), print);

    // A run whose learner made its token: another one is refused too.
    let run = dir.path().join("made");
    let (ok, err) = train(&run, None, None);
    assert!(!ok && err.contains(stalled), "{err}");
    assert!(!run.join("token.fingerprint").exists());
    let (ok, err) = train(&run, None, Some("another token"));
    let made = run.join("token");
    assert!(
        !ok && err.contains(&format!("pass --token-file {}", made.display())),
        "{err}"
    );
    let (ok, err) = train(&run, Some(&made), None);
    assert!(!ok && err.contains(stalled), "{err}");
}

#[test]
fn a_run_started_with_relative_paths_resumes_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.toml"),
        "[generate]\ntables = 60\n[data]\ndir = \"data\"\ntrain_tasks = 2\ntest_tasks = 1\n\
         suites = [{ tables = 6, devices = 2, memory_gb = 50.0 }]\n[train]\n\
         suite = \"data/dlrm-6x2.train.json\"\niterations = 1\nmeasure_per_iteration = 2\n\
         cost_steps = 2\npolicy_steps = 2\nepisodes = 2\n",
    )
    .unwrap();
    let in_folder = |folder: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args(args)
            .current_dir(folder)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
    };
    in_folder(dir.path(), &["generate", "--config", "c.toml"]);
    let one_thread = ["--actors", "0", "--benchworkers", "0"];
    let mut train = vec!["train", "--config", "c.toml", "--run-dir", "run"];
    train.extend(one_thread);
    in_folder(dir.path(), &train);
    let written = std::fs::read_to_string(dir.path().join("run/config.toml")).unwrap();
    let data = dir.path().join("data");
    assert!(
        written.contains(&format!("{:?}", data.to_str().unwrap())),
        "{written}"
    );
    // From elsewhere: the run's own paths lead to its data.
    let run = dir.path().join("run");
    let elsewhere = tempfile::tempdir().unwrap();
    let mut again = vec!["train", "--run-dir", run.to_str().unwrap(), "--resume"];
    again.extend(one_thread);
    in_folder(elsewhere.path(), &again);
}

/// An interrupted `learner train` writes its checkpoint and exits with the
/// shell's status for the signal: 130 after SIGINT, 143 after SIGTERM, so
/// that `train && eval` stops there.
#[test]
fn an_interrupted_run_checkpoints_and_exits_with_the_signals_status() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 400);
    let run = dir.path().join("run");
    for (signal, status) in [("-INT", 130), ("-TERM", 143)] {
        let args: Vec<&str> = if run.join("config.toml").exists() {
            vec!["train", "--run-dir", run.to_str().unwrap(), "--resume"]
        } else {
            train_args(&cfg, &run).to_vec()
        };
        let log = dir.path().join(format!("train{signal}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let before = learner::checkpoint::list(&run).len();
        // A checkpoint and a progress line of this session: under load a
        // checkpoint can come before the first progress line.
        wait_for(
            "a checkpoint and a progress line of this session",
            std::time::Duration::from_secs(60),
            || {
                learner::checkpoint::list(&run).len() > before
                    && std::fs::read_to_string(&log)
                        .is_ok_and(|t| t.contains(" measured, ") && t.contains("env steps/s, eta"))
            },
        );
        let sent = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let exit = child.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(exit.code(), Some(status), "{signal}: {text}");
        assert!(
            text.contains("checkpoint") && text.contains("--resume continues"),
            "{text}"
        );
        assert!(!text.contains("error:"), "{text}");
        // Off a terminal, progress comes as lines in the log.
        assert!(
            text.contains(" measured, ") && text.contains("env steps/s, eta"),
            "{text}"
        );
    }
}

/// A resume over a cost log with fewer measurements than its checkpoint
/// saw (emptied, cut, replaced) stops and says so, rather than measure
/// again what was lost and hide it.
#[test]
fn a_resume_over_a_cut_cost_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 2);
    let run = dir.path().join("run");
    let (ok, _, err) = learner(&train_args(&cfg, &run));
    assert!(ok, "{err}");
    let log = run.join("cost_buffer.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let kept: String = text.lines().take(1).map(|l| format!("{l}\n")).collect();
    std::fs::write(&log, &kept).unwrap();
    let (ok, _, err) = resume(&run);
    assert!(
        !ok && err.contains("1 measurement, but checkpoint"),
        "{err}"
    );
    assert!(err.contains("emptied, cut or replaced"), "{err}");
    // Nothing was touched: the log is as it was left.
    assert_eq!(std::fs::read_to_string(&log).unwrap(), kept);
    // A copied line is read once: the run resumes.
    let doubled = format!("{text}{}\n", text.lines().next().unwrap());
    std::fs::write(&log, doubled).unwrap();
    let (ok, _, err) = resume(&run);
    assert!(ok, "{err}");
}
