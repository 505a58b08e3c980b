//! `learner train`: a run set up ([`super::setup`]), its trainer fresh or
//! resumed, rounds until done or stopped, and what it did.

use std::cell::Cell;
use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use common::config::Config;

use super::setup::TrainSetup;
use super::{train_progress, TrainArgs};
use crate::checkpoint;
use crate::costlog::CostLog;
use crate::run::{RunDir, Start};
use crate::train::{Hooks, Metrics, Trainer};
use model::loss::CostSample;
use model::shapes::TrainedShapes;

pub(super) fn train(args: TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    train_with(args, None, Vec::new(), out)
}

/// When a session's first and latest policy updates came, with the env
/// steps then.
type Updates = Cell<Option<((Instant, u64), (Instant, u64))>>;

/// `learner train`, with the configuration already resolved for a new run
/// (`given`, else `--config`'s) and measurements the cost network learns
/// from beside the run's own (`prior`: see [`crate::train::Trainer::prior`]).
pub(super) fn train_with(
    args: TrainArgs,
    given: Option<Config>,
    prior: Vec<CostSample>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut setup = TrainSetup::resolve(&args, given)?;
    // The networks are small: one libtorch thread each for the learner and
    // every actor beats threads that spin against each other for the cores.
    tch::set_num_threads(1);
    // What measures plans and acts, set up before the run's state is
    // touched: a backend that cannot start stops the run here, before
    // training (and its checkpoint on error).
    // The status page, before the run starts so that it shows all of it.
    let status = match &args.status {
        Some(addr) => {
            let total = (setup.cfg.train.iterations * setup.cfg.train.policy_steps) as u64;
            let run_name = setup.run.path().display().to_string();
            let (server, feed) =
                crate::status::serve(crate::status::listen_addr(addr)?, run_name, total)?;
            let url = format!("http://{}/", server.addr);
            tracing::info!("status page at {url}");
            common::fs::write_atomic(
                &setup.run.path().join("status"),
                format!("{url}\n").as_bytes(),
            )?;
            Some((server, feed))
        }
        None => None,
    };
    let feed = status.as_ref().map(|(_, f)| f.clone());
    // A descriptor per remote connection: the common soft limit of 1024
    // is not enough for a learner others connect to.
    if args.bind.is_some() {
        let files = net::link::raise_open_files();
        tracing::debug!("open files allowed: {files:?}");
    }
    let mut workers = if setup.alone {
        Workers::Alone(benchworker::build(setup.backend, &setup.cfg)?)
    } else {
        Workers::Cluster(crate::runtime::ClusterRun {
            bind: args.bind.iter().cloned().collect(),
            token: setup.token.take().unwrap_or_default(),
            actors: setup.cfg.cluster.actors,
            benchworkers: setup.cfg.cluster.benchworkers,
            backend: setup.backend,
            status: feed.clone(),
        })
    };
    // A fine-tuned model is judged by its own training tasks alone:
    // fine-tuning moves the networks toward them and away from what they
    // learned before (docs/results.md, "Fine-tuning").
    if let Some(shapes) = TrainedShapes::of(&setup.tasks) {
        shapes.write(setup.run.path())?;
    }
    let init = setup.init.take();
    let (cfg, run) = (&setup.cfg, &setup.run);
    let mut trainer = match setup.start {
        Start::Resume => resumed_trainer(cfg, &setup.tasks, run, init)?,
        Start::Fresh => {
            run.write_new(cfg)?;
            fresh_trainer(cfg, &setup.tasks, init)?
        }
    };
    trainer.prior = prior;
    let done_at_start = trainer.done();
    if done_at_start {
        tracing::info!(
            "{} has already run all {} iterations (train.iterations): nothing to train; \
             raise train.iterations in its config.toml to train further",
            run.path().display(),
            cfg.train.iterations
        );
    }
    let t = &cfg.train;
    // Ctrl-C (or SIGTERM): finish the update in progress, checkpoint, exit.
    let stop = net::link::stop_on_signal();
    let start = (Instant::now(), trainer.counters.env_steps);
    let learned_at_start = (trainer.counters.policy_updates, trainer.counters.cost_steps);
    // The rate between this session's first and latest policy updates
    // leaves out the start (peers loading libtorch, the first
    // measurements) and the stop (a cluster's grace for its peers), which
    // weigh on a short run.
    let updates: Updates = Cell::new(None);
    let bar = train_progress((t.iterations * t.policy_steps) as u64);
    bar.set_position(trainer.counters.policy_updates as u64);
    let mut began = false;
    let rounds = {
        let mut log = CostLog::open(&run.cost_log())?;
        let mut on_line = metrics_writer(run, cfg, &updates, &bar, feed.as_ref())?;
        let mut hooks = Hooks {
            measured: Box::new(|s| log.append(s)),
            metrics: Box::new(|m| on_line(m)),
            round_done: Box::new(|trainer| {
                if trainer.done() || trainer.counters.iteration % t.checkpoint_every == 0 {
                    save(run, trainer)?;
                }
                Ok(())
            }),
        };
        run_rounds(
            &mut trainer,
            &mut workers,
            &mut hooks,
            &stop,
            run,
            &mut began,
        )
    };
    bar.finish_and_clear();
    let lags = match rounds {
        Ok(lags) => lags,
        // As on Ctrl-C, what was learned is kept (the run's curves and
        // measurements are on disk already); a setup that failed before
        // training began (a port in use) has nothing to add.
        Err(e) if began => return Err(stopped_by(e, &args, run, &trainer, learned_at_start)),
        Err(e) => return Err(e),
    };
    if stop.load(std::sync::atomic::Ordering::Relaxed) && !trainer.done() {
        let at = save(run, &trainer)?;
        tracing::info!(
            "stopped; checkpoint {} written: --resume continues",
            at.display()
        );
    }
    let secs = start.0.elapsed().as_secs_f64();
    let steps = trainer.counters.env_steps - start.1;
    if done_at_start {
        // The counters are the run's, not this session's: say nothing was
        // trained rather than report them as if it had been.
        writeln!(
            out,
            "nothing to train: {} has already run all {} iterations ({} measurements, {} policy \
             updates)",
            run.path().display(),
            trainer.counters.iteration,
            trainer.buffer.len(),
            trainer.counters.policy_updates
        )?;
    } else {
        report(out, &trainer, run, steps, secs, updates.get(), lags)?;
    }
    interrupted(&stop, trainer.done())
}

