//! Diagnostics for plan-time selection: per task, `K` candidates (the greedy
//! episode and `K − 1` samples, as `plan` draws them), each predicted by
//! the cost network and measured on the `sim` oracle. Prints the mean
//! measured cost of the greedy plan, of the candidate the cost network picks,
//! of the truly best candidate (what a perfect ranking would get), and the
//! mean Spearman correlation between predicted and measured costs.
//!
//! cargo run --release --example plan_diag -- RUN_DIR K SUITE...
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::{Plan, Suite};
use model::mdp::{MdpTask, PlainEpisodes};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let k: usize = args[1].parse()?;
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    for suite_path in &args[2..] {
        let suite = Suite::load(std::path::Path::new(suite_path), &cfg.memory)?;
        let (mut greedy, mut picked, mut best, mut rho, mut n) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for task in &suite.tasks {
            let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory);
            let episodes = PlainEpisodes::new(&model.policy, &model.cost, &mdp);
            let plans: Vec<Vec<usize>> = (0..k)
                .map(|i| match i {
                    0 => episodes.greedy().0,
                    i => episodes.sampled(i as u64, cfg.model.plan_temperature).0,
                })
                .collect();
            let pred: Vec<f64> = plans
                .iter()
                .map(|p| {
                    let plan = Plan {
                        devices: task.devices,
                        assignment: p.clone(),
                    };
                    model.estimate(&task.tables, &plan).1
                })
                .collect();
            let mut meas = Vec::new();
            for p in &plans {
                let plan = Plan {
                    devices: task.devices,
                    assignment: p.clone(),
                };
                meas.push(sim.measure(&task.tables, &plan)?.cost_ms);
            }
            let pick = (0..k).min_by(|&a, &b| pred[a].total_cmp(&pred[b])).unwrap();
            greedy += meas[0];
            picked += meas[pick];
            best += meas.iter().cloned().fold(f64::INFINITY, f64::min);
            rho += benchworker::calibrate::spearman(&pred, &meas);
            n += 1.0;
        }
        println!(
            "{suite_path} K={k}: greedy {:.3} picked {:.3} best-of-K {:.3} spearman {:.2}",
            greedy / n,
            picked / n,
            best / n,
            rho / n
        );
    }
    Ok(())
}
