//! The `benchworker` command line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use common::config::{Config, Kernel};
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
    ///
    ///   benchworker measure --backend sim --tables pool.csv --placement plan.json
    Measure(MeasureArgs),
    /// Time the oracle: plans measured per second on random plans.
    ///
    /// Draws a seeded DLRM-like pool of --tables tables and --plans random
    /// plans over --devices devices, measures them all and reports the rate.
    /// A benchmark, not a test: the figure depends on the machine.
    ///
    /// Example:
    ///
    ///   benchworker bench --backend sim --tables 200 --devices 8 --plans 20000
    Bench(BenchArgs),
    /// Fusion sweep: one fused call over k tables against k single-table
    /// calls, on one device.
    ///
    /// For each size in --sizes, --mixes random mixes of that many tables
    /// of a generated pool (the config's generate section, seeded) are measured
    /// fused and one table at a time; the table shows Σ single / fused for
    /// the forward and the backward (the fusion speedup). On `cuda` this is
    /// one GPU; give a config with a smaller cuda.max_rows if the mixes do
    /// not fit its memory. A benchmark, not a test.
    ///
    /// Example:
    ///
    ///   benchworker fusion --backend cuda --sizes 1,4,16,64 --mixes 3
    Fusion(FusionArgs),
    /// Calibrate `sim` to a backend: measure plans, fit `sim`'s constants.
    ///
    /// Measures --plans plans drawn across a generated pool (the config's
    /// generate section, seeded): half put up to --max-tables tables on
    /// one device, half spread them over 2 to --max-devices. Fits `sim`'s
    /// bandwidth, per-call floor, backward ratio, hot-row term, exchange
    /// bandwidth and latency to three plans in four, and scores `sim`
    /// before and after on the fourth: Spearman rank correlation and
    /// median absolute error of the iteration cost. Writes the constants
    /// to --out; a config takes them with `[sim] calibration = "FILE"`.
    ///
    /// Example:
    ///
    ///   benchworker calibrate --backend cpu --plans 300 --out calibration.toml
    Calibrate(CalibrateArgs),
    /// Serve a training learner: measure the plans it sends, one at a time.
    ///
    /// Connects to the learner, says hello with the cluster token (from
    /// --token-file or EMBSHARD_TOKEN), takes the configuration and the
    /// training tasks from its welcome, and measures jobs until the learner
    /// says stop or Ctrl-C. When the learner goes silent (a crash, a
    /// restart), it says hello again until one answers.
    ///
    /// Example:
    ///
    ///   benchworker serve --learner tcp://127.0.0.1:5555 --backend sim --token-file runs/x/token
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The learner's endpoint (see its DIR/endpoint).
    #[arg(long)]
    pub learner: String,
    /// What measures the learner's jobs.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// File holding the cluster token (or set EMBSHARD_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Give up when no learner answers for this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub wait_s: f64,
    /// Join a multi-host group of this name (cuda only): the benchworkers
    /// of several hosts measure plans on all their GPUs together, NCCL
    /// across hosts. Rank 0 takes the learner's jobs; see docs/gpu.md.
    #[arg(long, requires_all = ["rank", "group_gpus"])]
    pub group: Option<String>,
    /// This process's rank in the group (0 on exactly one host).
    #[arg(long, requires = "group")]
    pub rank: Option<usize>,
    /// GPUs of each rank, comma-separated, the same on every rank (e.g.
    /// 8,8 for two hosts of 8): plan devices are numbered rank after rank.
    #[arg(long, value_delimiter = ',', requires = "group")]
    pub group_gpus: Option<Vec<usize>>,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The oracle to time.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Tables per plan (drawn from a generated pool).
    #[arg(long, default_value_t = 200)]
    pub tables: usize,
    /// Devices per plan.
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// Random plans to measure.
    #[arg(long, default_value_t = 10000)]
    pub plans: usize,
    #[command(flatten)]
    pub setup: Setup,
    /// Seed of the pool and the plans.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, clap::Args)]
