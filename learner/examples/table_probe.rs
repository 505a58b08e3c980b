//! How well the cost network knows what one table adds to a loaded
//! device: `plan`'s search moves tables by these marginal costs, so an
//! error here sends it to plans that only look cheaper. For the first
//! tasks of each suite, the tables `i ≡ 0 (mod devices)` are put on one
//! device; for each of them, the device's forward plus backward time with
//! it minus without it, predicted and measured on `sim`. Printed by dim:
//! the tables, the predicted marginals' sum over the measured ones', and
//! the mean size of the relative error of a table's marginal.
//!
//! cargo run --release --example table_probe -- RUN_DIR SUITE... [--tasks N]

use common::{Plan, Table};

/// Dims in ranges, closed at the top.
const DIMS: [(u32, u32); 7] = [
    (1, 32),
    (33, 63),
    (64, 64),
    (65, 127),
    (128, 128),
    (129, 256),
    (257, 1024),
];

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut tasks = 4;
    if let Some(i) = args.iter().position(|a| a == "--tasks") {
        anyhow::ensure!(i + 1 < args.len(), "--tasks needs a count");
        tasks = args[i + 1].parse()?;
        args.drain(i..i + 2);
    }
    anyhow::ensure!(
        args.len() >= 2,
        "usage: table_probe RUN_DIR SUITE... [--tasks N]"
    );
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let oracle = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
    // Per dim range: tables, Σ predicted, Σ measured, Σ |relative error|.
    let mut sums = [(0usize, 0.0, 0.0, 0.0); DIMS.len()];
    let device_ms = |tables: &[Table]| {
        let plan = Plan {
            devices: 1,
            assignment: vec![0; tables.len()],
        };
        let m = oracle.evaluate(tables, &plan);
        let (pred, _) = model.estimate(tables, &plan);
        (
            pred[0][0] + pred[0][1],
            m.devices[0].fwd_ms + m.devices[0].bwd_ms,
        )
    };
    for path in &args[1..] {
        let suite = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        for task in suite.tasks.iter().take(tasks) {
            let on: Vec<Table> = task
                .tables
                .iter()
                .step_by(task.devices.max(1))
                .cloned()
                .collect();
            let (pred_all, got_all) = device_ms(&on);
            for k in 0..on.len() {
                let mut rest = on.clone();
                let t = rest.remove(k);
                let (pred, got) = device_ms(&rest);
                let (dp, dm) = (pred_all - pred, got_all - got);
                let Some(b) = DIMS.iter().position(|&(lo, hi)| (lo..=hi).contains(&t.dim)) else {
                    continue;
                };
                let s = &mut sums[b];
                *s = (
                    s.0 + 1,
                    s.1 + dp,
                    s.2 + dm,
                    s.3 + ((dp - dm) / dm.abs().max(1e-6)).abs(),
                );
            }
        }
    }
    println!("| dim | tables | predicted / measured | mean error size |");
    println!("|---|---|---|---|");
    for ((lo, hi), (n, p, m, e)) in DIMS.iter().zip(sums) {
        if n > 0 {
            let label = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo}–{hi}")
            };
            println!(
                "| {label} | {n} | {:.3} | {:.1} % |",
                p / m,
                100.0 * e / n as f64
            );
        }
    }
    Ok(())
}
