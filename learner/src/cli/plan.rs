//! `learner plan`: a trained model's placement of the user's tables.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{PlanArgs, PlanFormat};
use crate::run::RunDir;
use model::shapes::TrainedShapes;

pub(super) fn plan(args: PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
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
    let task = user_task(&args, &run_cfg.memory)?;
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
    warn_of_doubts(&guarded);
    if let Some(backend) = args.verify {
        let mut oracle = benchworker::build(backend, &run_cfg)?;
        model::guard::verify(&mut guarded, &task.tables, oracle.as_mut())?;
        log_verified(&guarded, backend);
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
        PlanFormat::Placement => placement_document(&task, &guarded, &per_device, cost)?,
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

/// The user's task: the tables of `--tables` on `--devices` devices of
/// `--memory-gb`, checked to fit.
fn user_task(args: &PlanArgs, mem: &common::MemoryModel) -> anyhow::Result<common::Task> {
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
    if let Some(why) = task.infeasibility(mem) {
        anyhow::bail!("{}: cannot fit memory: {why}", args.tables.display());
    }
    Ok(task)
}

/// Says why the guard doubted the learned plan, and what lies outside
/// the trained shapes.
fn warn_of_doubts(guarded: &model::guard::Guarded) {
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
}

/// Logs the measured gain of the plan chosen over the best heuristic.
fn log_verified(guarded: &model::guard::Guarded, backend: benchworker::Backend) {
    let chosen = &guarded.candidates[guarded.chosen];
    let Some(h) = guarded.best_heuristic() else {
        return;
    };
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

/// The placement JSON with the plan's estimate, the method that won, the
/// guard's doubts and every candidate.
fn placement_document(
    task: &common::Task,
    guarded: &model::guard::Guarded,
    per_device: &[[f64; 3]],
    cost: f64,
) -> anyhow::Result<serde_json::Value> {
    let plan = guarded.plan();
    let mut v = serde_json::to_value(common::Placement::from_plan(plan, &task.tables))?;
    v["estimate"] = serde_json::json!({
        "cost_ms": cost,
        "devices": per_device
            .iter()
            // A time is not negative: the network's prediction below 0
            // (for an empty device, where it never learned) is written
            // as 0.
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
    Ok(v)
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
        .find(|p| p.join(RunDir::CONFIG).is_file())
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