pub struct FusionArgs {
    /// The oracle that measures the fused and the single-table calls.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Tables per mix, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    pub sizes: Vec<usize>,
    /// Random mixes per size.
    #[arg(long, default_value_t = 3)]
    pub mixes: usize,
    #[command(flatten)]
    pub setup: Setup,
    /// Seed of the pool and the mixes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON object per mix instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write one JSON object per mix to this file (with the table or
    /// the JSON on stdout).
    #[arg(long)]
    pub save: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct MeasureArgs {
    /// Which oracle measures: `sim` (a model of a GPU), `cpu` (real lookups on this CPU),
    /// `cuda` (this host's GPUs; a build with the cuda feature).
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Pool CSV: name,rows,dim,pooling_factor,bin_0..bin_16.
    #[arg(long)]
    pub tables: PathBuf,
    /// Placement JSON: {"devices": D, "assignment": [{"table": NAME, "device": d}, …]}.
    /// Every table of the CSV must be placed exactly once. `learner plan --format torchrec`'s
    /// {"world_size": D, "ranks": {NAME: rank}} is read as well.
    #[arg(long)]
    pub placement: PathBuf,
    #[command(flatten)]
    pub setup: Setup,
    /// Memory of each device in GiB: a plan that puts more on a device (weights
    /// at --precision and --optimizer's state) is refused, naming the
    /// device. Unchecked when omitted.
    #[arg(long)]
    pub memory_gb: Option<f64>,
    /// Weight precision, fp16 or fp32, as `learner plan --precision`
    /// (default: the config's `[memory] precision`, fp16). It counts
    /// memory for --memory-gb, and FBGEMM's kernel runs at it.
    #[arg(long, value_name = "fp16|fp32")]
    pub precision: Option<common::Precision>,
    /// Optimizer whose state sits beside the weights: sgd,
    /// rowwise_adagrad, adagrad or adam, as `learner plan --optimizer`
    /// (default: the config's `[memory] optimizer`, rowwise_adagrad). It
    /// counts memory for --memory-gb.
    #[arg(long, value_name = "NAME")]
    pub optimizer: Option<common::Optimizer>,
    /// Print the measurement as JSON: {"cost_ms", "devices": [{"fwd_ms", …}],
    /// "backend"}, plus "kernel", the weights' "precision", the
    /// "optimizer" and "spread" over the repeats for backends that time
    /// real work.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// The backend `sim` is calibrated to.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: Backend,
    /// Plans to measure (a quarter of them held out).
    #[arg(long, default_value_t = 300)]
    pub plans: usize,
    /// Most tables per plan.
    #[arg(long, default_value_t = 32)]
    pub max_tables: usize,
    /// Most devices per plan (the `cuda` backend: at most its GPUs).
    #[arg(long, default_value_t = 4)]
    pub max_devices: usize,
    #[command(flatten)]
    pub setup: Setup,
    /// Seed of the pool and the plans.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the calibration goes (TOML).
    #[arg(long)]
    pub out: PathBuf,
    /// Also write every measured plan to this file, one JSON object per
    /// line: its tables, its plan, the measurement.
    #[arg(long)]
    pub save: Option<PathBuf>,
}

fn parse_kernel(s: &str) -> Result<Kernel, String> {
    match s {
        "fbgemm" => Ok(Kernel::Fbgemm),
        "torch" => Ok(Kernel::Torch),
        _ => Err(format!("`{s}` is not a kernel: fbgemm or torch")),
    }
}

/// The configuration and the kernel, as `bench`, `fusion`, `measure` and
/// `calibrate` take them.
#[derive(Debug, Clone, clap::Args)]
pub struct Setup {
    /// Configuration TOML (its generate, memory, sim and backend sections);
    /// defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The kernel of the `cpu` and `cuda` backends: `fbgemm` (FBGEMM's
    /// table-batched embedding) or `torch` (libtorch's `embedding_bag`);
    /// overrides the config's cpu.kernel and cuda.kernel.
    #[arg(long, value_parser = parse_kernel)]
    pub kernel: Option<Kernel>,
}

impl Setup {
    /// The configuration (defaults without one), with `kernel` for both
    /// real backends where given; a warning where `backend` runs no
    /// kernel.
    fn load(&self, backend: Backend) -> anyhow::Result<Config> {
        let mut cfg = Config::load(self.config.as_deref())?;
        if let Some(k) = self.kernel {
            cfg.cpu.kernel = k;
            cfg.cuda.kernel = k;
            if backend == Backend::Sim {
                tracing::warn!(
                    "--kernel {} is for the cpu and cuda backends: sim runs no kernel, it models \
                     one (--backend cpu runs it)",
                    k.name()
                );
            }
        }
        Ok(cfg)
    }
}

/// Runs a parsed command, writing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Measure(args) => measure(args, out),
        Command::Bench(args) => bench(args, out),
        Command::Fusion(args) => fusion(args, out),
        Command::Calibrate(args) => calibrate(args, out),
        Command::Serve(args) => serve(args, out),
    }
}

