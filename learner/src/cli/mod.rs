//! The `learner` command line: its arguments here, each command in its
//! own module.

mod eval;
mod plan;
mod pretrain;
mod setup;
mod train;

pub use plan::default_model;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

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
    /// Print the resolved configuration (defaults filled in, validated) as
    /// TOML: a --config file's, a run's (--run), or the defaults.
    ///
    /// Examples:
    ///
    ///   learner config --config configs/default.toml
    ///
    ///   learner config --run runs/default
    Config(ConfigArgs),
    /// Write a run's report: one self-contained HTML file (charts inline,
    /// nothing fetched) with the learning curves, every measured plan, the
    /// per-device cost of the last one split into compute and
    /// communication, and the run's evaluations.
    ///
    /// Example:
    ///
    ///   learner report runs/default          # writes runs/default/report.html
    Report(ReportArgs),
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
    ///
    ///   learner generate --config configs/default.toml --out data/generated
    Generate(GenerateArgs),
    /// Compare placement methods on a suite.
    ///
    /// For every task of the suite, every method places the tables and the
    /// oracle measures the plan. Prints per method the mean cost (ms) over
    /// the tasks it solved, the tasks it failed (no memory-feasible plan, or
    /// a plan the oracle failed to measure: a warning says why, and the
    /// other tasks stand) and its cost relative to the best heuristic. A
    /// task whose tables need more memory than all its devices hold
    /// together is a fault of the suite file: it is refused, named, before
    /// anything is placed.
    ///
    /// Example:
    ///
    ///   learner eval --suite data/generated/dlrm-50x4.test.json --methods all --backend sim
    ///
    /// On the `cpu` backend a measurement takes about a second: give `search`
    /// a small budget (--search-budget 20).
    Eval(EvalArgs),
    /// Train the cost and policy networks (DreamShard's Algorithm 1, asynchronous).
    ///
    /// Measures plans drawn from the current policy on the oracle, fits the
    /// cost network to them, and improves the policy on the estimated MDP
    /// with V-trace or REINFORCE (train.update). Actors roll out episodes
    /// and benchworkers measure plans: as threads of this process
    /// (--actors, --benchworkers), and as processes on any host that
    /// connect to --bind (`actor run`,
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
    ///
    ///   learner train --config configs/default.toml --run-dir runs/first
    ///
    /// Example, a learner that processes join (scripts/launch.sh starts them):
    ///
    ///   learner train --config configs/default.toml --run-dir runs/big --bind tcp://10.0.0.5:5555 --actors 0 --benchworkers 0
    // --threads is pretrain's (refused here): not shown.
    #[command(mut_arg("threads", |a| a.hide(true)))]
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
    /// tasks from stage 1's networks (the same options: --actors,
    /// --benchworkers, --bind, --resume). The result is a run folder that
    /// `plan`, `eval` and `train --init` take; the shipped one is
    /// models/pretrained (README).
    ///
    /// Example:
    ///
    ///   learner pretrain --config configs/pretrain.toml --run-dir models/pretrained
    // Pre-training starts from fresh networks with its own seed: --init and
    // --seed (refused) are not shown.
    #[command(mut_arg("init", |a| a.hide(true)), mut_arg("seed", |a| a.hide(true)))]
    Pretrain(TrainArgs),
    /// Place your tables with a trained model, in milliseconds, without a GPU.
    ///
    /// Reads a pool CSV (`name,rows,dim` is enough: missing columns take the
    /// defaults a warning names), places every table on one of --devices
    /// devices of --memory-gb each with a trained model (the shipped
    /// pre-trained one, models/pretrained, unless --checkpoint names
    /// another), and writes the placement JSON with the cost network's
    /// estimate of each device's times. With --format torchrec it writes
    /// `{"world_size": D, "ranks": {table: rank}}` for TorchRec's table-wise
    /// sharding (see README). A summary per device goes to stderr.
    ///
    /// The heuristics' plans always compete with the learned one. Where the
    /// cost-network members disagree, plan returns the heuristic plan the
    /// network ranks best (by its worst member's prediction). Where a table
    /// feature lies outside what the model was trained on, it returns
    /// torchrec's plan, unless every member predicts the heuristic plan it
    /// ranks best 2 % cheaper. The shipped model's learned plan must also
    /// be predicted 2 % cheaper by a second cost network trained apart, 4 %
    /// where no table has reuse bins of its own (a `name,rows,dim` CSV)
    /// (--no-second-opinion: without). A warning says why. A learned plan predicted
    /// under 6 % cheaper than the best heuristic's is a narrow win: a
    /// warning suggests measuring.
    /// --verify BACKEND measures every candidate, with the other ends of the
    /// learned plan's searches, and returns the measured best.
    /// --run given twice places with two runs trained apart: steadier plans
    /// on shapes the runs did not train on.
    ///
    /// Examples:
    ///
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16
    ///
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16 --compare --verify sim
    ///
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16 --method torchrec
    ///
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16 --checkpoint runs/first --verify sim
    ///
    ///   learner plan --tables my_tables.csv --devices 8 --memory-gb 16 --run runs/seed0 --run runs/seed1
    Plan(PlanArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    /// {"devices", "assignment": [{"table", "device"}], "estimate": {…},
    /// "method", "candidates", "doubts", "narrow_win"} (docs/cluster.md,
    /// "Placement JSON")
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
    #[arg(long, allow_negative_numbers = true, value_parser = at_least_one)]
    pub devices: usize,
    /// Memory per device, GiB (2^30 bytes), for weights and optimizer
    /// state.
    #[arg(long, allow_negative_numbers = true)]
    pub memory_gb: f64,
    /// Weight precision on the devices: fp16 or fp32 (default: the model's
    /// `[memory] precision`, fp16 for the shipped model). It counts memory,
    /// and --verify's oracle and torchrec's estimator use it too; the cost
    /// network learned its costs at its own precision.
    #[arg(long, value_name = "fp16|fp32")]
    pub precision: Option<common::Precision>,
    /// Optimizer whose state sits beside the weights: sgd, rowwise_adagrad,
    /// adagrad or adam (default: the model's `[memory] optimizer`,
    /// rowwise_adagrad for the shipped model). It counts memory, and
    /// --verify's oracle uses it too.
    #[arg(long, value_name = "NAME")]
    pub optimizer: Option<common::Optimizer>,
    /// Run directory of a trained model (default: the shipped pre-trained
    /// model, models/pretrained). --checkpoint is the same. Repeat it, or
    /// give several folders after it (`--run runs/seed*`), to place with
    /// runs trained apart (other train.seed values): each run's guard
    /// chooses, and all their cost networks judge between the choices.
    /// Two runs give steadier plans than one on shapes not trained on,
    /// for twice the training.
    #[arg(long = "run", visible_alias = "checkpoint", value_name = "DIR", num_args = 1..)]
    pub checkpoint: Vec<PathBuf>,
    /// Measure the final candidates (the learned plan, the other ends of its
    /// searches, the heuristics' plans) on this oracle and return the
    /// measured best, printing its measured cost against the best
    /// heuristic's (negative: faster):
    /// `sim` and `cpu` run in this process (`cuda` on a GPU host built with
    /// the cuda feature).
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub verify: Option<benchworker::Backend>,
    /// Follow the run's own cost network alone. By default a run that
    /// ships a second opinion (DIR/second-opinion/, as the shipped model
    /// does) returns its learned plan only where that network, trained
    /// apart with another architecture, also predicts it 2 % cheaper
    /// than the best heuristic's (`model.plan_margin`; 4 % where no table
    /// has reuse bins of its own, `model.plan_margin_default_bins`); else
    /// it returns that heuristic's plan, and a warning says so.
    #[arg(long)]
    pub no_second_opinion: bool,

    /// Predicted plans each of the learned plan's searches on the cost
    /// network may spend (default: the run's `model.plan_search`, 2000
    /// for the shipped model and the main job; 0 or 1: no search). The
    /// searches take most of the time: for 200 tables on 8 devices, 4000
    /// took 1.5 times as long as 2000, and 8000 2.5 times. On the main
    /// job's runs 4000 gained 0.3 to 0.7 points against the best heuristic
    /// on the DLRM-like test suites; far from the shapes a model trained
    /// on, a longer search can gain nothing (docs/results.md, "A longer
    /// search when there is time").
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole)]
    pub plan_search: Option<usize>,
    /// What places the tables: `policy` (the trained model, guarded by
    /// the heuristics' plans), a heuristic (random, round_robin, size, dim,
    /// lookup, size_lookup, torchrec), or `search` (local search measured on
    /// --verify's oracle, else `sim`, from the policy's plan).
    #[arg(long, value_parser = parse_method, default_value = "policy")]
    pub method: model::baselines::Method,
    /// Also print every candidate (the learned plan and the heuristics')
    /// beside the chosen one on stderr: predicted, and measured with
    /// --verify.
    #[arg(long)]
    pub compare: bool,
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

