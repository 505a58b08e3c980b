//! `learner pretrain`: the cost network fitted to a bulk of measured plans
//! across the table space (stage 1), then Algorithm 1 from it (stage 2).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use common::config::Config;

use super::train::train_with;
use super::{progress, train_progress, TrainArgs};
use crate::run::RunDir;
use crate::runlock::RunLock;
use model::shapes::TrainedShapes;

pub(super) fn pretrain(mut args: TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::pretrain;
    let dir = args.run_dir.clone();
    anyhow::ensure!(
        args.init.is_none(),
        "pretrain starts from fresh networks (its stage 1 is what `train --init` would \
         load): drop --init"
    );
    anyhow::ensure!(
        args.measurements.is_none(),
        "pretrain measures its bulk and its stage 2 as its configuration says (set \
         train.measure_per_iteration there): drop --measurements"
    );
    anyhow::ensure!(
        args.seed.is_none(),
        "pretrain draws its tasks and plans with pretrain.seed (set it in the \
         configuration): drop --seed"
    );
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let threads = i32::try_from(threads)
        .with_context(|| format!("--threads {threads}: more than libtorch takes"))?;
    let stage1 = dir.join(pretrain::STAGE1);
    let cfg = if args.resume && dir.join(RunDir::CONFIG).exists() {
        Config::load_run(&dir.join(RunDir::CONFIG))?
    } else if args.resume && stage1.join(RunDir::CONFIG).exists() {
        Config::load_run(&stage1.join(RunDir::CONFIG))?
    } else {
        anyhow::ensure!(
            !dir.join(RunDir::CONFIG).exists() && !stage1.join(RunDir::CONFIG).exists(),
            "{} already holds a pre-training run: add --resume to continue it, or pick \
             another --run-dir",
            dir.display()
        );
        Config::load(args.config.as_deref())?
    };
    let tasks = pretrain::tasks(&cfg);
    // Stage 2 trains on the cluster's machinery: a task its actors cannot
    // roll out, or networks too big to send, stop it now, not after stage 1.
    if super::setup::has_peers(&args, &cfg) {
        super::setup::check_peers(&tasks, &cfg)?;
    }
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
        stage_one(&cfg, &tasks, &stage1, &bulk, &held, threads, out)?;
    } else if args.threads.is_some() {
        tracing::warn!("stage 1 is done: --threads has nothing to set in stage 2");
    }
    // Stage 2: Algorithm 1 on the same tasks from stage 1's networks.
    let resume_stage2 = dir.join(RunDir::CONFIG).exists();
    args.resume = resume_stage2;
    if !resume_stage2 {
        args.init = Some(here.join(&stage1));
    }
    train_with(args, Some(cfg), bulk, out)
}

/// Stage 1 of `pretrain`: the cost network fitted to the bulk, in
/// `stage1` (a run folder of its own: resumable, and what stage 2 starts
/// from), on `threads` libtorch threads. Nothing to do when its newest
/// checkpoint has every step.
fn stage_one(
    cfg: &Config,
    tasks: &[common::Task],
    stage1: &Path,
    bulk: &[model::loss::CostSample],
    held: &[model::loss::CostSample],
    threads: i32,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use crate::checkpoint;
    const EVERY: usize = 2000;
    let steps = cfg.pretrain.cost_steps;
    common::fs::create_dir_durable(stage1)
        .with_context(|| format!("creating {}", stage1.display()))?;
    let _lock = RunLock::take(stage1)?;
    tch::set_num_threads(threads);
    let mut trainer = match checkpoint::load_latest(cfg, stage1)? {
        Some(loaded) => {
            let (cost_state, _) = checkpoint::split_optimizer(loaded.optimizer);
            let mut t =
                crate::train::Trainer::with(cfg, tasks, loaded.model, Vec::new(), loaded.counters);
            t.cost_opt.load_state(&cost_state)?;
            t
        }
        None => {
            common::fs::write_atomic(
                &stage1.join(RunDir::CONFIG),
                toml::to_string_pretty(cfg)?.as_bytes(),
            )?;
            crate::train::Trainer::new(cfg, tasks)
        }
    };
    if let Some(shapes) = TrainedShapes::of(tasks) {
        shapes.write(stage1)?;
    }
    trainer.prior = bulk.to_vec();
    if held.is_empty() {
        tracing::warn!(
            "pretrain.tasks = {} holds out no task (every {}th is): stage 1 cannot report its \
             error on tasks it never trained on",
            tasks.len(),
            crate::pretrain::HOLD_OUT
        );
    }
    let before = held_out_error(&trainer.model, held);
    let rounds = cfg.pretrain.search_rounds;
    let share = steps / (rounds + 1);
    let mut rounds_done = 0;
    let stop = net::link::stop_on_signal();
    let bar = train_progress(steps as u64);
    bar.set_position(trainer.counters.cost_steps as u64);
    let start = std::time::Instant::now();
    let mut done_here = 0usize;
    while trainer.counters.cost_steps < steps {
        let due = (trainer.counters.cost_steps / share.max(1)).min(rounds);
        while rounds_done < due {
            rounds_done += 1;
            let (found, held_found) = crate::pretrain::searched(&trainer.model, cfg, tasks)?;
            let error = held_out_error(&trainer.model, &held_found);
            tracing::info!(
                "stage 1: search round {rounds_done}/{rounds}: {} plans found and measured; \
                 error on those of held-out tasks {}",
                found.len() + held_found.len(),
                error
            );
            match cfg.pretrain.found_share {
                Some(_) => trainer.focus.extend(found),
                None => trainer.prior.extend(found),
            }
        }
        trainer.cost_step();
        done_here += 1;
        bar.inc(1);
        let at = trainer.counters.cost_steps;
        if at % EVERY == 0 || at == steps {
            checkpoint::save(stage1, &trainer, 2)?;
            let error = held_out_error(&trainer.model, held);
            bar.set_message(format!("held-out error {error}"));
            tracing::info!("stage 1: {at}/{steps} cost steps; held-out relative error {error}");
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            checkpoint::save(stage1, &trainer, 2)?;
            bar.finish_and_clear();
            tracing::info!(
                "stopped in stage 1 at {at}/{steps} cost steps; checkpoint written: \
                 `learner pretrain --resume --run-dir {}` continues",
                stage1.parent().unwrap_or(stage1).display()
            );
            return super::train::interrupted(&stop, false);
        }
    }
    bar.finish_and_clear();
    let after = held_out_error(&trainer.model, held);
    let (_, held_found) = crate::pretrain::searched(&trainer.model, cfg, tasks)?;
    let searched = held_out_error(&trainer.model, &held_found);
    writeln!(
        out,
        "stage 1: {done_here} cost steps in {:.1} s on {threads} libtorch thread{}; held-out \
         relative error of the iteration cost {after}, {before} before; on the plans its \
         search finds for held-out tasks {searched}",
        start.elapsed().as_secs_f64(),
        if threads == 1 { "" } else { "s" },
    )?;
    tch::set_num_threads(1);
    Ok(())
}

/// The network's relative error on held-out `samples` (mean and p90) as
/// percentages, or why there is none: with fewer than `HOLD_OUT` tasks, no
/// task is held out.
fn held_out_error(model: &model::Model, samples: &[model::loss::CostSample]) -> String {
    if samples.is_empty() {
        return "none (no task held out)".into();
    }
    let (mean, p90) = crate::pretrain::relative_error(model, samples);
    format!("{:.1} % (p90 {:.1} %)", mean * 100.0, p90 * 100.0)
}
