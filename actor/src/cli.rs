//! The `actor` command line.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use common::config::Config;

/// An embshard actor: rolls out placement episodes on CPU for the learner.
#[derive(Debug, Parser)]
#[command(name = "actor", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the resolved configuration (defaults filled in, validated) as TOML.
    ///
    /// Example:
    ///   actor config --config configs/default.toml
    Config {
        /// Configuration TOML; defaults when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Config { config } => {
            let cfg = Config::load(config.as_deref())?;
            write!(out, "{}", toml::to_string_pretty(&cfg)?)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let mut out = Vec::new();
        run(
            Cli {
                command: Command::Config { config: None },
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let back = Config::from_toml(&text, std::path::Path::new("resolved.toml")).unwrap();
        assert_eq!(back, Config::default());
    }
}