impl TrainArgs {
    /// Sets `run_dir` and `resume` from `--run-dir DIR`, `--resume DIR` or
    /// both (`--run-dir DIR --resume`), refusing two runs or none.
    fn resolve(&mut self) -> anyhow::Result<()> {
        let resume = self.resume_arg.take();
        self.resume = resume.is_some();
        let given = resume.filter(|p| !p.is_empty()).map(PathBuf::from);
        self.run_dir = match (self.run_dir_arg.take(), given) {
            (Some(a), Some(b)) if a != b => anyhow::bail!(
                "--run-dir {} and --resume {} name two runs: give one",
                a.display(),
                b.display()
            ),
            (Some(dir), _) | (None, Some(dir)) => dir,
            (None, None) => anyhow::bail!(
                "which run? give --run-dir DIR (a new run), or --resume DIR to continue one"
            ),
        };
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The run's folder.
    pub run: PathBuf,
    /// Where the HTML goes (default: RUN/report.html).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// Configuration TOML; defaults when omitted.
    #[arg(long, conflicts_with = "run")]
    pub config: Option<PathBuf>,
    /// A run's folder: its config.toml, what it trains with.
    #[arg(long, value_name = "DIR")]
    pub run: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Configuration TOML (its train, model, … sections); defaults when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run directory: configuration, metrics and checkpoint go there.
    #[arg(long = "run-dir", value_name = "DIR")]
    run_dir_arg: Option<PathBuf>,
    /// The oracle that measures plans (default: the config's
    /// cluster.backend, else sim; a resumed run, the one it measured with,
    /// recorded in its config.toml).
    #[arg(long, value_enum)]
    pub backend: Option<benchworker::Backend>,
    /// Continue the run in DIR (or --run-dir) from its newest intact
    /// checkpoint, with its own config.toml and every measurement of its
    /// cost-buffer log (a run stopped before its first checkpoint: fresh
    /// networks, trained on those measurements).
    #[arg(
        long = "resume",
        value_name = "DIR",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    resume_arg: Option<String>,
    /// The run's folder, from --run-dir or --resume DIR.
    #[arg(skip)]
    pub run_dir: PathBuf,
    /// Whether the run goes on (--resume).
    #[arg(skip)]
    pub resume: bool,
    /// Also accept actors and benchworkers at this ZeroMQ endpoint, e.g.
    /// tcp://127.0.0.1:5555 (port 0: any free port). Each connection must
    /// give the cluster token at its handshake (ZeroMQ PLAIN), where the
    /// token travels in clear: bind a non-loopback address only on a
    /// network you trust. The endpoint bound is written to DIR/endpoint.
    #[arg(long)]
    pub bind: Option<String>,
    /// Serve a live status page at this port (on 127.0.0.1) or address
    /// (0.0.0.0:8080 for every interface): `/` the curves and the peers,
    /// `/status` JSON, `/metrics` for Prometheus. Off by default; its URL
    /// is written to DIR/status.
    #[arg(long, value_name = "PORT|ADDR")]
    pub status: Option<String>,
    /// Actor threads beside the learner (default: the config's cluster.actors).
    /// A new run keeps them in its config.toml, so --resume runs as many;
    /// given with --resume, they hold for that session.
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub actors: Option<usize>,
    /// Benchworker threads beside the learner (default: cluster.benchworkers;
    /// kept like --actors).
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
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
    /// The measurement budget: N plans measured in all, N / iterations in
    /// each of the train.iterations rounds (it sets
    /// train.measure_per_iteration). N must be a multiple of
    /// train.iterations (20 in configs/default.toml). Fewer measurements
    /// mean fewer plans a round, not fewer rounds: the rounds' cost and
    /// policy steps learn from them. A new run only; not for pretrain.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = at_least_one)]
    pub measurements: Option<usize>,
    /// The run's seed (it sets train.seed): runs of other seeds learn
    /// apart, and `learner plan --run A --run B` places with two together.
    /// A new run only; not for pretrain (pretrain.seed).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole)]
    pub seed: Option<usize>,
    /// libtorch threads for pretrain's stage 1, its cost-network steps
    /// (default: every core this process may use; `taskset` and cgroup
    /// limits count). Two pre-trainings on the same cores
    /// each take them all and slow each other several times over: give
    /// each its share. Not for train: its learner and its actor and
    /// benchworker threads use one libtorch thread each.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = at_least_one)]
    pub threads: Option<usize>,
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
    /// Suite JSON; repeat the flag, or give several files after it
    /// (`--suite data/generated/*.test.json`), to evaluate several suites.
    #[arg(long, required = true, num_args = 1..)]
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
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub search_budget: Option<usize>,
    /// Print JSON instead of a table: one object per suite, one per line.
    #[arg(long)]
    pub json: bool,
    /// Run directory of a trained model: adds the method `policy`, which
    /// is what `learner plan` returns (its network sizes come from the
    /// run's config.toml). Without it, `policy` (and `all`) use the shipped
    /// pre-trained model, models/pretrained. --checkpoint is the same.
    /// Repeat it, or give several folders after it, to evaluate runs
    /// placing together, as `learner plan --run A --run B` does (the
    /// results are then not saved into a run).
    #[arg(long = "run", visible_alias = "checkpoint", value_name = "DIR", num_args = 1..)]
    pub checkpoint: Vec<PathBuf>,
    /// Predicted plans each of `policy`'s searches on the cost network may
    /// spend, as `learner plan --plan-search` (default: the run's
    /// `model.plan_search`). Results with another value than the run's
    /// are not saved into it.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole)]
    pub plan_search: Option<usize>,
    /// `policy` follows the run's own cost network alone, without the
    /// second opinion it ships (as `learner plan --no-second-opinion`).
    /// The results are then not saved into the run.
    #[arg(long)]
    pub no_second_opinion: bool,
    /// `policy` places as `learner plan --verify BACKEND` does, BACKEND
    /// being --backend: it measures its candidates (the plans of
    /// `lookup`, `size_lookup`, `torchrec`, `dim` and `size`, its learned
    /// plan and the other ends of its searches; one measurement per
    /// distinct plan) and returns the measured best, which is then measured once
    /// more like every method's plan. On `cpu` and `cuda` each is a real
    /// timing. The results are not saved into the run.
    #[arg(long)]
    pub verify: bool,
}

/// Runs a parsed command, writing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Config(args) => {
            let cfg = match &args.run {
                Some(run) => {
                    crate::run::RunDir::ensure_holds_run(run)?;
                    common::config::Config::load_run(&run.join(crate::run::RunDir::CONFIG))?
                }
                None => common::config::Config::load(args.config.as_deref())?,
            };
            write!(out, "{}", toml::to_string_pretty(&cfg)?)?;
            Ok(())
        }
        Command::Report(args) => {
            let html = crate::report::render(&args.run)?;
            let path = args.out.unwrap_or_else(|| args.run.join("report.html"));
            common::fs::write_atomic(&path, html.as_bytes())?;
            writeln!(out, "{}", path.display())?;
            Ok(())
        }
        Command::Generate(args) => eval::generate(args, out),
        Command::Eval(args) => eval::eval(args, out),
        Command::Train(mut args) => {
            anyhow::ensure!(
                args.threads.is_none(),
                "--threads sets pretrain's stage 1; train's learner and its actor and \
                 benchworker threads use one libtorch thread each: drop --threads"
            );
            args.resolve()?;
            train::train(args, out)
        }
        Command::Pretrain(mut args) => {
            args.resolve()?;
            pretrain::pretrain(args, out)
        }
        Command::Plan(args) => plan::plan(args, out),
    }
}

