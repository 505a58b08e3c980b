use clap::Parser;

fn main() -> std::process::ExitCode {
    common::malloc::keep_freed_memory();
    common::logging::init();
    let cli = learner::cli::Cli::parse();
    common::logging::exit_code(learner::cli::run(cli, &mut std::io::stdout().lock()))
}
