//! The `learner` command line.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use common::config::Config;
use common::Suite;
use indicatif::{ProgressBar, ProgressStyle};

use crate::eval::{evaluate, Report};
use crate::runlock::RunLock;
use model::baselines::Method;
use model::shapes::TrainedShapes;

/// The embshard learner: learns to place embedding tables on GPUs.
///
/// `generate` writes the default DLRM-like pool and task suites; `train`
/// learns a placement policy with actors and benchworkers; `eval` compares
/// placement methods (a trained policy included) on a suite with a
/// measuring oracle (`sim`, `cpu` or `cuda`); `plan` places your tables with a
/// trained model.
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
    /// one DIR/SUITE.{train,test}.json per configured suite, and prints the
    /// pool's statistics next to the published trace's. Deterministic: the
    /// same config gives the same files.
    ///
    /// Suites are `[data] suites` in the config: `{ tables, devices,
    /// memory_gb }` gives every task the same memory per device (suite
    /// `dlrm-<tables>x<devices>`); `{ tables, devices, memory_share }` gives
    /// each task that multiple of an even share of its own tables' memory
    /// (suite `dlrm-<tables>x<devices>-share<memory_share>`: 1.1 is tight).
    ///
    /// With `[data] pool = "FILE.csv"` the pool is your own tables (a pool
    /// CSV, see scripts/pool-from-trace.py) instead of a generated one: it
    /// is split and the suites are drawn from it the same way.
    ///
    /// Example:
    ///   learner generate --config configs/default.toml --out data/generated
    Generate(GenerateArgs),
    /// Compare placement methods on a suite.
    ///
    /// For every task of the suite, every method places the tables and the
    /// oracle measures the plan. Prints per method the mean cost (ms) over
    /// the tasks it solved, the tasks it failed (no memory-feasible plan, or
    /// a plan the oracle failed to measure: a warning says why, and the
    /// other tasks stand) and its cost relative to the best heuristic.
    ///
    /// Example:
    ///   learner eval --suite data/generated/dlrm-50x4.test.json --methods all --backend sim
    ///
    /// On the `cpu` backend a measurement takes about a second: give `search`
    /// a small budget (--search-budget 20).
    Eval(EvalArgs),
    /// Train the cost and policy networks (DreamShard's Algorithm 1, asynchronous).
    ///
    /// Measures plans drawn from the current policy on the oracle, fits the
    /// cost network to them, and improves the policy on the estimated MDP
    /// with V-trace. Actors roll out episodes and benchworkers measure
    /// plans: as threads of this process (--actors, --benchworkers), and as
    /// processes on any host that connect to --bind (`actor run`,
    /// `benchworker serve`; scripts/launch.sh starts them). With
    /// --actors 0 --benchworkers 0 and no --bind, everything runs in one
    /// thread, reproducibly. Ctrl-C writes a checkpoint and stops every peer;
    /// so does an error that stops training (no progress for the cluster's
    /// stall_timeout_s, say).
    /// Writes DIR/config.toml (the resolved configuration),
    /// DIR/metrics.jsonl (one line per policy update), DIR/cost_buffer.jsonl
    /// (every measurement, fsynced) and DIR/checkpoints/step-N/; --resume
    /// continues a run after a crash. One learner at a time trains in a
    /// DIR (it holds DIR/lock): a second one is refused.
    ///
    /// Example, with actor and benchworker threads in this process:
    ///   learner train --config configs/default.toml --run-dir runs/first
    ///
    /// Example, a learner that processes join (scripts/launch.sh starts them):
    ///   learner train --config configs/default.toml --run-dir runs/big --bind tcp://10.0.0.5:5555 --actors 0 --benchworkers 0
    Train(TrainArgs),
    /// Pre-train a model across the whole table space, on `sim`.
    ///
    /// Draws pretrain.tasks tasks from the table space (2-64 devices, 1-64
    /// tables per device, dims 4-1024, rows 1e2-1e9, pooling 0.1-300, every
    /// reuse shape; DIR/data), then: stage 1 (DIR/stage1) measures
    /// pretrain.plans_per_task plans of each on `sim` (heuristics', random
    /// and skewed ones, and the plans a local search visits) and fits the
    /// cost network to them for pretrain.cost_steps steps, reporting its
    /// error on held-out tasks; stage 2 is `learner train` on the same
    /// tasks from stage 1's networks (the same options: threads, --bind,
    /// --resume). The result is a run folder that `plan`, `eval` and `train
    /// --init` take; the shipped one is models/pretrained (README).
    ///
    /// Example:
    ///   learner pretrain --config configs/pretrain.toml --run-dir models/pretrained
    // Pre-training starts from fresh networks: --init (refused) is not shown.
    #[command(mut_arg("init", |a| a.hide(true)))]
    Pretrain(TrainArgs),
    /// Place your tables with a trained model, in milliseconds, without a GPU.
    ///
    /// Reads a pool CSV, places every table on one of --devices devices of
    /// --memory-gb each with a trained model (the shipped pre-trained one,
    /// models/pretrained, unless --checkpoint names another), and writes the
    /// placement JSON with the cost network's estimate of each device's
    /// times. With --format torchrec it writes `{"world_size": D, "ranks":
    /// {table: rank}}` for TorchRec's table-wise sharding (see README).
    ///
    /// The heuristics' plans always compete with the learned one. Where the
    /// model cannot be trusted (a table feature outside what it was trained
    /// on, or cost-network members that disagree) plan returns the
    /// heuristic plan the network ranks best and a warning says why.
    /// --verify BACKEND measures every candidate and returns the measured
    /// best.
    ///
    /// Examples:
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16 --checkpoint runs/first --verify sim
    Plan(PlanArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    /// {"devices", "assignment": [{"table", "device"}], "estimate": {…}}
    Placement,
    /// {"world_size", "ranks": {table: rank}}
    Torchrec,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Pool CSV of the tables to place.
    #[arg(long)]
    pub tables: PathBuf,
    /// Devices (GPUs) to place the tables on.
    #[arg(long)]
    pub devices: usize,
    /// Memory per device, GB (GiB).
    #[arg(long)]
    pub memory_gb: f64,
    /// Run directory of a trained model (default: the shipped pre-trained
    /// model, models/pretrained).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Measure the final candidates (the learned plan and the heuristics'
    /// plans) on this oracle and return the measured best, printing its
    /// measured gain over the best heuristic: `sim` and `cpu` run in this
    /// process (`cuda` on a GPU host built with the cuda feature).
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub verify: Option<benchworker::Backend>,
    /// What to write: the placement with the cost network's estimates, or
    /// TorchRec's rank per table.
    #[arg(long, value_enum, default_value = "placement")]
    pub format: PlanFormat,
    /// Write here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Accepted for symmetry with the other commands: plan always writes
    /// JSON (and logs go to stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Configuration TOML (its train, model, … sections); defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run directory: configuration, metrics and checkpoint go there.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// The oracle that measures plans (default: sim; a resumed run, the one
    /// it measured with, recorded in DIR/backend).
    #[arg(long, value_enum)]
    pub backend: Option<benchworker::Backend>,
    /// Continue the run in --run-dir from its newest intact checkpoint, with
    /// its own config.toml and every measurement of its cost-buffer log (a
    /// run stopped before its first checkpoint: fresh networks, trained on
    /// those measurements).
    #[arg(long)]
    pub resume: bool,
    /// Also accept actors and benchworkers at this ZeroMQ endpoint, e.g.
    /// tcp://127.0.0.1:5555 (port 0: any free port). Each connection must
    /// give the cluster token at its handshake (ZeroMQ PLAIN), where the
    /// token travels in clear: bind a non-loopback address only on a
    /// network you trust. The endpoint bound is written to DIR/endpoint.
    #[arg(long)]
    pub bind: Option<String>,
    /// Actor threads beside the learner (default: the config's cluster.actors).
    /// A new run keeps them in its config.toml, so --resume runs as many;
    /// given with --resume, they hold for that session.
    #[arg(long)]
    pub actors: Option<usize>,
    /// Benchworker threads beside the learner (default: cluster.benchworkers;
    /// kept like --actors).
    #[arg(long)]
    pub benchworkers: Option<usize>,
    /// File holding the cluster token that peers must present (or set
    /// EMBSHARD_TOKEN). With --bind and neither, a random token is written
    /// to DIR/token (readable by its owner only) for the peers to use; a
    /// token given is recorded as its fingerprint in DIR/token.fingerprint.
    /// A resume with --bind must use the run's token: the peers hold it.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Start from the networks of a trained run instead of fresh ones, e.g.
    /// the shipped pre-trained model `models/pretrained`: Algorithm 1 then
    /// fine-tunes it on this run's tasks and measurement budget. Its
    /// `[model]` section (the layer sizes) replaces the config's. Kept in the
    /// run's config.toml as train.init.
    #[arg(long, value_name = "RUN")]
    pub init: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Configuration TOML (its generate, data and memory sections); defaults when omitted.
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
    /// lookup, size_lookup, torchrec, search, and policy (a trained
    /// model's `plan`: --checkpoint's, or the shipped one).
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
    /// Run directory of a trained model: adds the method `policy`, which
    /// is what `learner plan` returns (its network sizes come from the
    /// run's config.toml). Without it, `policy` (and `all`) use the shipped
    /// pre-trained model, models/pretrained.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
}

