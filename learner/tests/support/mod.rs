//! What the integration tests share.

use std::process::Command;

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