/// After a stop signal that cut the work short (its checkpoint written):
/// [`common::logging::Interrupted`] with the signal's exit status.
pub(super) fn interrupted(stop: &std::sync::atomic::AtomicBool, done: bool) -> anyhow::Result<()> {
    if done || !stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let status = net::link::stop_signal().unwrap_or(130);
    Err(common::logging::Interrupted(status).into())
}

/// A checkpoint of `trainer` in `run`, with the metrics written so far
/// made durable first.
fn save(run: &RunDir, trainer: &Trainer) -> anyhow::Result<std::path::PathBuf> {
    sync_file(&run.metrics())?;
    checkpoint::save(run.path(), trainer, trainer.config().train.keep_checkpoints)
}

/// The trainer of a resumed run: its newest intact checkpoint and every
/// logged measurement; a run stopped before its first checkpoint starts
/// over from fresh (or `init`'s) networks on its measurements.
fn resumed_trainer<'a>(
    cfg: &'a Config,
    tasks: &'a [common::Task],
    run: &RunDir,
    init: Option<model::Model>,
) -> anyhow::Result<Trainer<'a>> {
    let read = CostLog::read(&run.cost_log())?;
    if read.skipped > 0 {
        tracing::warn!("{} damaged cost-buffer entries skipped", read.skipped);
    }
    if read.duplicates > 0 {
        tracing::warn!(
            "{} duplicated cost-buffer entries read once",
            read.duplicates
        );
    }
    // Before loading: a damaged checkpoint is set aside as it is found.
    let had_checkpoint = run.has_checkpoint();
    let Some(loaded) = checkpoint::load_latest(cfg, run.path())? else {
        anyhow::ensure!(
            !had_checkpoint,
            "every checkpoint in {} is damaged (each set aside as step-….damaged); \
             --resume once more trains fresh networks on the {} logged measurements",
            run.path().display(),
            read.samples.len()
        );
        // Stopped before its first checkpoint: the measurements are what
        // cost the most, so fresh networks start over on them.
        tracing::warn!(
            "no intact checkpoint in {}: training starts over from fresh networks, \
             keeping the {} logged measurements",
            run.path().display(),
            read.samples.len()
        );
        run.keep_metrics_until(0)?;
        let mut t = fresh_trainer(cfg, tasks, init)?;
        t.buffer = read.samples;
        return Ok(t);
    };
    tracing::info!(
        "resuming from {} ({} done, {})",
        loaded.path.display(),
        common::count(loaded.counters.iteration, "round"),
        common::count(read.samples.len(), "measurement")
    );
    // A log with fewer measurements than the checkpoint saw lost some:
    // training on would hide it, and measure again what was measured.
    anyhow::ensure!(
        read.samples.len() >= loaded.counters.measurements,
        "{} holds {}, but checkpoint {} was written after {}: the log was emptied, cut or \
         replaced. Restore it from a backup; or, to train on what is left, move the run's \
         checkpoints/ folder aside and --resume (fresh networks on the measurements logged)",
        run.cost_log().display(),
        common::count(read.samples.len(), "measurement"),
        loaded.path.display(),
        common::count(loaded.counters.measurements, "measurement")
    );
    let (cost_state, policy_state) = checkpoint::split_optimizer(loaded.optimizer);
    let mut counters = loaded.counters;
    let clock = run.keep_metrics_until(counters.policy_updates)?;
    // A checkpoint from before the clock was kept reads 0: its run's curve
    // goes on from its last line.
    counters.training_s = counters.training_s.max(clock);
    let mut t = Trainer::with(cfg, tasks, loaded.model, read.samples, counters);
    let anchored = t.cost_opt.is_anchored();
    t.cost_opt.load_state(&cost_state).with_context(|| {
        if anchored {
            format!(
                "resuming {}: with train.cost_decay_to = \"init\" the checkpoint must hold the \
                 weights the decay pulls toward, and this one does not (a run begun before the \
                 setting decayed toward zero: write train.cost_decay_to = \"zero\" in its \
                 config.toml)",
                loaded.path.display()
            )
        } else {
            format!("resuming {}", loaded.path.display())
        }
    })?;
    t.policy_opt.load_state(&policy_state)?;
    Ok(t)
}

