use clap::Parser;

fn main() -> std::process::ExitCode {
    common::malloc::keep_freed_memory();
    common::logging::init();
    let cli = benchworker::cli::Cli::parse();
    common::logging::exit_code(benchworker::cli::run(cli, &mut std::io::stdout().lock()))
}
