use clap::Parser;

fn main() -> std::process::ExitCode {
    common::logging::init();
    let cli = benchworker::cli::Cli::parse();
    match benchworker::cli::run(cli, &mut std::io::stdout().lock()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