/// What each metrics line does: appended to `metrics.jsonl` (made durable
/// with each checkpoint: a resume drops later lines), shown on the
/// progress bar, and its time kept in `updates`.
fn metrics_writer<'a>(
    run: &'a RunDir,
    cfg: &'a Config,
    updates: &'a Updates,
    bar: &'a indicatif::ProgressBar,
    status: Option<&'a crate::status::StatusFeed>,
) -> anyhow::Result<impl FnMut(&Metrics) -> anyhow::Result<()> + 'a> {
    let path = run.metrics();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let t = &cfg.train;
    let mut lines = ProgressLines::new(
        (t.iterations * t.policy_steps) as u64,
        t.iterations,
        (t.iterations * t.measure_per_iteration) as u64,
    );
    let quiet = bar.is_hidden();
    Ok(move |m: &Metrics| {
        let now = (Instant::now(), m.env_steps as u64);
        updates.set(Some(
            updates.get().map_or((now, now), |(first, _)| (first, now)),
        ));
        writeln!(file, "{}", serde_json::to_string(m)?)
            .with_context(|| format!("writing {}", path.display()))?;
        if let Some(feed) = status {
            feed.point(m);
        }
        // Off a terminal (a log file, Slurm), a line now and then instead
        // of the bar.
        if let Some(line) = lines.line(m, Instant::now()).filter(|_| quiet) {
            tracing::info!("{line}");
        }
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
    })
}

