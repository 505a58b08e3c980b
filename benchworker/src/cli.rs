//! The `benchworker` command line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use common::config::Config;
use common::{pool, Measurement, Placement};

use crate::oracle::{build, Backend};

/// Measures the real cost of embedding-table placements.
///
/// A benchworker runs the fused embedding lookups of a placement plan — one
/// fused call per device, forward and backward, with the all-to-all exchanges
/// between devices — and reports the time of each phase per device. The
/// iteration cost is the slowest device's total.
#[derive(Debug, Parser)]
#[command(name = "benchworker", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure one placement of a pool of tables.
    ///
    /// Example:
    ///   benchworker measure --backend sim --tables pool.csv --placement plan.json
    Measure(MeasureArgs),
}

#[derive(Debug, clap::Args)]
pub struct MeasureArgs {
    /// Which oracle measures: `sim` (a model of a GPU), `cpu` (real lookups on this CPU).
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Pool CSV: name,rows,dim,pooling_factor,bin_0..bin_16.
    #[arg(long)]
    pub tables: PathBuf,
    /// Placement JSON: {"devices": D, "assignment": [{"table": NAME, "device": d}, …]}.
    /// Every table of the CSV must be placed exactly once.
    #[arg(long)]
    pub placement: PathBuf,
    /// Configuration TOML (sections [memory], [sim], [cpu]); defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the measurement as JSON: {"cost_ms", "devices": [{"fwd_ms", …}]}.
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command, writing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Measure(args) => measure(args, out),
    }
}

fn measure(args: MeasureArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    let tables = pool::read(&args.tables)?;
    let plan = Placement::read(&args.placement)?.resolve(&tables, &args.placement)?;
    let mut oracle = build(args.backend, &cfg)?;
    let m = oracle
        .measure(&tables, &plan)
        .with_context(|| format!("measuring {}", args.placement.display()))?;
    if args.json {
        serde_json::to_writer(&mut *out, &m)?;
        writeln!(out)?;
    } else {
        write_table(&m, out)?;
        if let Some(spread) = oracle.spread() {
            writeln!(out, "{spread}")?;
        }
    }
    Ok(())
}

fn write_table(m: &Measurement, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "device", "fwd_ms", "fwd_comm", "bwd_comm", "bwd_ms", "total_ms"
    )?;
    for (d, c) in m.devices.iter().enumerate() {
        writeln!(
            out,
            "{d:>6} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            c.fwd_ms, c.fwd_comm_ms, c.bwd_comm_ms, c.bwd_ms, c.total_ms
        )?;
    }
    writeln!(out, "cost_ms {:.3}", m.cost_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::generate::{generate_pool, PoolGenConfig};
    use common::Plan;

    fn files(dir: &std::path::Path, placement: &str) -> (PathBuf, PathBuf) {
        let tables = generate_pool(
            &PoolGenConfig {
                tables: 4,
                ..Default::default()
            },
            0,
        );
        let t = dir.join("t.csv");
        pool::write(&t, &tables).unwrap();
        let p = dir.join("p.json");
        std::fs::write(&p, placement).unwrap();
        (t, p)
    }

    fn run_measure(t: PathBuf, p: PathBuf, json: bool) -> anyhow::Result<String> {
        let cli = Cli {
            command: Command::Measure(MeasureArgs {
                backend: Backend::Sim,
                tables: t,
                placement: p,
                config: None,
                json,
            }),
        };
        let mut out = Vec::new();
        run(cli, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn measure_prints_json_with_cost_equal_to_the_slowest_device() {
        let dir = tempfile::tempdir().unwrap();
        let tables = generate_pool(
            &PoolGenConfig {
                tables: 4,
                ..Default::default()
            },
            0,
        );
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 1, 0, 1],
        };
        let placement = serde_json::to_string(&Placement::from_plan(&plan, &tables)).unwrap();
        let (t, p) = files(dir.path(), &placement);
        let text = run_measure(t, p, true).unwrap();
        let m: Measurement = serde_json::from_str(&text).unwrap();
        assert_eq!(m.devices.len(), 2);
        let max = m.devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
        assert_eq!(m.cost_ms, max);
        assert!(m.cost_ms > 0.0);
    }

    #[test]
    fn unknown_table_or_device_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let (t, p) = files(
            dir.path(),
            r#"{"devices": 2, "assignment": [{"table": "nope", "device": 0}]}"#,
        );
        let e = run_measure(t, p, false).unwrap_err().to_string();
        assert!(
            e.contains("p.json") && e.contains("unknown table `nope`"),
            "{e}"
        );
        let (t, p) = files(
            dir.path(),
            r#"{"devices": 2, "assignment": [{"table": "dlrm_000", "device": 7}]}"#,
        );
        let e = run_measure(t, p, false).unwrap_err().to_string();
        assert!(e.contains("device 7 does not exist"), "{e}");
    }
}