/// What `--plan-search N` does, beside the runs' own `model.plan_search`.
fn plan_search_note(n: usize, own: &[usize]) -> String {
    let own: Vec<String> = own.iter().map(usize::to_string).collect();
    let own = match own.as_slice() {
        [one] => format!("the run's own: {one}"),
        _ => format!("the runs' own: {}", own.join(", ")),
    };
    match n {
        0 | 1 => format!(
            "--plan-search {n}: `plan` runs no local search on the cost network; it keeps the \
             cheapest predicted of the policy's episodes and the heuristics' plans ({own})"
        ),
        _ => {
            // The time grows with the budget: 2000 takes milliseconds for
            // 200 tables on 8 devices, and 8000 two and a half times as long.
            let slow = if n > LONG_PLAN_SEARCH {
                "; so long a search can take seconds or more on a large task"
            } else {
                ""
            };
            format!(
                "--plan-search {n}: each of `plan`'s searches predicts up to {n} plans \
                 ({own}){slow}"
            )
        }
    }
}

/// A search budget past which `plan_search_note` warns of the time.
const LONG_PLAN_SEARCH: usize = 100_000;

/// A whole number (0 or more) from the command line. Clap alone would
/// read `-2` as a flag; this names it as a negative number.
fn whole(s: &str) -> Result<usize, String> {
    at_least(s, 0)
}