/// Runs a parsed command, writing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate(args, out),
        Command::Eval(args) => eval(args, out),
        Command::Train(args) => train(args, out),
        Command::Pretrain(args) => pretrain(args, out),
        Command::Plan(args) => plan(args, out),
    }
}

fn plan(args: PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // One episode's tensors are tiny: a thread pool only adds latency.
    tch::set_num_threads(1);
    let checkpoint = match &args.checkpoint {
        Some(path) => path.clone(),
        None => {
            let shipped = default_model()?;
            tracing::info!("placing with the shipped model in {}", shipped.display());
            shipped
        }
    };
    let (run_cfg, model) = crate::checkpoint::load_run(&checkpoint)?;
    let tables = common::pool::read(&args.tables)?;
    let task = common::Task {
        name: args.tables.display().to_string(),
        devices: args.devices,
        memory_gb: args.memory_gb,
        tables,
    };
    anyhow::ensure!(
        (1..=common::placement::MAX_DEVICES).contains(&args.devices),
        "--devices must lie in 1..={}",
        common::placement::MAX_DEVICES
    );
    anyhow::ensure!(
        args.memory_gb.is_finite() && args.memory_gb > 0.0,
        "--memory-gb must be a positive number"
    );
    if let Some(why) = task.infeasibility(&run_cfg.memory) {
        anyhow::bail!("{}: cannot fit memory: {why}", args.tables.display());
    }
    let shapes = TrainedShapes::read(&checkpoint);
    // libtorch prepares each kind of operation on its first call; one tiny
    // placement first keeps that out of the placement's own time (both are
    // logged).
    let warm = std::time::Instant::now();
    let tiny = common::Task {
        name: "warm-up".into(),
        devices: args.devices,
        memory_gb: 1e6,
        tables: task.tables.iter().take(2).cloned().collect(),
    };
    model::guard::plan(&model, None, &tiny, &run_cfg.memory)?;
    let warm = warm.elapsed();
    let start = std::time::Instant::now();
    let mut guarded = model::guard::plan(&model, shapes.as_ref(), &task, &run_cfg.memory)?;
    let elapsed = start.elapsed();
    for note in &guarded.notes {
        tracing::warn!(
            "{note}: its plans can lose to the heuristics this far out; `--verify sim` \
             measures the candidates, or {}",
            TrainedShapes::ADVICE
        );
    }
    if !guarded.doubts.is_empty() {
        tracing::warn!(
            "not following the learned plan: {}; placed with `{}`'s plan (`--verify BACKEND` \
             measures every candidate)",
            guarded.doubts.join("; "),
            guarded.method()
        );
    }
    if let Some(backend) = args.verify {
        let mut oracle = benchworker::build(backend, &run_cfg)?;
        model::guard::verify(&mut guarded, &task.tables, oracle.as_mut())?;
        let chosen = &guarded.candidates[guarded.chosen];
        if let Some(h) = guarded.best_heuristic() {
            let h = &guarded.candidates[h];
            if let (Some(c), Some(b)) = (chosen.measured, h.measured) {
                tracing::info!(
                    "--verify {}: `{}` measured {c:.3} ms, {:+.2} % against the best heuristic \
                     (`{}`, {b:.3} ms)",
                    backend.name(),
                    chosen.method,
                    (c / b - 1.0) * 100.0,
                    h.method
                );
            }
        }
    }
    let plan = guarded.plan().clone();
    let (per_device, cost) = model.estimate(&task.tables, &plan);
    tracing::info!(
        "placed {} tables on {} devices with `{}` in {:.2} ms after a {:.2} ms warm-up \
         (estimated iteration {cost:.3} ms)",
        task.tables.len(),
        args.devices,
        guarded.method(),
        elapsed.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3
    );
    let doc = match args.format {
        PlanFormat::Placement => {
            let mut v = serde_json::to_value(common::Placement::from_plan(&plan, &task.tables))?;
            v["estimate"] = serde_json::json!({
                "cost_ms": cost,
                "devices": per_device
                    .iter()
                    // A time is not negative: the network's prediction
                    // below 0 (for an empty device, where it never
                    // learned) is written as 0.
                    .map(|d| d.map(|t| t.max(0.0)))
                    .map(|d| serde_json::json!({"fwd_ms": d[0], "bwd_ms": d[1], "bwd_comm_ms": d[2]}))
                    .collect::<Vec<_>>(),
            });
            v["method"] = serde_json::json!(guarded.method());
            v["doubts"] = serde_json::json!(guarded.doubts);
            v["candidates"] = guarded
                .candidates
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "method": c.method,
                        "predicted_ms": c.mean(),
                        "predicted_ms_members": c.predicted,
                        "measured_ms": c.measured,
                    })
                })
                .collect();
            v
        }
        PlanFormat::Torchrec => serde_json::json!({
            "world_size": args.devices,
            "ranks": task
                .tables
                .iter()
                .zip(&plan.assignment)
                .map(|(t, &d)| (t.name.clone(), serde_json::json!(d)))
                .collect::<serde_json::Map<_, _>>(),
        }),
    };
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    match args.out {
        Some(path) => common::fs::write_atomic(&path, text.as_bytes())?,
        None => write!(out, "{text}")?,
    }
    Ok(())
}

