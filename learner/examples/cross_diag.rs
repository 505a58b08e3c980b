//! Whether run B's network would prefer run A's plans: per task, each
//! run's `plan`, B's prediction of both and their `sim` measurements.
//! Where B predicts A's plan lower than its own, B's search missed it;
//! where higher, B's network misjudges it.
//!
//! cargo run --release --example cross_diag -- RUN_A RUN_B SUITE
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::Suite;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() == 3, "usage: cross_diag RUN_A RUN_B SUITE");
    let (cfg, a) = learner::checkpoint::load_run(std::path::Path::new(&args[0]))?;
    let (_, b) = learner::checkpoint::load_run(std::path::Path::new(&args[1]))?;
    let suite = Suite::load(std::path::Path::new(&args[2]), &cfg.memory)?;
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    let (mut missed, mut n) = (0, 0);
    let mut sums = [0.0f64; 4];
    for task in &suite.tasks {
        let (pa, _) = a.plan(task, &cfg.memory);
        let (pb, _) = b.plan(task, &cfg.memory);
        let row = [
            b.estimate(&task.tables, &pa).1,
            sim.measure(&task.tables, &pa)?.cost_ms,
            b.estimate(&task.tables, &pb).1,
            sim.measure(&task.tables, &pb)?.cost_ms,
        ];
        missed += usize::from(row[0] < row[2]);
        n += 1;
        println!(
            "{}  A's plan {:.3}/{:.3}  B's plan {:.3}/{:.3} (B's prediction/measured)",
            task.name, row[0], row[1], row[2], row[3]
        );
        for (s, r) in sums.iter_mut().zip(row) {
            *s += r / suite.tasks.len() as f64;
        }
    }
    println!(
        "mean  A's plan {:.3}/{:.3}  B's plan {:.3}/{:.3}; B predicts A's lower on {missed} of {n}",
        sums[0], sums[1], sums[2], sums[3]
    );
    Ok(())
}
