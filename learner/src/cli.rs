//! The `learner` command line.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use common::config::Config;
use common::Suite;
use indicatif::{ProgressBar, ProgressStyle};

use crate::baselines::Method;
use crate::eval::{evaluate, Report};

/// The embshard learner: learns to place embedding tables on GPUs.
///
/// Offline commands available now: `generate` writes the default DLRM-like
/// pool and task suites; `eval` compares placement methods on a suite with
/// a measuring oracle (`sim` or `cpu`).
#[derive(Debug, Parser)]
#[command(name = "learner", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate the DLRM-like pool, its train/test split and the task suites.
    ///
    /// Writes DIR/pool.csv, pool.train.csv, pool.test.csv, pool.stats.txt and
    /// one DIR/<suite>.{train,test}.json per configured suite, and prints the
    /// pool's statistics next to the published trace's. Deterministic: the
    /// same config gives the same files.
    ///
    /// Example:
    ///   learner generate --config configs/default.toml --out data/generated
    Generate(GenerateArgs),
    /// Compare placement methods on a suite.
    ///
    /// For every task of the suite, every method places the tables and the
    /// oracle measures the plan. Prints per method the mean cost (ms) over
    /// the tasks it solved, the tasks it failed (no memory-feasible plan) and
    /// its cost relative to the best heuristic.
    ///
    /// Example:
    ///   learner eval --suite data/generated/dlrm-50x4.test.json --methods all --backend sim
    ///
    /// On the `cpu` backend a measurement takes about a second: give `search`
    /// a small budget (--search-budget 20).
    Eval(EvalArgs),
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Configuration TOML ([generate], [data], [memory]); defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Output folder (default: the config's data.dir).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Suite JSON; repeat the flag to evaluate several suites.
    #[arg(long, required = true)]
    pub suite: Vec<PathBuf>,
    /// Comma-separated methods, or `all`: random, round_robin, size, dim,
    /// lookup, size_lookup, torchrec, search.
    #[arg(long, default_value = "all")]
    pub methods: String,
    /// The oracle that measures plans.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: benchworker::Backend,
    /// Configuration TOML; defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Oracle measurements the `search` reference may spend per task
    /// (default: the config's eval.search_budget).
    #[arg(long)]
    pub search_budget: Option<usize>,
    /// Print JSON instead of a table: one object per suite, one per line.
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command, writing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate(args, out),
        Command::Eval(args) => eval(args, out),
    }
}

fn generate(args: GenerateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    let dir = args.out.unwrap_or_else(|| cfg.data.dir.clone());
    let g = crate::data::generate(&cfg, &dir)
        .with_context(|| format!("generating data in {}", dir.display()))?;
    write!(out, "{}", g.stats)?;
    for s in &g.suites {
        writeln!(out, "wrote {}", s.display())?;
    }
    Ok(())
}

fn eval(args: EvalArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut cfg = Config::load(args.config.as_deref())?;
    if let Some(b) = args.search_budget {
        cfg.eval.search_budget = b;
    }
    let methods =
        Method::parse_list(&args.methods).map_err(|e| anyhow::anyhow!("--methods: {e}"))?;
    let suites = args
        .suite
        .iter()
        .map(|p| Suite::load(p, &cfg.memory))
        .collect::<Result<Vec<_>, _>>()?;
    let mut oracle = benchworker::build(args.backend, &cfg)?;
    let batch = match args.backend {
        benchworker::Backend::Sim => cfg.sim.batch,
        benchworker::Backend::Cpu => cfg.cpu.batch,
    };
    for suite in &suites {
        let bar = progress(suite.tasks.len() as u64, &suite.path.display().to_string());
        let report: Report = evaluate(
            suite,
            &methods,
            oracle.as_mut(),
            &cfg.memory,
            &cfg.eval,
            batch,
            || bar.inc(1),
        )
        .with_context(|| format!("evaluating {}", suite.path.display()))?;
        bar.finish_and_clear();
        if args.json {
            serde_json::to_writer(&mut *out, &report)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{report}")?;
        }
    }
    Ok(())
}

/// A progress bar on stderr when it is a terminal, hidden otherwise.
fn progress(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tasks, {elapsed} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