/// The shipped pre-trained model (`models/pretrained`), for `plan` and
/// `eval` without `--checkpoint`: looked for under the current folder, then
/// beside the binary's build folder (`target/release/../../models`).
pub fn default_model() -> anyhow::Result<PathBuf> {
    let rel = Path::new("models").join("pretrained");
    let beside_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join(&rel)));
    let tried: Vec<PathBuf> = std::iter::once(rel.clone()).chain(beside_binary).collect();
    tried
        .iter()
        .find(|p| p.join("config.toml").is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no --checkpoint given and the shipped model is not at {}: give a trained \
                 run's folder (`learner train --run-dir DIR` makes one)",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

/// Keeps the lines of a run's `metrics.jsonl` up to update `step` (a
/// resumed run's curves continue from its checkpoint); returns the training
/// clock of the last line kept.
fn keep_metrics_until(path: &Path, step: usize) -> anyhow::Result<f64> {
    let kept: Vec<(String, f64)> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v = serde_json::from_str::<serde_json::Value>(l).ok()?;
            let s = v["step"].as_u64()?;
            (s as usize <= step).then(|| (format!("{l}\n"), v["elapsed_s"].as_f64().unwrap_or(0.0)))
        })
        .collect();
    let text: String = kept.iter().map(|(l, _)| l.as_str()).collect();
    common::fs::write_atomic(path, text.as_bytes())?;
    Ok(kept.last().map_or(0.0, |(_, e)| *e))
}