/// Progress lines for a log: one every [`ProgressLines::EVERY_S`] seconds
/// or every twentieth of the run's updates, whichever comes first.
struct ProgressLines {
    total: u64,
    rounds: usize,
    measurements: u64,
    /// This session's first line: when, at which update, at which env step.
    first: Option<(Instant, u64, usize)>,
    /// The last line written: when, at which update.
    last: Option<(Instant, u64)>,
}

impl ProgressLines {
    const EVERY_S: f64 = 30.0;

    fn new(total: u64, rounds: usize, measurements: u64) -> Self {
        ProgressLines {
            total,
            rounds,
            measurements,
            first: None,
            last: None,
        }
    }

    /// The line for `m` at `now`, if one is due: the update and round,
    /// the measurements, measured against predicted cost, env steps per
    /// second and the time left at this session's pace.
    fn line(&mut self, m: &Metrics, now: Instant) -> Option<String> {
        let step = m.step as u64;
        let (t0, s0, e0) = *self.first.get_or_insert((now, step, m.env_steps));
        let every = (self.total / 20).max(1);
        let due = match self.last {
            None => true,
            Some((at, s)) => {
                step >= s + every
                    || now.duration_since(at).as_secs_f64() >= Self::EVERY_S
                    || step >= self.total
            }
        };
        if !due {
            return None;
        }
        self.last = Some((now, step));
        let secs = now.duration_since(t0).as_secs_f64();
        let rate = if secs > 0.0 {
            format!("{:.0}", (m.env_steps - e0) as f64 / secs)
        } else {
            "-".into()
        };
        let eta = match step.checked_sub(s0).filter(|&d| d > 0 && secs > 0.0) {
            Some(done) => {
                let left = self.total.saturating_sub(step) as f64 * secs / done as f64;
                format!(
                    "{}",
                    indicatif::HumanDuration(std::time::Duration::from_secs_f64(left))
                )
            }
            None => "-".into(),
        };
        // The plans measured since the update before this one.
        let plans = match (m.mean_measured_ms, m.mean_predicted_ms) {
            (Some(a), Some(b)) => format!("plans {a:.2} ms measured against {b:.2} ms predicted"),
            (Some(a), None) => format!("plans {a:.2} ms measured (no prediction)"),
            (None, _) => "no plan measured since the last update".into(),
        };
        // Rounds count from 1, as updates do: the last is `rounds/rounds`.
        Some(format!(
            "update {step}/{}, round {}/{}, {}/{} measured, {plans}, {rate} env steps/s, eta {eta}",
            self.total,
            (m.iteration + 1).min(self.rounds),
            self.rounds,
            m.measurements,
            self.measurements,
        ))
    }
}

/// The error of a run that stopped on `e` after training began, with what
/// was kept: a checkpoint when it learned anything since `learned_at_start`
/// (its policy updates and cost steps then), and the command that resumes.
fn stopped_by(
    e: anyhow::Error,
    args: &TrainArgs,
    run: &RunDir,
    trainer: &Trainer,
    learned_at_start: (usize, usize),
) -> anyhow::Error {
    let resume = resume_command(args, run);
    // Nothing learned since the start (say, peers that never came): no
    // checkpoint of untouched networks; the measurements are in the cost
    // log, which a resume reads.
    let c = &trainer.counters;
    if (c.policy_updates, c.cost_steps) == learned_at_start {
        return e.context(format!(
            "training stopped before learning anything; `{resume}` goes on with the \
             measurements logged"
        ));
    }
    match save(run, trainer) {
        Ok(at) => e.context(format!(
            "training stopped; what it learned is in checkpoint {}, which `{resume}` \
             continues from once the cause is dealt with (peer processes keep saying \
             hello to the endpoint; a run of scripts/launch.sh goes on with \
             `scripts/launch.sh --resume {}`)",
            at.display(),
            run.path().display()
        )),
        Err(not) => e.context(format!(
            "training stopped, and no checkpoint of it could be written ({not:#}); \
             `{resume}` continues from the run's last one"
        )),
    }
}

