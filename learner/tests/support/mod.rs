//! What the integration tests share.

// Each test binary uses its own share of these.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the `learner` binary: (success, stdout, stderr). It never panics,
/// and its logs to a pipe are plain text, without colour codes.
pub fn learner(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
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