/// The oracle a run measures with: its cost buffer holds one oracle's
/// measurements, so a resumed run keeps the backend it started with
/// (recorded in `DIR/backend` when it starts; a run from before the record
/// takes the one asked for, or `sim`).
fn run_backend(
    dir: &std::path::Path,
    asked: Option<benchworker::Backend>,
    resume: bool,
) -> anyhow::Result<benchworker::Backend> {
    use clap::ValueEnum;
    let path = dir.join("backend");
    // A new run starts its own record, whatever a failed start left.
    let read = if resume {
        std::fs::read_to_string(&path)
    } else {
        Err(std::io::ErrorKind::NotFound.into())
    };
    let recorded = match read {
        Ok(text) => Some(
            benchworker::Backend::from_str(text.trim(), true).map_err(|_| {
                anyhow::anyhow!(
                    "{}: `{}` is no backend (sim, cpu or cuda)",
                    path.display(),
                    text.trim()
                )
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    match (recorded, asked) {
        (Some(r), Some(a)) if r != a => anyhow::bail!(
            "the run in {} measures with the {} backend (its cost buffer holds {} \
             measurements), not {}: go on without --backend, or start another --run-dir",
            dir.display(),
            r.name(),
            r.name(),
            a.name()
        ),
        (Some(r), _) => Ok(r),
        (None, a) => {
            let b = a.unwrap_or(benchworker::Backend::Sim);
            common::fs::write_atomic(&path, format!("{}\n", b.name()).as_bytes())?;
            Ok(b)
        }
    }
}

fn train(args: TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    train_with(args, None, Vec::new(), out)
}

/// `learner train`, with the configuration already resolved for a new run
/// (`given`, else `--config`'s) and measurements the cost network learns
/// from beside the run's own (`prior`: see [`crate::train::Trainer::prior`]).
fn train_with(
    args: TrainArgs,
    given: Option<Config>,
    prior: Vec<model::loss::CostSample>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use crate::checkpoint;
    use crate::costlog::CostLog;
    let dir = &args.run_dir;
    let log_path = dir.join("cost_buffer.jsonl");
    let metrics_path = dir.join("metrics.jsonl");
    // One learner per run directory, from before its state is read until
    // training ends; a folder not there yet is locked once made, below.
    let early_lock = dir.is_dir().then(|| RunLock::take(dir)).transpose()?;
    let has_run = !checkpoint::list(dir).is_empty();
    let cfg = if args.resume {
        if args.config.is_some() {
            tracing::warn!("--resume uses the run's own config.toml; --config is ignored");
        }
        let config = dir.join("config.toml");
        anyhow::ensure!(
            config.exists(),
            "no run to resume in {}: it holds no config.toml (`learner train --config C \
             --run-dir {}` starts one)",
            dir.display(),
            dir.display()
        );
        Config::load_run(&config)?
    } else {
        anyhow::ensure!(
            !has_run,
            "{} already holds a run: add --resume to continue it, or pick another --run-dir",
            dir.display()
        );
        // A run stopped before its first checkpoint still has its
        // measurements: never thrown away unasked.
        let logged = CostLog::read(&log_path)?.samples.len();
        anyhow::ensure!(
            logged == 0,
            "{} holds {logged} measurements of a run that stopped before its first \
             checkpoint: add --resume to train on with them, or pick another --run-dir",
            log_path.display()
        );
        match given {
            Some(cfg) => cfg,
            None => Config::load(args.config.as_deref())?,
        }
    };
    // The threads asked for are part of the run: written to its
    // config.toml, so that a resume runs the same way unless told otherwise.
    let mut cfg = cfg;
    if let Some(init) = &args.init {
        anyhow::ensure!(
            !args.resume,
            "--init starts a new run from a trained one; a resumed run already has its \
             networks (drop --init)"
        );
        cfg.train.init = Some(init.clone());
    }
    // The layer sizes are the initial networks': its [model] section (a
    // resumed run's config.toml holds it already).
    let mut init = None;
    if let (Some(path), false) = (&cfg.train.init, args.resume) {
        let (init_cfg, model) = crate::checkpoint::load_init(path)?;
        if init_cfg.model != cfg.model {
            tracing::info!(
                "the [model] section of {} replaces the configuration's (its weights have \
                 its layer sizes)",
                path.display()
            );
        }
        cfg.model = init_cfg.model;
        init = Some(model);
    }
    if let Some(a) = args.actors {
        cfg.cluster.actors = a;
    }
    if let Some(b) = args.benchworkers {
        cfg.cluster.benchworkers = b;
    }
    let (actors, benchworkers) = (cfg.cluster.actors, cfg.cluster.benchworkers);
    let alone = actors == 0 && benchworkers == 0 && args.bind.is_none();
    anyhow::ensure!(
        alone || args.bind.is_some() || (actors > 0 && benchworkers > 0),
        "without --bind, training needs at least one actor and one benchworker thread \
         (or neither, to run in one thread); got {actors} and {benchworkers}"
    );
    // A cluster run's peers are processes: resumed without --bind, it would
    // go on in one thread while they wait for their learner.
    let bound_before = ["endpoint", "endpoint.last"]
        .iter()
        .any(|f| dir.join(f).exists());
    anyhow::ensure!(
        !(args.resume && alone && bound_before),
        "{} is a cluster run (its learner listened for actor and benchworker processes): \
         resume it with `scripts/launch.sh --resume {}` or `learner train --run-dir {} \
         --resume --bind ENDPOINT`, or give --actors N --benchworkers M to go on with threads",
        dir.display(),
        dir.display(),
        dir.display()
    );
    let train_tasks = crate::data::train_tasks(&cfg)?;
    common::fs::create_dir_durable(dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock = match early_lock {
        Some(lock) => lock,
        None => RunLock::take(dir)?,
    };
    let backend = run_backend(dir, args.backend, args.resume)?;
    // The networks are small: one libtorch thread each for the learner and
    // every actor beats threads that spin against each other for the cores.
    tch::set_num_threads(1);
    // What measures plans and acts, set up before the run's state is
    // touched: a backend that cannot start or a token that cannot be had
    // stops the run here, before training (and its checkpoint on error).
    let mut workers = if alone {
        Workers::Alone(benchworker::build(backend, &cfg)?)
    } else {
        Workers::Cluster(crate::runtime::ClusterRun {
            bind: args.bind.iter().cloned().collect(),
            token: cluster_token(&args, bound_before)?,
            actors,
            benchworkers,
            backend,
        })
    };
    // A fine-tuned model is judged by its own training tasks alone:
    // fine-tuning moves the networks toward them and away from what they
    // learned before (docs/results.md, "Fine-tuning").
    if let Some(shapes) = TrainedShapes::of(&train_tasks) {
        shapes.write(dir)?;
    }
    let mut trainer = if args.resume {
        let read = CostLog::read(&log_path)?;
        if read.skipped > 0 {
            tracing::warn!("{} damaged cost-buffer entries skipped", read.skipped);
        }
        match checkpoint::load_latest(&cfg, dir)? {
            Some(loaded) => {
                tracing::info!(
                    "resuming from {} (iteration {}, {} measurements)",
                    loaded.path.display(),
                    loaded.counters.iteration,
                    read.samples.len()
                );
                let (cost_state, policy_state) = checkpoint::split_optimizer(loaded.optimizer);
                let mut counters = loaded.counters;
                let clock = keep_metrics_until(&metrics_path, counters.policy_updates)?;
                // A checkpoint from before the clock was kept reads 0: its
                // run's curve goes on from its last line.
                counters.training_s = counters.training_s.max(clock);
                let mut t = crate::train::Trainer::with(
                    &cfg,
                    &train_tasks,
                    loaded.model,
                    read.samples,
                    counters,
                );
                t.cost_opt
                    .load_state(&cost_state)
                    .map_err(anyhow::Error::msg)?;
                t.policy_opt
                    .load_state(&policy_state)
                    .map_err(anyhow::Error::msg)?;
                t
            }
            None if has_run => anyhow::bail!(
                "every checkpoint in {} is damaged (each set aside as step-….damaged); \
                 --resume once more trains fresh networks on the {} logged measurements",
                dir.display(),
                read.samples.len()
            ),
            None => {
                // Stopped before its first checkpoint: the measurements
                // are what cost the most, so fresh networks start over on
                // them.
                tracing::warn!(
                    "no intact checkpoint in {}: training starts over from fresh networks, \
                     keeping the {} logged measurements",
                    dir.display(),
                    read.samples.len()
                );
                keep_metrics_until(&metrics_path, 0)?;
                let mut t = fresh_trainer(&cfg, &train_tasks, init.take())?;
                t.buffer = read.samples;
                t
            }
        }
    } else {
        // Its paths absolute: a resume, `eval` and `plan` find its data
        // from any folder.
        let here = std::env::current_dir().context("the current folder")?;
        let written = cfg.clone().with_absolute_paths(&here);
        common::fs::write_atomic(
            &dir.join("config.toml"),
            toml::to_string_pretty(&written)?.as_bytes(),
        )?;
        common::fs::write_atomic(&metrics_path, b"")?;
        fresh_trainer(&cfg, &train_tasks, init.take())?
    };
    trainer.prior = prior;
    let mut log = CostLog::open(&log_path)?;
    let mut metrics = std::fs::OpenOptions::new()
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("opening {}", metrics_path.display()))?;
    let t = &cfg.train;
    // Ctrl-C (or SIGTERM): finish the update in progress, checkpoint, exit.
    let stop = common::link::stop_on_signal();
    let bar = train_progress((t.iterations * t.policy_steps) as u64);
    bar.set_position(trainer.counters.policy_updates as u64);
    let start = (std::time::Instant::now(), trainer.counters.env_steps);
    let learned_at_start = (trainer.counters.policy_updates, trainer.counters.cost_steps);
    // When this session's first and latest policy updates came, with the
    // env steps then: the rate between them leaves out the start (peers
    // loading libtorch, the first measurements) and the stop (a cluster's
    // grace for its peers), which weigh on a short run.
    let updates =
        std::cell::Cell::new(None::<((std::time::Instant, u64), (std::time::Instant, u64))>);
    let mut hooks = crate::train::Hooks {
        measured: Box::new(|s| log.append(s)),
        metrics: Box::new(|m| {
            let now = (std::time::Instant::now(), m.env_steps as u64);
            updates.set(Some(
                updates.get().map_or((now, now), |(first, _)| (first, now)),
            ));
            // Made durable with each checkpoint: a resume drops later lines.
            writeln!(metrics, "{}", serde_json::to_string(m)?)
                .with_context(|| format!("writing {}", metrics_path.display()))?;
            bar.set_position(m.step as u64);
            let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}"));
            bar.set_message(format!(
                "v{} · {}/{} measured · plans {} ms (predicted {}) · reward {:.3} · lag {}",
                m.policy_version,
                m.measurements,
                t.iterations * t.measure_per_iteration,
                ms(m.mean_measured_ms),
                ms(m.mean_predicted_ms),
                m.policy.mean_reward,
                m.policy_lag,
            ));
            Ok(())
        }),
        round_done: Box::new(|trainer| {
            if trainer.done() || trainer.counters.iteration % t.checkpoint_every == 0 {
                sync_file(&metrics_path)?;
                checkpoint::save(dir, trainer, t.keep_checkpoints)?;
            }
            Ok(())
        }),
    };
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let mut began = false;
    let rounds = run_rounds(
        &mut trainer,
        &mut workers,
        &mut hooks,
        &stop,
        dir,
        &mut began,
    );
    drop(hooks);
    bar.finish_and_clear();
    let lags = match rounds {
        Ok(lags) => lags,
        // As on Ctrl-C, what was learned is kept (the run's curves and
        // measurements are on disk already); a setup that failed before
        // training began (a port in use) has nothing to add.
        Err(e) if began => {
            let resume = resume_command(&args);
            // Nothing learned since the start (say, peers that never came):
            // no checkpoint of untouched networks; the measurements are in
            // the cost log, which a resume reads.
            let c = &trainer.counters;
            if (c.policy_updates, c.cost_steps) == learned_at_start {
                return Err(e.context(format!(
                    "training stopped before learning anything; `{resume}` goes on with the \
                     measurements logged"
                )));
            }
            let saved = sync_file(&metrics_path)
                .and_then(|()| checkpoint::save(dir, &trainer, t.keep_checkpoints));
            return Err(match saved {
                Ok(at) => e.context(format!(
                    "training stopped; what it learned is in checkpoint {}, which `{resume}` \
                     continues from once the cause is dealt with (peer processes keep saying \
                     hello to the endpoint; a run of scripts/launch.sh goes on with \
                     `scripts/launch.sh --resume {}`)",
                    at.display(),
                    dir.display()
                )),
                Err(not) => e.context(format!(
                    "training stopped, and no checkpoint of it could be written ({not:#}); \
                     `{resume}` continues from the run's last one"
                )),
            });
        }
        Err(e) => return Err(e),
    };
    if stopped() && !trainer.done() {
        sync_file(&metrics_path)?;
        let at = checkpoint::save(dir, &trainer, t.keep_checkpoints)?;
        tracing::info!(
            "stopped; checkpoint {} written: --resume continues",
            at.display()
        );
    }
    let secs = start.0.elapsed().as_secs_f64();
    let steps = trainer.counters.env_steps - start.1;
    let c = &trainer.counters;
    write!(
        out,
        "trained {} iterations: {} measurements, {} policy updates, {steps} env steps in {secs:.1} s \
         ({:.0} env steps/s learned from",
        c.iteration,
        trainer.buffer.len(),
        c.policy_updates,
        steps as f64 / secs.max(1e-9),
    )?;
    if let Some((first, last)) = updates.get() {
        let between = last.0.duration_since(first.0).as_secs_f64();
        if last.1 > first.1 && between > 0.0 {
            write!(
                out,
                "; {:.0} from the first update to the last",
                (last.1 - first.1) as f64 / between
            )?;
        }
    }
    write!(out, "), {} unrolls dropped", c.dropped_unrolls)?;
    if let Some((p50, p99, weights, stale)) = lags {
        write!(
            out,
            " ({stale} too old), policy lag median {p50}, p99 {p99}, {weights} weight messages sent"
        )?;
    }
    writeln!(out, "; run in {}", dir.display())?;
    Ok(())
}

fn pretrain(mut args: TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::pretrain;
    let dir = args.run_dir.clone();
    anyhow::ensure!(
        args.init.is_none(),
        "pretrain starts from fresh networks (its stage 1 is what `train --init` would \
         load): drop --init"
    );
    let stage1 = dir.join(pretrain::STAGE1);
    let cfg = if args.resume && dir.join("config.toml").exists() {
        Config::load_run(&dir.join("config.toml"))?
    } else if args.resume && stage1.join("config.toml").exists() {
        Config::load_run(&stage1.join("config.toml"))?
    } else {
        anyhow::ensure!(
            !dir.join("config.toml").exists() && !stage1.join("config.toml").exists(),
            "{} already holds a pre-training run: add --resume to continue it, or pick \
             another --run-dir",
            dir.display()
        );
        Config::load(args.config.as_deref())?
    };
    let tasks = pretrain::tasks(&cfg);
    let suite = pretrain::write_tasks(&dir, &tasks)?;
    let here = std::env::current_dir().context("the current folder")?;
    let mut cfg = cfg.with_absolute_paths(&here);
    cfg.train.suite = here.join(&suite);
    cfg.train.extra_suites.clear();
    cfg.train.init = None;
    let bar = progress(tasks.len() as u64, "measuring the bulk on sim");
    let start = std::time::Instant::now();
    let (bulk, held) = pretrain::bulk(&cfg, &tasks, &|| bar.inc(1))?;
    bar.finish_and_clear();
    writeln!(
        out,
        "stage 1: {} plans of {} tasks measured on sim in {:.1} s ({} of them of the {} held-out tasks)",
        bulk.len() + held.len(),
        tasks.len(),
        start.elapsed().as_secs_f64(),
        held.len(),
        tasks.len() / pretrain::HOLD_OUT,
    )?;
    // Stage 2 under way: stage 1 is done (and a shipped model's stage 1
    // is left out of it).
    if crate::checkpoint::list(&dir).is_empty() {
        stage_one(&cfg, &tasks, &stage1, &bulk, &held, out)?;
    }
    // Stage 2: Algorithm 1 on the same tasks from stage 1's networks.
    let resume_stage2 = dir.join("config.toml").exists();
    args.resume = resume_stage2;
    if !resume_stage2 {
        args.init = Some(here.join(&stage1));
    }
    train_with(args, Some(cfg), bulk, out)
}

/// Stage 1 of `pretrain`: the cost network fitted to the bulk, in
/// `stage1` (a run folder of its own: resumable, and what stage 2 starts
/// from). Nothing to do when its newest checkpoint has every step.
fn stage_one(
    cfg: &Config,
    tasks: &[common::Task],
    stage1: &Path,
    bulk: &[model::loss::CostSample],
    held: &[model::loss::CostSample],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use crate::checkpoint;
    const EVERY: usize = 2000;
    let steps = cfg.pretrain.cost_steps;
    common::fs::create_dir_durable(stage1)
        .with_context(|| format!("creating {}", stage1.display()))?;
    let _lock = RunLock::take(stage1)?;
    tch::set_num_threads(
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .try_into()
            .unwrap_or(1),
    );
    let mut trainer = match checkpoint::load_latest(cfg, stage1)? {
        Some(loaded) => {
            let (cost_state, _) = checkpoint::split_optimizer(loaded.optimizer);
            let mut t =
                crate::train::Trainer::with(cfg, tasks, loaded.model, Vec::new(), loaded.counters);
            t.cost_opt
                .load_state(&cost_state)
                .map_err(anyhow::Error::msg)?;
            t
        }
        None => {
            common::fs::write_atomic(
                &stage1.join("config.toml"),
                toml::to_string_pretty(cfg)?.as_bytes(),
            )?;
            crate::train::Trainer::new(cfg, tasks)
        }
    };
    if let Some(shapes) = TrainedShapes::of(tasks) {
        shapes.write(stage1)?;
    }
    trainer.prior = bulk.to_vec();
    let before = crate::pretrain::relative_error(&trainer.model, held);
    let rounds = cfg.pretrain.search_rounds;
    let share = steps / (rounds + 1);
    let mut rounds_done = 0;
    let stop = common::link::stop_on_signal();
    let bar = train_progress(steps as u64);
    bar.set_position(trainer.counters.cost_steps as u64);
    let start = std::time::Instant::now();
    let mut done_here = 0usize;
    while trainer.counters.cost_steps < steps {
        let due = (trainer.counters.cost_steps / share.max(1)).min(rounds);
        while rounds_done < due {
            rounds_done += 1;
            let (found, held_found) = crate::pretrain::searched(&trainer.model, cfg, tasks)?;
            let (mean, p90) = crate::pretrain::relative_error(&trainer.model, &held_found);
            tracing::info!(
                "stage 1: search round {rounds_done}/{rounds}: {} plans found and measured; \
                 error on those of held-out tasks {:.1} % (p90 {:.1} %)",
                found.len() + held_found.len(),
                mean * 100.0,
                p90 * 100.0
            );
            trainer.prior.extend(found);
        }
        trainer.cost_step();
        done_here += 1;
        bar.inc(1);
        let at = trainer.counters.cost_steps;
        if at % EVERY == 0 || at == steps {
            checkpoint::save(stage1, &trainer, 2)?;
            let (mean, p90) = crate::pretrain::relative_error(&trainer.model, held);
            bar.set_message(format!(
                "held-out error {:.1} % (p90 {:.1} %)",
                mean * 100.0,
                p90 * 100.0
            ));
            tracing::info!(
                "stage 1: {at}/{steps} cost steps; held-out relative error {:.1} % (p90 {:.1} %)",
                mean * 100.0,
                p90 * 100.0
            );
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            checkpoint::save(stage1, &trainer, 2)?;
            bar.finish_and_clear();
            anyhow::bail!(
                "stopped in stage 1 at {at}/{steps} cost steps; checkpoint written: \
                 `learner pretrain --resume --run-dir {}` continues",
                stage1.parent().unwrap_or(stage1).display()
            );
        }
    }
    bar.finish_and_clear();
    let after = crate::pretrain::relative_error(&trainer.model, held);
    let (_, held_found) = crate::pretrain::searched(&trainer.model, cfg, tasks)?;
    let searched = crate::pretrain::relative_error(&trainer.model, &held_found);
    writeln!(
        out,
        "stage 1: {done_here} cost steps in {:.1} s; held-out relative error of the iteration \
         cost {:.1} % (p90 {:.1} %), {:.1} % before; on the plans its search finds for \
         held-out tasks {:.1} % (p90 {:.1} %)",
        start.elapsed().as_secs_f64(),
        after.0 * 100.0,
        after.1 * 100.0,
        before.0 * 100.0,
        searched.0 * 100.0,
        searched.1 * 100.0
    )?;
    tch::set_num_threads(1);
    Ok(())
}

/// A trainer at its first round: fresh networks, or `init`'s (a trained
/// run's newest checkpoint) to fine-tune.
fn fresh_trainer<'a>(
    cfg: &'a Config,
    tasks: &'a [common::Task],
    init: Option<model::Model>,
) -> anyhow::Result<crate::train::Trainer<'a>> {
    let model = match (init, &cfg.train.init) {
        (Some(model), _) => model,
        // A resumed run that stopped before its first checkpoint.
        (None, Some(path)) => crate::checkpoint::load_init(path)?.1,
        (None, None) => return Ok(crate::train::Trainer::new(cfg, tasks)),
    };
    if let Some(path) = &cfg.train.init {
        tracing::info!("starting from the networks of {}", path.display());
    }
    Ok(crate::train::Trainer::from_model(cfg, tasks, model))
}

/// Where training's measurements and unrolls come from.
enum Workers {
    /// Algorithm 1 in this thread, measuring on this oracle.
    Alone(Box<dyn benchworker::Oracle>),
    /// Actor and benchworker threads, and processes that connect to `--bind`.
    Cluster(crate::runtime::ClusterRun),
}

/// Policy lag median and 99th percentile, weight messages sent and unrolls
/// dropped as too old, of a cluster run.
type Lags = (u64, u64, u64, u64);

/// Trains until every round is done or `stop` is set; `began` is set once
/// training has begun (a cluster's endpoints bound).
fn run_rounds(
    trainer: &mut crate::train::Trainer,
    workers: &mut Workers,
    hooks: &mut crate::train::Hooks,
    stop: &std::sync::atomic::AtomicBool,
    dir: &Path,
    began: &mut bool,
) -> anyhow::Result<Option<Lags>> {
    let run = match workers {
        Workers::Alone(oracle) => {
            *began = true;
            while !trainer.done() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                trainer.iteration(oracle.as_mut(), hooks)?;
            }
            return Ok(None);
        }
        Workers::Cluster(run) => run,
    };
    let (report, _) = crate::runtime::train_cluster(trainer, run, hooks, stop, |bound| {
        *began = true;
        if let Some(e) = bound.first() {
            tracing::info!("learner listening at {e}");
            common::fs::write_atomic(&dir.join("endpoint"), format!("{e}\n").as_bytes())?;
        }
        Ok(())
    })?;
    let refused = [
        report.bad_unrolls,
        report.uncredited_unrolls,
        report.drops.total(),
        report.refused_peers,
        report.refused_handshakes,
        report.bad_envelopes,
    ];
    if refused.iter().sum::<u64>() > 0 {
        tracing::warn!(
            "{} malformed unrolls, {} unrolls sent without a credit, {} undecodable frames, \
             {} refused peers, {} connections refused at their handshake (no cluster token, or \
             another), {} messages with a mismatched envelope",
            refused[0],
            refused[1],
            refused[2],
            refused[3],
            refused[4],
            refused[5]
        );
    }
    if report.resyncs > 0 {
        tracing::warn!(
            "{} times a peer was silent where a message may have been lost on the way (a \
             late job's benchworker given work again, an actor's credits granted anew)",
            report.resyncs
        );
    }
    Ok(Some((
        report.lag_quantile(0.5),
        report.lag_quantile(0.99),
        report.weights_sent,
        report.stale_unrolls,
    )))
}

