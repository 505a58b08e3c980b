//! Diagnostics: where the cost network is wrong. For each task of a suite,
//! the plans of `policy`, `lookup`, `torchrec` and a short `search` (500
//! measurements from `lookup`): the cost network's per-device (fwd, bwd,
//! comm) and overall predictions against the `sim` oracle's measurement,
//! averaged. `DIAG_VERBOSE=1` prints every device of plans measured over
//! 16 ms; `DIAG_DIMS=1` the dims per device of each suite's first task.
//!
//! cargo run --release --example cost_diag -- RUN_DIR SUITE...
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::Suite;
use model::baselines::{place, Context, Method};
use rand::SeedableRng;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    for suite_path in &args[1..] {
        let suite = Suite::load(std::path::Path::new(suite_path), &cfg.memory)?;
        println!("== {suite_path}");
        for name in ["policy", "lookup", "torchrec", "search"] {
            // sums: measured, head, composed; per-device abs err fwd, bwd, comm; signed err
            let mut s = [0.0f64; 9];
            let mut n_dev = 0.0;
            for task in &suite.tasks {
                let plan = if name == "policy" {
                    model.plan(task, &cfg.memory).0
                } else {
                    let ctx = Context::for_task(task, &cfg.memory, cfg.sim.batch);
                    let m = if name == "torchrec" {
                        Method::Torchrec
                    } else {
                        Method::Lookup
                    };
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
                    let p = place(m, &ctx, &mut rng).ok_or_else(|| anyhow::anyhow!("no plan"))?;
                    if name == "search" {
                        model::search::search(
                            &mut sim,
                            &task.tables,
                            &p,
                            task.cap_bytes(),
                            &cfg.memory,
                            500,
                            &mut rng,
                        )?
                        .plan
                    } else {
                        p
                    }
                };
                let meas = sim.measure(&task.tables, &plan)?;
                let (dev, head) = model.estimate(&task.tables, &plan);
                if std::env::var("DIAG_DIMS").is_ok() && task.name.ends_with("-000") {
                    for d in 0..task.devices {
                        let mut dims: Vec<u32> = task
                            .tables
                            .iter()
                            .zip(&plan.assignment)
                            .filter(|(_, &x)| x == d)
                            .map(|(t, _)| t.dim)
                            .collect();
                        dims.sort();
                        println!(
                            "{name} dev {d} fwd {:.2} bwd {:.2} dims {:?}",
                            meas.devices[d].fwd_ms, meas.devices[d].bwd_ms, dims
                        );
                    }
                }
                if std::env::var("DIAG_VERBOSE").is_ok() && meas.cost_ms > 16.0 {
                    println!(
                        "{} {name} measured {:.2} head {:.2}",
                        task.name, meas.cost_ms, head
                    );
                    for (d, (p, m)) in dev.iter().zip(&meas.devices).enumerate() {
                        let n = plan.assignment.iter().filter(|&&x| x == d).count();
                        println!("  dev {d} n {n} fwd {:.2}/{:.2} bwd {:.2}/{:.2} comm {:.2}/{:.2} total {:.2}", p[0], m.fwd_ms, p[1], m.bwd_ms, p[2], m.bwd_comm_ms, m.total_ms);
                    }
                }
                let maxf = dev.iter().map(|d| d[0]).fold(f64::MIN, f64::max);
                let maxb = dev
                    .iter()
                    .map(|d| d[1] + 2.0 * d[2])
                    .fold(f64::MIN, f64::max);
                s[0] += meas.cost_ms;
                s[1] += head;
                s[2] += maxf + maxb;
                for (p, m) in dev.iter().zip(&meas.devices) {
                    s[3] += (p[0] - m.fwd_ms).abs();
                    s[4] += (p[1] - m.bwd_ms).abs();
                    s[5] += (p[2] - m.bwd_comm_ms).abs();
                    s[6] += p[0] - m.fwd_ms;
                    s[7] += p[1] - m.bwd_ms;
                    s[8] += p[2] - m.bwd_comm_ms;
                    n_dev += 1.0;
                }
            }
            let n = suite.tasks.len() as f64;
            println!(
                "{name:9} measured {:.3} head {:.3} composed {:.3} | dev |err| fwd {:.3} bwd {:.3} comm {:.3} | bias fwd {:+.3} bwd {:+.3} comm {:+.3}",
                s[0] / n, s[1] / n, s[2] / n,
                s[3] / n_dev, s[4] / n_dev, s[5] / n_dev,
                s[6] / n_dev, s[7] / n_dev, s[8] / n_dev
            );
        }
    }
    Ok(())
}
