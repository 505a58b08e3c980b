//! Does the cost network's forward error follow the lanes a device's
//! widest table wastes? FBGEMM sizes a fused call's thread blocks by its
//! widest table, so narrower tables beside it pay TorchRec's block
//! penalty: not a function of each table alone, which a sum of table
//! representations cannot see. Per device of the guard's candidates (the
//! learned plan and the heuristics'), on `sim`, the lane factor is the
//! device's lookup width (pooling × dim, summed) weighted by the
//! penalties in one fused call's block over the same with each table in
//! a block of its own (1: no waste). It is an approximation: `sim` also
//! rounds rows to sectors, weighs in the cache, and runs a device's
//! tables one call each where that is faster, wasting no lanes. It
//! prints the forward error (predicted over measured) by lane factor,
//! then by tables on the device.
//!
//! cargo run --release --example lane_error -- RUN_DIR SUITE...

use benchworker::sim::{block_penalty, block_width, lane_share};

/// Errors of one bucket: count, sum, sum of sizes.
#[derive(Default, Clone, Copy)]
struct Bucket(usize, f64, f64);

impl Bucket {
    fn add(&mut self, err: f64) {
        *self = Bucket(self.0 + 1, self.1 + err, self.2 + err.abs());
    }

    fn row(&self, label: &str) {
        if self.0 > 0 {
            let n = self.0 as f64;
            println!(
                "| {label} | {} | {:+.1} % | {:.1} % |",
                self.0,
                100.0 * self.1 / n,
                100.0 * self.2 / n
            );
        }
    }
}

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: lane_error RUN_DIR SUITE...");
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    const LANES: [f64; 5] = [1.0001, 1.1, 1.3, 1.5, f64::INFINITY];
    const TABLES: [usize; 6] = [2, 5, 10, 20, 40, usize::MAX];
    let mut by_lane = [Bucket::default(); LANES.len()];
    let mut by_tables = [Bucket::default(); TABLES.len()];
    for path in &args[1..] {
        let suite = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        for task in &suite.tasks {
            let g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
            for c in &g.candidates {
                let m = oracle.measure(&task.tables, &c.plan)?;
                let (pred, _) = model.estimate(&task.tables, &c.plan);
                for ((p, got), group) in pred.iter().zip(&m.devices).zip(c.plan.groups()) {
                    let on: Vec<&common::Table> = group.iter().map(|&t| &task.tables[t]).collect();
                    let Some(widest) = on.iter().map(|t| t.dim).max() else {
                        continue;
                    };
                    let (mut shared, mut alone) = (0.0, 0.0);
                    for t in &on {
                        let bytes = t.pooling_factor * t.dim as f64;
                        shared += bytes * block_penalty(lane_share(t.dim, block_width(widest)));
                        alone += bytes * block_penalty(lane_share(t.dim, block_width(t.dim)));
                    }
                    let err = p[0] / got.fwd_ms - 1.0;
                    let lane = shared / alone;
                    by_lane[LANES.iter().position(|&hi| lane < hi).unwrap_or(0)].add(err);
                    by_tables[TABLES.iter().position(|&hi| on.len() < hi).unwrap_or(0)].add(err);
                }
            }
        }
    }
    println!("| lane factor | devices | forward error, mean | mean size |");
    println!("|---|---|---|---|");
    let mut lo = 1.0;
    for (b, hi) in by_lane.iter().zip(LANES) {
        b.row(&if lo == 1.0 {
            "1 (none wasted)".to_string()
        } else if hi.is_infinite() {
            format!("over {lo:.1}")
        } else {
            format!("{lo:.1} to {hi:.1}")
        });
        lo = hi;
    }
    println!("\n| tables on the device | devices | forward error, mean | mean size |");
    println!("|---|---|---|---|");
    let mut lo = 1;
    for (b, hi) in by_tables.iter().zip(TABLES) {
        let label = if hi == usize::MAX {
            format!("{lo} or more")
        } else {
            format!("{lo} to {}", hi - 1)
        };
        b.row(&label);
        lo = hi;
    }
    Ok(())
}