/// The command that resumes the run `args` trained: with the endpoint its
/// peers know and the token file it was given.
fn resume_command(args: &TrainArgs) -> String {
    let dir = &args.run_dir;
    let mut c = format!("learner train --run-dir {} --resume", dir.display());
    if let Some(bind) = &args.bind {
        let bound = std::fs::read_to_string(dir.join("endpoint")).unwrap_or_default();
        let endpoint = Some(bound.trim()).filter(|b| !b.is_empty()).unwrap_or(bind);
        c.push_str(&format!(" --bind {endpoint}"));
    }
    if let Some(file) = &args.token_file {
        c.push_str(&format!(" --token-file {}", file.display()));
    }
    c
}

/// Flushes a file's written data to disk.
fn sync_file(path: &std::path::Path) -> anyhow::Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_data())
        .with_context(|| format!("syncing {}", path.display()))
}

/// The cluster token: from `--token-file`, else `EMBSHARD_TOKEN`, else
/// (for a learner that accepts remote peers) RUN/token's, made at random
/// when there is none, else a random one for the threads alone.
///
/// The token of a run with remote peers is recorded: in RUN/token when the
/// learner made it, as its fingerprint in RUN/token.fingerprint (never the
/// token itself) when it was given. A resume must present the same token,
/// or every peer that outlived the learner would be refused; `bound_before`
/// says the run listened for peers before (a run that did with neither
/// file had its token given, before fingerprints were kept).
fn cluster_token(args: &TrainArgs, bound_before: bool) -> anyhow::Result<String> {
    use common::link::{read_token, token_fingerprint, TOKEN_ENV};
    let given = read_token(args.token_file.as_deref())?;
    if args.bind.is_none() {
        // Threads alone: they start and stop with the learner.
        return Ok(given.unwrap_or_else(common::link::random_token));
    }
    let dir = &args.run_dir;
    let made = dir.join("token");
    let printed = dir.join("token.fingerprint");
    let recorded = if made.exists() {
        read_token(Some(&made))?.map(|t| token_fingerprint(&t))
    } else if printed.exists() {
        let text = std::fs::read_to_string(&printed)
            .with_context(|| format!("reading {}", printed.display()))?;
        Some(text.trim().to_string())
    } else {
        None
    };
    let Some(token) = given else {
        // A resumed run keeps its token: its peers still hold it.
        if made.exists() {
            return Ok(read_token(Some(&made))?.unwrap_or_default());
        }
        anyhow::ensure!(
            !(args.resume && (printed.exists() || bound_before)),
            "the run in {} was started with a cluster token from --token-file or {TOKEN_ENV}, \
             which its peers hold: resume it with the same --token-file or {TOKEN_ENV}",
            dir.display()
        );
        let token = common::link::random_token();
        common::link::write_token(&made, &token)?;
        remove_stale(&printed)?;
        tracing::info!("cluster token written to {}", made.display());
        return Ok(token);
    };
    let print = token_fingerprint(&token);
    match recorded {
        Some(r) if r == print => {}
        Some(_) if args.resume => {
            let from = match &args.token_file {
                Some(f) => f.display().to_string(),
                None => TOKEN_ENV.to_string(),
            };
            let (record, fix, file) = if made.exists() {
                (
                    format!("its token is in {}", made.display()),
                    format!("pass --token-file {}", made.display()),
                    &made,
                )
            } else {
                (
                    format!("{} holds its fingerprint", printed.display()),
                    format!("pass the same token by --token-file or {TOKEN_ENV}"),
                    &printed,
                )
            };
            anyhow::bail!(
                "the cluster token in {from} is not the one the run in {} was started with, \
                 which its peers hold ({record}): {fix}; or, to change the token, remove {} \
                 and restart every peer with the new one",
                dir.display(),
                file.display()
            );
        }
        // A new run, or one that kept no record of its token yet.
        _ => {
            common::fs::write_private(&printed, format!("{print}\n").as_bytes())?;
            remove_stale(&made)?;
        }
    }
    Ok(token)
}

