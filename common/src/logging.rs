//! Tracing set-up shared by the binaries: human-readable logs on stderr,
//! filtered by `RUST_LOG` (default `info`), so stdout stays free for results;
//! coloured on a terminal only.

/// Ends a binary: success, or the whole error chain on stderr and exit 1.
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
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