/// A whole number of at least 1 from the command line.
fn at_least_one(s: &str) -> Result<usize, String> {
    at_least(s, 1)
}

/// A whole number of at least `min`, read wide enough that a negative
/// one is named as such.
fn at_least(s: &str, min: usize) -> Result<usize, String> {
    let n: i128 = (s.trim().parse()).map_err(|e| format!("not a whole number: {e}"))?;
    if n < min as i128 {
        return Err(format!("must be {min} or more"));
    }
    usize::try_from(n).map_err(|_| format!("must be at most {}", usize::MAX))
}

/// One placement method by name (`--method`); the message lists the
/// names it takes.
fn parse_method(s: &str) -> Result<model::baselines::Method, String> {
    use model::baselines::Method;
    let name = s.trim();
    let methods = || Method::ALL.into_iter().chain([Method::Policy]);
    methods().find(|m| m.name() == name).ok_or_else(|| {
        let known: Vec<&str> = methods().map(|m| m.name()).collect();
        let what = match name.contains(',') || name == "all" {
            true => "one method, not a list",
            false => "unknown method",
        };
        format!("`{name}`: {what}; give one of {}", known.join(", "))
    })
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

    /// Every example in a subcommand's --help stands on a line of its own,
    /// so that it can be copied (--help joins the lines of a paragraph).
    #[test]
    fn each_example_of_help_is_a_line_of_its_own() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        for sub in cli.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            let starts = help.matches(&format!("learner {name} ")).count();
            let lines = help
                .lines()
                .filter(|l| l.trim_start().starts_with(&format!("learner {name} ")))
                .count();
            assert_eq!(
                starts, lines,
                "an example of `{name}` shares a line:\n{help}"
            );
        }
    }

    /// `--run-dir DIR`, `--resume DIR` and `--run-dir DIR --resume` name
    /// the run; two different runs, or none, are refused.
    #[test]
    fn the_run_comes_from_run_dir_or_resume() {
        let train = |argv: &[&str]| -> anyhow::Result<(PathBuf, bool)> {
            let all = ["learner", "train"].iter().chain(argv);
            let Command::Train(mut a) = Cli::try_parse_from(all)?.command else {
                unreachable!()
            };
            a.resolve()?;
            Ok((a.run_dir, a.resume))
        };
        let r = |s: &str| PathBuf::from(s);
        assert_eq!(train(&["--run-dir", "a"]).unwrap(), (r("a"), false));
        assert_eq!(train(&["--resume", "a"]).unwrap(), (r("a"), true));
        assert_eq!(
            train(&["--run-dir", "a", "--resume"]).unwrap(),
            (r("a"), true)
        );
        assert_eq!(
            train(&["--resume", "--run-dir", "a"]).unwrap(),
            (r("a"), true)
        );
        assert_eq!(
            train(&["--run-dir", "a", "--resume", "a"]).unwrap(),
            (r("a"), true)
        );
        let e = train(&["--run-dir", "a", "--resume", "b"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("name two runs"), "{e}");
        for argv in [&[][..], &["--resume"]] {
            let e = train(argv).unwrap_err().to_string();
            assert!(e.contains("which run?"), "{e}");
        }
        // plan and eval take --run, and --checkpoint as before; several
        // runs: each flag adds one, in order.
        let argv = [
            "learner",
            "plan",
            "--tables",
            "t.csv",
            "--devices",
            "2",
            "--memory-gb",
            "1",
        ];
        let plan = |more: &[&'static str]| {
            let cli = Cli::try_parse_from(argv.iter().chain(more).copied()).unwrap();
            let Command::Plan(p) = cli.command else {
                unreachable!()
            };
            p
        };
        for flag in ["--run", "--checkpoint"] {
            assert_eq!(plan(&[flag, "r"]).checkpoint, vec![r("r")]);
        }
        let p = plan(&["--run", "a", "--checkpoint", "b"]);
        assert_eq!(p.checkpoint, vec![r("a"), r("b")]);
        // Several after one flag, as a shell glob gives them; the next
        // flag still ends the list.
        let p = plan(&["--run", "a", "b", "--checkpoint", "c"]);
        assert_eq!(p.checkpoint, vec![r("a"), r("b"), r("c")]);
        let cli = Cli::try_parse_from([
            "learner", "eval", "--suite", "x.json", "y.json", "--run", "a", "b", "--json",
        ])
        .unwrap();
        let Command::Eval(e) = cli.command else {
            unreachable!()
        };
        assert_eq!(e.suite, vec![r("x.json"), r("y.json")]);
        assert_eq!(e.checkpoint, vec![r("a"), r("b")]);
        assert!(e.json);
        assert!(
            Cli::try_parse_from(argv.iter().chain(&["--run"]).copied()).is_err(),
            "--run needs a folder"
        );
    }
}