fn calibrate(args: CalibrateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::calibrate::{draw_plans, fit, hold_out, measure_all, score};
    anyhow::ensure!(
        args.plans >= 8,
        "--plans must be at least 8 (a quarter is held out)"
    );
    anyhow::ensure!(args.max_tables >= 1, "--max-tables must be at least 1");
    let cfg = args.setup.load(args.backend)?;
    let pool = common::generate::generate_pool(&cfg.generate, args.seed)
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut oracle = build(args.backend, &cfg)?;
    let max_devices = oracle
        .max_devices()
        .map_or(args.max_devices, |m| m.min(args.max_devices));
    let plans = draw_plans(&pool, args.plans, args.max_tables, max_devices, args.seed);
    let bar = indicatif::ProgressBar::new(plans.len() as u64);
    let (samples, failed) = measure_all(oracle.as_mut(), plans, || bar.inc(1));
    bar.finish_and_clear();
    anyhow::ensure!(
        samples.len() >= 8,
        "only {} of {} plans were measured: too few to fit",
        samples.len(),
        args.plans
    );
    if let Some(path) = &args.save {
        let mut lines = String::new();
        for s in &samples {
            let line =
                serde_json::json!({"tables": s.tables, "plan": s.plan, "measured": s.measured});
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let (train, held) = hold_out(samples);
    let start = common::config::SimConfig {
        batch: match args.backend {
            Backend::Sim => cfg.sim.batch,
            Backend::Cpu => cfg.cpu.batch,
            Backend::Cuda => cfg.cuda.batch,
        },
        ..cfg.sim.clone()
    };
    let fitted = fit(&start, cfg.memory, &train);
    let (before, after) = (
        score(&start, cfg.memory, &held),
        score(&fitted, cfg.memory, &held),
    );
    let mut fit_info = toml::Table::new();
    let kernel = oracle.kernel().unwrap_or("model");
    for (k, v) in [
        ("backend", toml::Value::from(oracle.name())),
        ("kernel", kernel.into()),
        ("plans_fitted", (train.len() as i64).into()),
        ("plans_held_out", (held.len() as i64).into()),
        ("plans_failed", (failed as i64).into()),
        ("spearman_before", before.spearman.into()),
        ("spearman_after", after.spearman.into()),
        ("median_abs_pct_before", before.median_abs_pct.into()),
        ("median_abs_pct_after", after.median_abs_pct.into()),
    ] {
        fit_info.insert(k.into(), v);
    }
    let file = common::config::Calibration {
        sim: fitted,
        fit: fit_info,
    };
    let text = format!(
        "# `sim` calibrated to the {} backend ({kernel}) by `benchworker calibrate`.\n\
         # A config takes it with [sim] calibration = \"{}\".\n{}",
        oracle.name(),
        args.out.display(),
        toml::to_string(&file)?
    );
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    writeln!(
        out,
        "sim calibrated to {} ({kernel}): {} plans fitted, {} held out{}",
        oracle.name(),
        train.len(),
        held.len(),
        match failed {
            0 => String::new(),
            n => format!(", {n} not measured"),
        }
    )?;
    writeln!(
        out,
        "{:<28} {:>9} {:>9}",
        "held-out plans", "before", "after"
    )?;
    writeln!(
        out,
        "{:<28} {:>9.3} {:>9.3}",
        "Spearman (iteration cost)", before.spearman, after.spearman
    )?;
    writeln!(
        out,
        "{:<28} {:>8.1}% {:>8.1}%",
        "median |error|", before.median_abs_pct, after.median_abs_pct
    )?;
    writeln!(out, "wrote {}", args.out.display())?;
    Ok(())
}

fn serve(args: ServeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let wait = net::link::seconds("--wait-s", args.wait_s)?;
    let token = net::link::read_token(args.token_file.as_deref())?.with_context(|| {
        format!(
            "no cluster token: give --token-file or set {}",
            net::link::TOKEN_ENV
        )
    })?;
    let stop = net::link::stop_on_signal();
    let opts = crate::serve::ServeOptions {
        endpoint: args.learner,
        token,
        backend: args.backend,
        wait,
        group: match (args.group, args.rank, args.group_gpus) {
            (Some(name), Some(rank), Some(gpus)) => {
                Some(crate::serve::GroupSpec { name, rank, gpus })
            }
            _ => None,
        },
    };
    let r = crate::serve::serve(&zmq::Context::new(), &opts, &stop)?;
    writeln!(
        out,
        "measured {} plans ({} acknowledged durable, {} failed, rejoined {} times)",
        r.measured, r.acked, r.failed, r.rejoined
    )?;
    Ok(())
}

fn bench(args: BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use rand::{Rng, SeedableRng};
    anyhow::ensure!(args.tables > 0, "--tables must be at least 1");
    anyhow::ensure!(args.devices > 0, "--devices must be at least 1");
    anyhow::ensure!(args.plans > 0, "--plans must be at least 1");
    let cfg = args.setup.load(args.backend)?;
    let gen = common::generate::PoolGenConfig {
        tables: args.tables,
        ..cfg.generate.clone()
    };
    let tables = common::generate::generate_pool(&gen, args.seed)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let plans: Vec<common::Plan> = (0..args.plans)
        .map(|_| common::Plan {
            devices: args.devices,
            assignment: (0..args.tables)
                .map(|_| rng.gen_range(0..args.devices))
                .collect(),
        })
        .collect();
    let mut oracle = build(args.backend, &cfg)?;
    let start = std::time::Instant::now();
    let mut total = 0.0;
    for p in &plans {
        total += oracle.measure(&tables, p)?.cost_ms;
    }
    let secs = start.elapsed().as_secs_f64();
    writeln!(
        out,
        "{} backend: {} plans of {} tables on {} devices in {:.3} s: {:.0} plans/s ({:.2} µs per plan), mean cost {:.3} ms",
        oracle.name(),
        args.plans,
        args.tables,
        args.devices,
        secs,
        args.plans as f64 / secs,
        1e6 * secs / args.plans as f64,
        total / args.plans as f64
    )?;
    Ok(())
}

fn fusion(args: FusionArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(args.mixes > 0, "--mixes must be at least 1");
    anyhow::ensure!(
        !args.sizes.is_empty() && !args.sizes.contains(&0),
        "--sizes: every size must be at least 1"
    );
    let cfg = args.setup.load(args.backend)?;
    let pool = common::generate::generate_pool(&cfg.generate, args.seed)
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut oracle = build(args.backend, &cfg)?;
    let bar = indicatif::ProgressBar::new((args.sizes.len() * args.mixes) as u64);
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let rows = crate::sweep::fusion_sweep(
        oracle.as_mut(),
        &pool,
        &args.sizes,
        args.mixes,
        args.seed,
        || bar.inc(1),
    )?;
    bar.finish_and_clear();
    // One JSON object per mix, for --save and --json.
    let mut lines = String::new();
    for r in &rows {
        lines.push_str(&serde_json::to_string(r)?);
        lines.push('\n');
    }
    if let Some(path) = &args.save {
        std::fs::write(path, &lines).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        out.write_all(lines.as_bytes())?;
        return Ok(());
    }
    writeln!(
        out,
        "{} backend, one device: fused call over k tables vs k single-table calls \
         (mean over {} mixes)",
        oracle.name(),
        args.mixes
    )?;
    writeln!(
        out,
        "{:>6} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
        "tables", "fused fwd", "Σ single", "speedup", "fused bwd", "Σ single", "speedup"
    )?;
    for &k in &args.sizes {
        let of_k: Vec<_> = rows.iter().filter(|r| r.tables == k).collect();
        let mean = |f: &dyn Fn(&crate::sweep::FusionRow) -> f64| {
            of_k.iter().map(|r| f(r)).sum::<f64>() / of_k.len() as f64
        };
        writeln!(
            out,
            "{:>6} {:>9.3} ms {:>9.3} ms {:>7.2}× {:>9.3} ms {:>9.3} ms {:>7.2}×",
            k,
            mean(&|r| r.fused_fwd_ms),
            mean(&|r| r.single_fwd_ms),
            mean(&|r| r.fwd_speedup()),
            mean(&|r| r.fused_bwd_ms),
            mean(&|r| r.single_bwd_ms),
            mean(&|r| r.bwd_speedup()),
        )?;
    }
    Ok(())
}

fn measure(args: MeasureArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut cfg = args.setup.load(args.backend)?;
    if let Some(p) = args.precision {
        cfg.memory.precision = p;
    }
    if let Some(o) = args.optimizer {
        cfg.memory.optimizer = o;
    }
    let tables = pool::read(&args.tables)?;
    let plan = Placement::read(&args.placement)?.resolve(&tables, &args.placement)?;
    if let Some(gb) = args.memory_gb {
        anyhow::ensure!(
            gb.is_finite() && gb > 0.0,
            "--memory-gb {gb}: must be a positive number of GiB"
        );
        let cap = gb * common::table::BYTES_PER_GB;
        let used = plan.device_bytes(&tables, &cfg.memory);
        if let Some((d, &b)) = used.iter().enumerate().find(|&(_, &b)| b as f64 > cap) {
            anyhow::bail!(
                "{}: device {d} holds {:.3} GiB of tables ({} weights and {} state: \
                 --precision, --optimizer), over --memory-gb {gb}",
                args.placement.display(),
                b as f64 / common::table::BYTES_PER_GB,
                cfg.memory.precision.name(),
                cfg.memory.optimizer.name(),
            );
        }
    }
    let mut oracle = build(args.backend, &cfg)?;
    let m = oracle
        .measure(&tables, &plan)
        .with_context(|| format!("measuring {}", args.placement.display()))?;
    if args.json {
        let mut v = serde_json::to_value(&m)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("backend".into(), oracle.name().into());
            if let Some(kernel) = oracle.kernel() {
                // What the kernel ran: two runs of one kernel differ by these.
                obj.insert("kernel".into(), kernel.into());
                obj.insert(
                    "precision".into(),
                    serde_json::to_value(cfg.memory.precision)?,
                );
                obj.insert(
                    "optimizer".into(),
                    serde_json::to_value(cfg.memory.optimizer)?,
                );
            }
            if let Some(spread) = oracle.spread() {
                obj.insert("spread".into(), serde_json::to_value(spread)?);
            }
        }
        serde_json::to_writer(&mut *out, &v)?;
        writeln!(out)?;
    } else {
        write_table(&m, out)?;
        match oracle.kernel() {
            Some(kernel) => writeln!(
                out,
                "measured by {} with the {kernel} kernel",
                oracle.name()
            )?,
            None => writeln!(out, "estimated by {}", oracle.name())?,
        }
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
        )
        .unwrap();
        let t = dir.join("t.csv");
        pool::write(&t, &tables).unwrap();
        let p = dir.join("p.json");
        std::fs::write(&p, placement).unwrap();
        (t, p)
    }

    /// Four generated tables, a plan of them on two devices, and its
    /// placement JSON.
    fn four_tables_on_two() -> (Vec<common::Table>, Plan, String) {
        let tables = generate_pool(
            &PoolGenConfig {
                tables: 4,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 1, 0, 1],
        };
        let placement = serde_json::to_string(&Placement::from_plan(&plan, &tables)).unwrap();
        (tables, plan, placement)
    }

    fn run_measure(t: PathBuf, p: PathBuf, json: bool) -> anyhow::Result<String> {
        run_measure_within(t, p, json, None)
    }

    fn run_measure_within(
        t: PathBuf,
        p: PathBuf,
        json: bool,
        memory_gb: Option<f64>,
    ) -> anyhow::Result<String> {
        run_measure_counting(t, p, json, memory_gb, None)
    }

    fn run_measure_counting(
        t: PathBuf,
        p: PathBuf,
        json: bool,
        memory_gb: Option<f64>,
        optimizer: Option<common::Optimizer>,
    ) -> anyhow::Result<String> {
        let cli = Cli {
            command: Command::Measure(MeasureArgs {
                backend: Backend::Sim,
                tables: t,
                placement: p,
                setup: Setup {
                    config: None,
                    kernel: None,
                },
                memory_gb,
                precision: None,
                optimizer,
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
        let (tables, plan, placement) = four_tables_on_two();
        let (t, p) = files(dir.path(), &placement);
        let text = run_measure(t, p, true).unwrap();
        let m: Measurement = serde_json::from_str(&text).unwrap();
        assert_eq!(m.devices.len(), 2);
        // Who measured it: a model names no kernel.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["backend"], "sim");
        assert!(v.get("kernel").is_none(), "{v}");
        let max = m.devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
        assert_eq!(m.cost_ms, max);
        assert!(m.cost_ms > 0.0);
        // With --memory-gb, a device over it is named; at the fullest
        // device's own size the plan is measured.
        let used = plan.device_bytes(&tables, &common::MemoryModel::default());
        let fullest = used.iter().copied().max().unwrap();
        let (d, _) = used
            .iter()
            .enumerate()
            .find(|&(_, &b)| b == fullest)
            .unwrap();
        let gb = fullest as f64 / common::table::BYTES_PER_GB;
        let (t, p) = files(dir.path(), &placement);
        let e = run_measure_within(t.clone(), p.clone(), true, Some(gb * 0.99))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("device {d} holds")), "{e}");
        assert!(run_measure_within(t.clone(), p.clone(), true, Some(gb * 1.01)).is_ok());
        // Adam's two states per weight take more room than rowwise Adagrad's.
        let e = run_measure_counting(
            t.clone(),
            p.clone(),
            true,
            Some(gb * 1.01),
            Some(common::Optimizer::Adam),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("fp16 weights and adam state"), "{e}");
        let e = run_measure_within(t, p, true, Some(-1.0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--memory-gb"), "{e}");
    }

    /// `--kernel` picks the real backends' kernel over the config's; the
    /// measurement names it.
    #[test]
    fn the_kernel_flag_picks_the_kernel_and_the_json_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, placement) = four_tables_on_two();
        let (t, p) = files(dir.path(), &placement);
        let cfg = dir.path().join("small.toml");
        std::fs::write(&cfg, "[cpu]\nbatch = 64\nmax_rows = 1000\nrepeats = 1\n").unwrap();
        for kernel in ["torch", "fbgemm"] {
            let args = [
                "benchworker",
                "measure",
                "--backend",
                "cpu",
                "--json",
                "--kernel",
                kernel,
            ];
            let paths = [
                "--tables".into(),
                t.clone().into_os_string(),
                "--placement".into(),
                p.clone().into_os_string(),
                "--config".into(),
                cfg.clone().into_os_string(),
            ];
            let argv = args.iter().map(std::ffi::OsString::from).chain(paths);
            let mut out = Vec::new();
            run(Cli::try_parse_from(argv).unwrap(), &mut out).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["kernel"], kernel, "{v}");
            // The config's defaults, named as the config names them.
            assert_eq!(v["precision"], "fp16", "{v}");
            assert_eq!(v["optimizer"], "rowwise_adagrad", "{v}");
        }
        let e = Cli::try_parse_from(["benchworker", "bench", "--kernel", "nope"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`nope` is not a kernel: fbgemm or torch"), "{e}");
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

    #[test]
    fn fusion_prints_the_table_and_saves_every_mix() {
        let dir = tempfile::tempdir().unwrap();
        let save = dir.path().join("mixes.jsonl");
        let cli = Cli {
            command: Command::Fusion(FusionArgs {
                backend: Backend::Sim,
                sizes: vec![1, 3],
                mixes: 2,
                setup: Setup {
                    config: None,
                    kernel: None,
                },
                seed: 0,
                json: false,
                save: Some(save.clone()),
            }),
        };
        let mut out = Vec::new();
        run(cli, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(table.contains("fused call over k tables"), "{table}");
        assert_eq!(table.lines().count(), 4, "{table}");
        let saved = std::fs::read_to_string(&save).unwrap();
        let rows: Vec<serde_json::Value> = saved
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let sizes: Vec<u64> = rows.iter().map(|r| r["tables"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [1, 1, 3, 3]);
        assert!(rows
            .iter()
            .all(|r| r["fused_fwd_ms"].as_f64().unwrap() > 0.0));
    }

    /// The calibration file holds `sim`'s constants and the fit; a config
    /// that names it reads them; the saved plans are the ones measured.
    #[test]
    fn calibrate_writes_a_file_a_config_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (out_file, save) = (dir.path().join("cal.toml"), dir.path().join("plans.jsonl"));
        let calibrate = |plans: usize, save: Option<PathBuf>| Cli {
            command: Command::Calibrate(CalibrateArgs {
                backend: Backend::Sim,
                plans,
                max_tables: 6,
                max_devices: 3,
                setup: Setup {
                    config: None,
                    kernel: None,
                },
                seed: 1,
                out: out_file.clone(),
                save,
            }),
        };
        let mut out = Vec::new();
        run(calibrate(24, Some(save.clone())), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("18 plans fitted, 6 held out"), "{text}");
        assert!(
            text.contains("Spearman") && text.contains("median |error|"),
            "{text}"
        );
        let saved = std::fs::read_to_string(&save).unwrap();
        assert_eq!(saved.lines().count(), 24);
        let written: common::config::Calibration =
            toml::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
        assert_eq!(written.fit["backend"].as_str(), Some("sim"));
        let cfg_path = dir.path().join("c.toml");
        std::fs::write(&cfg_path, "[sim]\ncalibration = \"cal.toml\"\n").unwrap();
        let cfg = Config::load(Some(&cfg_path)).unwrap();
        assert_eq!(cfg.sim.link_gibps, written.sim.link_gibps);
        // Too few plans to hold a quarter out.
        let e = run(calibrate(4, None), &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--plans"), "{e}");
    }
}
