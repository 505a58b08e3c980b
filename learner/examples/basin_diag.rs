//! Where `plan`'s searches on the cost network end, and what each end
//! measures: per task, every distinct basin ([`model::Model::basins`]),
//! cheapest predicted first, with its prediction, its `sim` measurement
//! and its heaviest device's table count. The summary says how often the
//! network's pick (rank 0) is the measured best basin, and what picking
//! the measured best would gain.
//!
//! cargo run --release --example basin_diag -- RUN_DIR SUITE
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::{Plan, Suite};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() == 2, "usage: basin_diag RUN_DIR SUITE");
    let (cfg, model) = learner::checkpoint::load_run(std::path::Path::new(&args[0]))?;
    let suite = Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    let (mut picked, mut best, mut hits, mut n) = (0.0, 0.0, 0, 0);
    for task in &suite.tasks {
        let basins = model.basins(task, &cfg.memory);
        let mut rows = Vec::new();
        for assignment in basins {
            let plan = Plan {
                devices: task.devices,
                assignment,
            };
            let measured = sim.measure(&task.tables, &plan)?.cost_ms;
            let predicted = model.estimate(&task.tables, &plan).1;
            let mut per = vec![0usize; task.devices];
            plan.assignment.iter().for_each(|&d| per[d] += 1);
            rows.push((predicted, measured, per.into_iter().max().unwrap_or(0)));
        }
        let Some(first) = rows.first() else { continue };
        let low = rows.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
        picked += first.1;
        best += low;
        hits += usize::from(first.1 == low);
        n += 1;
        let cells: Vec<String> = rows
            .iter()
            .map(|(p, m, t)| format!("{p:.3}/{m:.3}/{t}"))
            .collect();
        println!("{}  {}", task.name, cells.join("  "));
    }
    anyhow::ensure!(
        n > 0,
        "no task of the suite has a basin: `plan` does not search there"
    );
    println!(
        "tasks {n}: the pick is the measured best on {hits}; picked {:.3} ms, best basin {:.3} ms ({:+.2} %)",
        picked / n as f64,
        best / n as f64,
        (best / picked - 1.0) * 100.0
    );
    Ok(())
}
