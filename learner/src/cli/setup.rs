//! `learner train`'s setup: the command line and the configuration
//! resolved once into what the run does, checked before anything is
//! written.

use std::path::Path;

use anyhow::Context;
use common::config::{Backend, Config};
use common::Task;
use model::Model;

use super::TrainArgs;
use crate::run::{RunDir, Start};
use crate::runlock::RunLock;

/// What `learner train` runs, resolved once from the command line and the
/// configuration, and validated.
pub(super) struct TrainSetup {
    pub run: RunDir,
    pub start: Start,
    /// The run's configuration: the file's (a resumed run's own), with
    /// the command line's threads, the initial networks' `[model]` and the
    /// backend written in.
    pub cfg: Config,
    /// The networks a new run starts from (`train.init`).
    pub init: Option<Model>,
    pub tasks: Vec<Task>,
    pub backend: Backend,
    /// Threads alone, no remote peers: Algorithm 1 in this thread.
    pub alone: bool,
    /// The cluster token peers must present (none for a run alone).
    pub token: Option<String>,
    /// Held until training ends.
    _lock: RunLock,
}

impl TrainSetup {
    /// Resolves `args` with the configuration `given` (else `--config`'s;
    /// a resumed run's own `config.toml` in any case). Takes the run's
    /// lock, makes its folder and records its backend; writes nothing else.
    pub fn resolve(args: &TrainArgs, given: Option<Config>) -> anyhow::Result<TrainSetup> {
        let run = RunDir::new(&args.run_dir);
        let dir = run.path();
        // One learner per run directory, from before its state is read
        // until training ends; a folder not there yet is locked once made.
        let early_lock = dir.is_dir().then(|| RunLock::take(dir)).transpose()?;
        let start = run.start(args.resume)?;
        let mut cfg = match start {
            Start::Resume => {
                if args.config.is_some() {
                    tracing::warn!("--resume uses the run's own config.toml; --config is ignored");
                }
                Config::load_run(&run.config())?
            }
            Start::Fresh => match given {
                Some(cfg) => cfg,
                None => Config::load(args.config.as_deref())?,
            },
        };
        let init = apply_init(args, start, &mut cfg)?;
        if let Some(n) = args.measurements {
            anyhow::ensure!(
                start == Start::Fresh,
                "--measurements sets a new run's budget; a resumed run keeps the one in its \
                 config.toml (drop --measurements)"
            );
            cfg.train.measure_per_iteration = per_round(n, cfg.train.iterations)?;
            let t = &cfg.train;
            tracing::info!(
                "measuring {n} plans, {} in each of {} rounds; {} of a round's are the \
                 model's own pick (train.measure_greedy_share = {})",
                t.measure_per_iteration,
                t.iterations,
                t.greedy_picks(),
                t.measure_greedy_share
            );
        }
        if let Some(seed) = args.seed {
            anyhow::ensure!(
                start == Start::Fresh,
                "--seed sets a new run's seed; a resumed run keeps the one in its config.toml \
                 (drop --seed)"
            );
            cfg.train.seed = seed as u64;
        }
        // The threads asked for are part of the run: written to its
        // config.toml, so that a resume runs the same way unless told
        // otherwise.
        if let Some(a) = args.actors {
            cfg.cluster.actors = a;
        }
        if let Some(b) = args.benchworkers {
            cfg.cluster.benchworkers = b;
        }
        cfg.validate().map_err(|message| {
            anyhow::anyhow!("the configuration with the command line's settings: {message}")
        })?;
        let alone = alone(args, &cfg, &run)?;
        let tasks = crate::data::train_tasks(&cfg)?;
        if !alone {
            check_peers(&tasks, &cfg)?;
        }
        let backend = run.backend(&cfg, args.backend, start)?;
        cfg.cluster.backend = Some(backend);
        common::fs::create_dir_durable(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let lock = match early_lock {
            Some(lock) => lock,
            None => RunLock::take(dir)?,
        };
        // A run alone has no peer: no token is read or made.
        let token = match alone {
            true => None,
            false => Some(cluster_token(args, &run, run.was_bound())?),
        };
        Ok(TrainSetup {
            run,
            start,
            cfg,
            init,
            tasks,
            backend,
            alone,
            token,
            _lock: lock,
        })
    }
}

/// `--init` into `cfg` (a new run only), and the networks of `train.init`
/// with their layer sizes: its `[model]` section replaces `cfg`'s (a
/// resumed run's config.toml holds it already).
fn apply_init(args: &TrainArgs, start: Start, cfg: &mut Config) -> anyhow::Result<Option<Model>> {
    if let Some(init) = &args.init {
        anyhow::ensure!(
            start == Start::Fresh,
            "--init starts a new run from a trained one; a resumed run already has its \
             networks (drop --init)"
        );
        cfg.train.init = Some(init.clone());
    }
    let (Some(path), Start::Fresh) = (&cfg.train.init, start) else {
        return Ok(None);
    };
    let (init_cfg, model) = crate::checkpoint::load_init(path)?;
    if init_cfg.model != cfg.model {
        tracing::info!(
            "the [model] section of {} replaces the configuration's (its weights have \
             its layer sizes)",
            path.display()
        );
    }
    cfg.model = init_cfg.model;
    Ok(Some(model))
}

/// Plans per round for a budget of `n` over `rounds` rounds; refuses a
/// budget that does not split evenly, naming the nearest ones that do.
fn per_round(n: usize, rounds: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(
        rounds > 0,
        "train.iterations is 0: there is no round to measure in"
    );
    anyhow::ensure!(
        n >= rounds,
        "--measurements {n} is fewer than the {rounds} rounds of train.iterations: give at \
         least {rounds} (one plan a round), or lower train.iterations"
    );
    if n % rounds != 0 {
        let lower = n / rounds * rounds;
        let nearest = match n.checked_next_multiple_of(rounds) {
            Some(upper) => format!("{lower} or {upper}"),
            None => lower.to_string(),
        };
        anyhow::bail!(
            "--measurements {n} does not split evenly over the {rounds} rounds of \
             train.iterations: give {nearest}, or set train.iterations to a divisor of {n}"
        );
    }
    Ok(n / rounds)
}

/// Whether a cluster run's peers can start: actors can roll out its
/// training `tasks` and their copies (see [`crate::data::rollout_tasks`]),
/// and the welcome and the networks' weights fit a message. An actor
/// refuses a task it cannot roll out, and the learner would wait for its
/// unrolls until the stall timeout; a message too big reaches no peer.
/// The learner asks before it makes the run folder.
pub(super) fn check_peers(tasks: &[Task], cfg: &Config) -> anyhow::Result<()> {
    let rollout = crate::data::rollout_tasks(tasks, cfg);
    actor::worker::check_rollout_tasks(&rollout, cfg.train.episodes).map_err(|e| {
        anyhow::anyhow!(
            "actors cannot roll out this run's tasks: {e}. A run alone (--actors 0 \
             --benchworkers 0, no --bind) sends no unrolls"
        )
    })?;
    // The weights' size depends on the layer sizes alone: fresh networks
    // of the run's [model] weigh what its own will.
    crate::runtime::welcome_config(cfg, &rollout, &model::Model::new(cfg)).map_err(|e| {
        anyhow::anyhow!(
            "no peer could join this run: {e:#}. A run alone (--actors 0 --benchworkers 0, \
             no --bind) sends no messages"
        )
    })?;
    Ok(())
}

/// Whether the run has peers: actor or benchworker threads, or `--bind`
/// (the command line's counts over the configuration's).
pub(super) fn has_peers(args: &TrainArgs, cfg: &Config) -> bool {
    let actors = args.actors.unwrap_or(cfg.cluster.actors);
    let benchworkers = args.benchworkers.unwrap_or(cfg.cluster.benchworkers);
    actors > 0 || benchworkers > 0 || args.bind.is_some()
}

/// Whether the run trains alone in this thread (no actor or benchworker
/// thread, no `--bind`); refuses a mix, and a cluster run resumed without
/// its peers.
fn alone(args: &TrainArgs, cfg: &Config, run: &RunDir) -> anyhow::Result<bool> {
    let (actors, benchworkers) = (cfg.cluster.actors, cfg.cluster.benchworkers);
    let alone = !has_peers(args, cfg);
    anyhow::ensure!(
        alone || args.bind.is_some() || (actors > 0 && benchworkers > 0),
        "without --bind, training needs at least one actor and one benchworker thread \
         (or neither, to run in one thread); got {actors} and {benchworkers}"
    );
    // A cluster run's peers are processes: resumed without --bind, it
    // would go on in one thread while they wait for their learner.
    let dir = run.path().display();
    anyhow::ensure!(
        !(args.resume && alone && run.was_bound()),
        "{dir} is a cluster run (its learner listened for actor and benchworker processes): \
         resume it with `scripts/launch.sh --resume {dir}` or `learner train --run-dir {dir} \
         --resume --bind ENDPOINT`, or give --actors N --benchworkers M to go on with threads"
    );
    Ok(alone)
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
fn cluster_token(args: &TrainArgs, run: &RunDir, bound_before: bool) -> anyhow::Result<String> {
    use net::link::{read_token, token_fingerprint, TOKEN_ENV};
    let given = read_token(args.token_file.as_deref())?;
    if args.bind.is_none() {
        // Threads alone: they start and stop with the learner.
        return Ok(given.unwrap_or_else(net::link::random_token));
    }
    let dir = run.path();
    let (made, printed) = (run.token(), run.token_fingerprint());
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
        let token = net::link::random_token();
        net::link::write_token(&made, &token)?;
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