/// Removes a file that no longer holds for the run, if it is there.
fn remove_stale(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn generate(args: GenerateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    let dir = args.out.unwrap_or_else(|| cfg.data.dir.clone());
    let g = crate::data::generate(&cfg, &dir).with_context(|| match &cfg.data.pool {
        Some(pool) => format!(
            "generating data in {} from the tables of data.pool = {}",
            dir.display(),
            pool.display()
        ),
        None => format!("generating data in {}", dir.display()),
    })?;
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
    let mut methods =
        Method::parse_list(&args.methods).map_err(|e| anyhow::anyhow!("--methods: {e}"))?;
    // Without --checkpoint, `policy` is the shipped pre-trained model's.
    let checkpoint = match &args.checkpoint {
        Some(run) => Some(run.clone()),
        None if methods.contains(&Method::Policy) => Some(default_model().map_err(|e| {
            anyhow::anyhow!("--methods: `policy` needs --checkpoint RUN_DIR ({e})")
        })?),
        None if args.methods.trim() == "all" => default_model().ok(),
        None => None,
    };
    let model = match &checkpoint {
        Some(run) => {
            let (_, model) = crate::checkpoint::load_run(run)?;
            if args.methods.trim() == "all" {
                methods.push(Method::Policy);
            }
            tracing::info!("`policy` places with the model in {}", run.display());
            Some(model)
        }
        None => None,
    };
    let suites = args
        .suite
        .iter()
        .map(|p| Suite::load(p, &cfg.memory))
        .collect::<Result<Vec<_>, _>>()?;
    // `search` measures its budget of plans per task: cheap on `sim`, a
    // real measurement each on the others (said when it comes to more than
    // a thousand).
    let tasks: usize = suites.iter().map(|s| s.tasks.len()).sum();
    if args.backend != benchworker::Backend::Sim
        && methods.contains(&Method::Search)
        && cfg.eval.search_budget * tasks > 1000
    {
        tracing::warn!(
            "`search` measures eval.search_budget = {} plans per task on the {} backend: \
             about {} measurements for {tasks} tasks (a cpu measurement of 50 tables on 4 \
             devices takes about 0.65 s); lower it with --search-budget (scripts/launch.sh \
             --backend cpu uses 20)",
            cfg.eval.search_budget,
            args.backend.name(),
            cfg.eval.search_budget * tasks
        );
    }
    let mut oracle = benchworker::build(args.backend, &cfg)?;
    let batch = match args.backend {
        benchworker::Backend::Sim => cfg.sim.batch,
        benchworker::Backend::Cpu => cfg.cpu.batch,
        benchworker::Backend::Cuda => cfg.cuda.batch,
    };
    // The shapes the model was trained on, to warn about suites far from
    // them when the policy is evaluated.
    let shapes = checkpoint
        .as_deref()
        .filter(|_| methods.contains(&Method::Policy))
        .and_then(TrainedShapes::read);
    let mut nothing_measured = Vec::new();
    for suite in &suites {
        if let Some(shapes) = &shapes {
            let far: Vec<String> = suite
                .tasks
                .iter()
                .filter_map(|t| shapes.outside(t.tables.len(), t.devices))
                .collect();
            if let Some(first) = far.first() {
                tracing::warn!(
                    "{}: {} of its {} tasks lie far outside what the model was trained on \
                     (the first: {first}), where the policy can lose to the heuristics; {}",
                    suite.path.display(),
                    far.len(),
                    suite.tasks.len(),
                    TrainedShapes::ADVICE
                );
            }
        }
        let bar = progress(suite.tasks.len() as u64, &suite.path.display().to_string());
        let report: Result<Report, _> = evaluate(
            suite,
            &methods,
            oracle.as_mut(),
            &crate::eval::Setting {
                mem: &cfg.memory,
                cfg: &cfg.eval,
                batch,
                model: model.as_ref(),
                shapes: shapes.as_ref(),
            },
            || bar.inc(1),
        );
        bar.finish_and_clear();
        // The oracle failed every measurement of this suite: said, and the
        // other suites still evaluated.
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("evaluating {}: {e}", suite.path.display());
                nothing_measured.push(format!("{} (the oracle: {e})", suite.path.display()));
                continue;
            }
        };
        if args.json {
            serde_json::to_writer(&mut *out, &report)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{report}")?;
        }
        let measured = |m: &crate::eval::MethodResult| m.per_task_ms.iter().any(Option::is_some);
        if !report.methods.values().any(measured) {
            nothing_measured.push(suite.path.display().to_string());
        }
    }
    // A table of failures only is no result: a script must not take it
    // for one.
    if !nothing_measured.is_empty() {
        anyhow::bail!(
            "nothing was measured on {}: no method asked for found a plan that fits memory \
             on any of its tasks, or the oracle failed every measurement",
            nothing_measured.join(", ")
        );
    }
    Ok(())
}

