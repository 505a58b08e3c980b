//! What the integration tests share.

// Each test binary uses its own share of these.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the `learner` binary: (success, stdout, stderr). It never panics,
/// and its logs to a pipe are plain text, without colour codes.
pub fn learner(args: &[&str]) -> (bool, String, String) {
    learner_in(std::path::Path::new("."), args)
}

/// [`learner`], run in folder `dir`.
pub fn learner_in(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

/// Polls `cond` every 20 ms until it holds, and says how long that took;
/// panics naming `what` once `within` has passed.
pub fn wait_for(what: &str, within: Duration, cond: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Adds lines at the end of a configuration file.
pub fn append(cfg: &std::path::Path, lines: &str) {
    let mut text = std::fs::read_to_string(cfg).unwrap();
    text.push_str(lines);
    std::fs::write(cfg, text).unwrap();
}

/// Writes a configuration for small, quick runs of `iterations` and
/// generates its data; returns the config path and the data folder.
pub fn small_run_config(
    dir: &std::path::Path,
    iterations: usize,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = dir.join("data");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[generate]\ntables = 120\n[data]\ndir = {data:?}\ntrain_tasks = 4\ntest_tasks = 2\nsuites = [{{ tables = 12, devices = 3, memory_gb = 50.0 }}]\n[train]\nsuite = {:?}\niterations = {iterations}\nmeasure_per_iteration = 3\ncost_steps = 5\npolicy_steps = 3\nepisodes = 4\n",
            data.join("dlrm-12x3.train.json")
        ),
    )
    .unwrap();
    let (ok, _, err) = learner(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    (cfg, data)
}

/// `learner train --config CFG --run-dir RUN`'s arguments.
pub fn train_args<'a>(cfg: &'a std::path::Path, run: &'a std::path::Path) -> [&'a str; 5] {
    [
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--run-dir",
        run.to_str().unwrap(),
    ]
}

/// `learner eval` of `methods` on `suite` with the model of `run`.
pub fn eval_methods(
    suite: &std::path::Path,
    run: &std::path::Path,
    methods: &str,
) -> (bool, String, String) {
    eval_methods_with(suite, run, methods, &[])
}

/// [`eval_methods`] with more arguments after them.
pub fn eval_methods_with(
    suite: &std::path::Path,
    run: &std::path::Path,
    methods: &str,
    extra: &[&str],
) -> (bool, String, String) {
    let mut args = vec![
        "eval",
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        methods,
        "--checkpoint",
        run.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    learner(&args)
}
