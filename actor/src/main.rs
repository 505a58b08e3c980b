use clap::Parser;

fn main() -> std::process::ExitCode {
    common::logging::init();
    let cli = actor::cli::Cli::parse();
    match actor::cli::run(cli, &mut std::io::stdout().lock()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
