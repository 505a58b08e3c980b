//! How well the cost network knows a table's cost alone and beside a few
//! others, with no search involved: for the first two tasks of each
//! suite, each table `i` is put alone on device 0 of a 2-device plan, and
//! then with the next 7 tables (`i + 1 … i + 7`, wrapping). Each case is one
//! JSON line: the group's size `k`, table `i`'s figures, and device 0's
//! forward plus backward time as predicted and as `sim` measures it.
//! Where the error grows from `k` = 1 to 8, the tables' interaction on a
//! device (the shared cache, the block width) is what the network misses.
//!
//! cargo run --release --example group_probe -- RUN_DIR SUITE... > OUT.jsonl

use common::Plan;

/// Tables on device 0 besides the first, in the second case.
const OTHERS: usize = 7;

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: group_probe RUN_DIR SUITE...");
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    for path in &args[1..] {
        let suite = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        for task in suite.tasks.iter().take(2) {
            let n = task.tables.len();
            for i in 0..n {
                for k in [1, 1 + OTHERS] {
                    let mut assignment = vec![1; n];
                    for j in 0..k.min(n) {
                        assignment[(i + j) % n] = 0;
                    }
                    let plan = Plan {
                        devices: 2,
                        assignment,
                    };
                    let m = oracle.measure(&task.tables, &plan)?;
                    let (pred, _) = model.estimate(&task.tables, &plan);
                    let t = &task.tables[i];
                    println!(
                        "{}",
                        serde_json::json!({
                            "suite": path,
                            "k": k,
                            "dim": t.dim,
                            "rows": t.rows,
                            "pooling": t.pooling_factor,
                            "mean_reuse": t.mean_reuse(),
                            "hot_share": t.lookup_share_above(1024.0),
                            "pred": pred[0][0] + pred[0][1],
                            "measured": m.devices[0].fwd_ms + m.devices[0].bwd_ms,
                        })
                    );
                }
            }
        }
    }
    Ok(())
}
