use clap::Parser;

fn main() -> std::process::ExitCode {
    common::malloc::keep_freed_memory();
    common::logging::init();
    // A descriptor per peer connection: the soft limit of 1024 is not enough.
    let files = net::link::raise_open_files();
    tracing::debug!("open files allowed: {files:?}");
    let cli = learner::cli::Cli::parse();
    common::logging::exit_code(learner::cli::run(cli, &mut std::io::stdout().lock()))
}