/// The closing line: what the session did and how fast it learned.
fn report(
    out: &mut dyn Write,
    trainer: &Trainer,
    run: &RunDir,
    steps: usize,
    secs: f64,
    updates: Option<((Instant, u64), (Instant, u64))>,
    lags: Option<Lags>,
) -> anyhow::Result<()> {
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
    if let Some((first, last)) = updates {
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
    writeln!(out, "; run in {}", run.path().display())?;
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
        let decay = match cfg.train.cost_decay_to {
            common::config::DecayTo::Init => "toward them",
            common::config::DecayTo::Zero => "toward zero",
        };
        tracing::info!(
            "starting from the networks of {} (the cost network's weight decay pulls {decay})",
            path.display()
        );
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
    run_dir: &RunDir,
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
            common::fs::write_atomic(&run_dir.endpoint(), format!("{e}\n").as_bytes())?;
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
        report.unexpected,
        report.shed_connections,
    ];
    if refused.iter().sum::<u64>() > 0 {
        tracing::warn!(
            "{} malformed unrolls, {} unrolls sent without a credit, {} undecodable frames, \
             {} refused peers, {} connections refused at their handshake (no cluster token, or \
             another), {} messages with a mismatched envelope, {} messages from peers that \
             never said hello, for jobs not out, or of a kind the learner does not take, {} \
             connections closed at the cap on open connections",
            refused[0],
            refused[1],
            refused[2],
            refused[3],
            refused[4],
            refused[5],
            refused[6],
            refused[7]
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
fn resume_command(args: &TrainArgs, run: &RunDir) -> String {
    let mut c = format!("learner train --run-dir {} --resume", run.path().display());
    if let Some(bind) = &args.bind {
        let bound = std::fs::read_to_string(run.endpoint()).unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: usize, env_steps: usize, measurements: usize) -> Metrics {
        Metrics {
            step,
            iteration: step / 10,
            env_steps,
            measurements,
            mean_measured_ms: Some(2.5),
            ..Default::default()
        }
    }

    /// A line on the first update, then every twentieth of the updates or
    /// every 30 s, whichever first, and on the last; each names the
    /// update, the round, the measurements, both costs, the rate and the
    /// time left.
    #[test]
    fn progress_lines_come_every_twentieth_or_thirty_seconds() {
        let mut p = ProgressLines::new(200, 20, 100);
        let t0 = Instant::now();
        let s = std::time::Duration::from_secs;
        let first = p.line(&at(1, 50, 5), t0).unwrap();
        assert!(
            first.starts_with("update 1/200, round 1/20, 5/100 measured"),
            "{first}"
        );
        assert!(
            first.contains("plans 2.50 ms measured (no prediction)"),
            "{first}"
        );
        // Ten updates per line (200 / 20), or 30 s.
        assert!(p.line(&at(5, 250, 5), t0 + s(5)).is_none());
        let tenth = p.line(&at(11, 550, 10), t0 + s(10)).unwrap();
        assert!(
            tenth.contains("50 env steps/s") && tenth.contains("eta 3 minutes"),
            "{tenth}"
        );
        assert!(p.line(&at(12, 600, 10), t0 + s(20)).is_none());
        assert!(p.line(&at(13, 650, 10), t0 + s(41)).is_some());
        let quiet = Metrics {
            mean_measured_ms: None,
            ..at(200, 9950, 100)
        };
        let last = p.line(&quiet, t0 + s(42)).unwrap();
        assert!(last.starts_with("update 200/200, round 20/20,"), "{last}");
        assert!(last.contains("no plan measured since"), "{last}");
    }
}
