//! Tracing set-up shared by the binaries: human-readable logs on stderr,
//! filtered by `RUST_LOG` (default `info`), so stdout stays free for results;
//! coloured on a terminal only.

/// A command that stopped on a signal after saving its work: it ends with
/// the shell's status for that signal (130 after SIGINT, 143 after
/// SIGTERM), so that `train && eval` in a batch script stops there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted (exit status {0})")]
pub struct Interrupted(pub u8);

/// Ends a binary: success; [`Interrupted`]'s status; or the whole error
/// chain on stderr and exit 1.
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Interrupted>() {
            Some(Interrupted(status)) => std::process::ExitCode::from(*status),
            None => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Installs the global subscriber; a second call is a no-op.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colours only on a terminal (a log file or a pipe gets plain
        // text), and never where `NO_COLOR` is set (https://no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .try_init();
}
