//! Every device of the guard's candidates (the learned plan and the
//! heuristics') as one JSON line: its load, the forward and backward times
//! the cost network predicts, and what `sim` measures. For offline study
//! of where the network errs (with pandas or `jq`).
//!
//! The load: tables, widest dim, lookups per sample, lookup bytes per
//! sample (`pooling × dim × 2`, rows rounded to 32-byte sectors) and the
//! bytes of rows read more than once in a batch (what competes for L2).
//! Then the lookup-weighted means of its tables' `log10` rows, `log10`
//! pooling, share of lookups on rows read over 1024 times, and whether a
//! batch touches every row (`saturated_share`).
//!
//! cargo run --release --example device_dump -- RUN_DIR SUITE... > OUT.jsonl

/// Bytes of one fp16 row in whole 32-byte sectors.
fn row_bytes(t: &common::Table) -> f64 {
    (t.dim as f64 * 2.0 / 32.0).ceil() * 32.0
}

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: device_dump RUN_DIR SUITE...");
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    let batch = cfg.sim.batch as f64;
    for path in &args[1..] {
        let suite = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        for task in &suite.tasks {
            let g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
            for c in &g.candidates {
                let m = oracle.measure(&task.tables, &c.plan)?;
                let (pred, overall) = model.estimate(&task.tables, &c.plan);
                for (d, ((p, got), group)) in
                    pred.iter().zip(&m.devices).zip(c.plan.groups()).enumerate()
                {
                    let on: Vec<&common::Table> = group.iter().map(|&t| &task.tables[t]).collect();
                    let widest = on.iter().map(|t| t.dim).max().unwrap_or(0);
                    let lookups: f64 = on.iter().map(|t| t.pooling_factor).sum();
                    let bytes: f64 = on.iter().map(|t| t.pooling_factor * row_bytes(t)).sum();
                    let repeated: f64 = on
                        .iter()
                        .map(|t| {
                            common::generate::unique_rows(t, cfg.sim.batch)
                                * (1.0 - t.bins[0]).max(0.0)
                                * row_bytes(t)
                        })
                        .sum();
                    let reuse: f64 = on
                        .iter()
                        .map(|t| t.pooling_factor * (1.0 - 1.0 / t.mean_reuse()))
                        .sum::<f64>()
                        / lookups.max(1e-9);
                    // Lookup-weighted means of the tables' own figures.
                    let weighted = |f: &dyn Fn(&common::Table) -> f64| {
                        on.iter().map(|t| t.pooling_factor * f(t)).sum::<f64>() / lookups.max(1e-9)
                    };
                    let log10_rows = weighted(&|t| (t.rows as f64).log10());
                    let log10_pooling = weighted(&|t| t.pooling_factor.log10());
                    let hot = weighted(&|t| t.lookup_share_above(1024.0));
                    let saturated = weighted(&|t| {
                        let n = batch * t.pooling_factor;
                        f64::from(n / t.mean_reuse() >= t.rows as f64 * 0.999)
                    });
                    println!(
                        "{}",
                        serde_json::json!({
                            "suite": path,
                            "task": task.name,
                            "method": c.method,
                            "device": d,
                            "devices": c.plan.devices,
                            "tables": on.len(),
                            "widest": widest,
                            "lookups": lookups,
                            "bytes_per_sample": bytes,
                            "repeated_mib": repeated / (1u64 << 20) as f64,
                            "repeat_share": reuse,
                            "log10_rows": log10_rows,
                            "log10_pooling": log10_pooling,
                            "hot_share": hot,
                            "saturated_share": saturated,
                            "batch": batch,
                            "pred_fwd": p[0],
                            "pred_bwd": p[1],
                            "fwd": got.fwd_ms,
                            "bwd": got.bwd_ms,
                            "plan_pred": overall,
                            "plan_measured": m.cost_ms,
                        })
                    );
                }
            }
        }
    }
    Ok(())
}
