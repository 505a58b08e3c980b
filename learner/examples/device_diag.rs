//! Where the cost network is wrong inside one plan: for one task of a
//! suite, the guard's candidates (the learned plan and the heuristics'),
//! each device's load beside its forward and backward times, predicted
//! then measured on `sim`, and the prediction's error. The load: tables,
//! widest dim, lookups per sample, lookup width `Σ pooling × dim / 2048`,
//! and `reread`, the same width times the share of rows read more than
//! once over the mean reuse (what those rows ask of a cache). Backward is
//! the lookup's backward with the optimizer update, without
//! communication.
//!
//! cargo run --release --example device_diag -- RUN_DIR SUITE TASK_NAME

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() == 3,
        "usage: device_diag RUN_DIR SUITE TASK_NAME"
    );
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let suite = common::Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let task = suite
        .tasks
        .iter()
        .find(|t| t.name == args[2])
        .ok_or_else(|| anyhow::anyhow!("no task {} in {}", args[2], args[1]))?;
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    let g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
    for c in &g.candidates {
        let m = oracle.measure(&task.tables, &c.plan)?;
        let (pred, overall) = model.estimate(&task.tables, &c.plan);
        println!(
            "{}: predicted {overall:.3} measured {:.3}",
            c.method, m.cost_ms
        );
        for (d, (p, got)) in pred.iter().zip(&m.devices).enumerate() {
            let on: Vec<&common::Table> = task
                .tables
                .iter()
                .zip(&c.plan.assignment)
                .filter(|(_, &a)| a == d)
                .map(|(t, _)| t)
                .collect();
            let lookups: f64 = on.iter().map(|t| t.pooling_factor).sum();
            let width: f64 = on
                .iter()
                .map(|t| t.pooling_factor * t.dim as f64 / 2048.0)
                .sum();
            let reread: f64 = on
                .iter()
                .map(|t| {
                    t.pooling_factor * t.dim as f64 / 2048.0 * (1.0 - t.bins[0]).max(0.0)
                        / t.mean_reuse()
                })
                .sum();
            let max_dim = on.iter().map(|t| t.dim).max().unwrap_or(0);
            println!(
                "  dev {d:2}: {:3} tables, max dim {max_dim:4}, lookups {lookups:7.1}, width {width:7.2}, reread {reread:6.2} | \
                 fwd {:6.2} predicted, {:6.2} measured ({:+5.1} %); bwd {:6.2}, {:6.2} ({:+5.1} %)",
                on.len(),
                p[0],
                got.fwd_ms,
                (p[0] / got.fwd_ms - 1.0) * 100.0,
                p[1],
                got.bwd_ms,
                (p[1] / got.bwd_ms - 1.0) * 100.0
            );
        }
    }
    Ok(())
}