/// Training's progress bar (policy updates), with the key figures as its
/// message; hidden when stderr is not a terminal.
fn train_progress(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "training [{bar:30}] {pos}/{len} updates, {elapsed} (eta {eta}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_runs_metrics_keep_their_lines_and_give_the_last_ones_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let lines = [
            r#"{"step":1,"elapsed_s":0.5}"#,
            r#"{"step":2,"elapsed_s":1.25}"#,
            "torn",
            r#"{"step":3,"elapsed_s":2.0}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        assert_eq!(keep_metrics_until(&path, 2).unwrap(), 1.25);
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(kept, format!("{}\n{}\n", lines[0], lines[1]));
        assert_eq!(keep_metrics_until(&path, 0).unwrap(), 0.0);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        // No file yet: nothing kept, the clock at zero.
        let none = dir.path().join("none.jsonl");
        assert_eq!(keep_metrics_until(&none, 5).unwrap(), 0.0);
    }

    #[test]
    fn pretrains_help_does_not_offer_the_init_it_refuses() {
        use clap::CommandFactory;
        let help = |name: &str| {
            let mut cmd = Cli::command();
            let sub = cmd.find_subcommand_mut(name).unwrap();
            sub.render_long_help().to_string()
        };
        assert!(help("train").contains("--init <RUN>"));
        assert!(!help("pretrain").contains("--init <RUN>"));
        // Still parsed, so that pretrain can say why it refuses it.
        assert!(
            Cli::try_parse_from(["learner", "pretrain", "--init", "x", "--run-dir", "r"]).is_ok()
        );
    }
}
