//! Refits a cost network on a finished run's measured plans
//! (`cost_buffer.jsonl`) with the training schedule — `train.iterations`
//! rounds of `train.cost_steps` steps, the buffer growing round by round as
//! it did in training — under a chosen weight decay, then judges it on the
//! `sim` oracle's test suites of 50×4 and 100×8 tasks:
//!
//! - its error on plans of every quality: the three cheap heuristics', a
//!   `search` reference's (1000 measurements from `torchrec`'s plan) and
//!   three random perturbations of the reference (mean absolute error per
//!   device and phase, relative error of the iteration cost, and the share
//!   of plan pairs more than 2 % apart that it orders rightly);
//! - what a search on it gains: from the heuristic plan it predicts
//!   cheapest, 2000 predicted plans, kept if it predicts lower (as `plan`
//!   searches), measured, against the best heuristic; the reference's gain
//!   beside it.
//!
//! No policy is involved: this isolates the cost network.
//!
//! cargo run --release --example cost_fit -- RUN_DIR [WEIGHT_DECAY [SEED]]
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::{Plan, Suite};
use model::baselines::{place, Context, Method};
use model::loss::{cost_loss, CostSample};
use model::Model;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(run) = args.first().map(std::path::Path::new) else {
        anyhow::bail!("usage: cost_fit RUN_DIR [WEIGHT_DECAY [SEED]]");
    };
    let mut cfg = common::config::Config::load(Some(&run.join("config.toml")))?;
    if let Some(wd) = args.get(1) {
        cfg.train.cost_weight_decay = wd.parse()?;
        cfg.train.validate()?;
    }
    let wd = cfg.train.cost_weight_decay;
    let seed: u64 = args.get(2).map_or(Ok(0), |s| s.parse())?;
    let buffer = learner::costlog::CostLog::read(&run.join("cost_buffer.jsonl"))?.samples;
    anyhow::ensure!(!buffer.is_empty(), "{}: no measured plans", run.display());

    let model = refit(&cfg, &buffer, seed)?;

    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    println!("{}: weight decay {wd}, seed {seed}", run.display());
    for name in ["dlrm-50x4", "dlrm-100x8"] {
        let path = std::path::PathBuf::from(format!("data/generated/{name}.test.json"));
        let suite = Suite::load(&path, &cfg.memory)?;
        let (mut abs, mut devices) = ([0.0f64; 3], 0.0);
        let (mut rel, mut plans) = (0.0, 0.0);
        let (mut pairs, mut ordered) = (0.0f64, 0.0);
        let (mut gain, mut gain_ref) = (0.0, 0.0);
        for task in &suite.tasks {
            let ctx = Context::for_task(task, &cfg.memory, cfg.sim.batch);
            let mut r = ChaCha8Rng::seed_from_u64(0);
            let heuristics: Vec<Plan> = [Method::Lookup, Method::SizeLookup, Method::Torchrec]
                .iter()
                .filter_map(|&m| place(m, &ctx, &mut r))
                .collect();
            anyhow::ensure!(heuristics.len() == 3, "{}: a heuristic failed", task.name);
            let cap = task.cap_bytes();
            let reference = model::search::search(
                &mut sim,
                &task.tables,
                &heuristics[2],
                cap,
                &cfg.memory,
                1000,
                &mut r,
            )?
            .plan;
            let mut judged = heuristics.clone();
            judged.push(reference.clone());
            judged.extend(perturbed(&reference, task, &cfg.memory, &mut r));
            let (mut measured, mut predicted) = (Vec::new(), Vec::new());
            for p in &judged {
                let m = sim.measure(&task.tables, p)?;
                let (per_device, overall) = model.estimate(&task.tables, p);
                for (d, c) in m.devices.iter().zip(&per_device) {
                    abs[0] += (c[0] - d.fwd_ms).abs();
                    abs[1] += (c[1] - d.bwd_ms).abs();
                    abs[2] += (c[2] - d.bwd_comm_ms).abs();
                    devices += 1.0;
                }
                rel += (overall - m.cost_ms).abs() / m.cost_ms;
                plans += 1.0;
                measured.push(m.cost_ms);
                predicted.push(overall);
            }
            for i in 0..measured.len() {
                for j in 0..i {
                    if (measured[i] - measured[j]).abs() > 0.02 * measured[i] {
                        pairs += 1.0;
                        let right = (measured[i] < measured[j]) == (predicted[i] < predicted[j]);
                        ordered += f64::from(u8::from(right));
                    }
                }
            }
            let best_h = measured[..3].iter().copied().fold(f64::INFINITY, f64::min);
            let start = (0..3)
                .min_by(|&a, &b| predicted[a].total_cmp(&predicted[b]))
                .unwrap_or(0);
            let _guard = tch::no_grad_guard();
            let mdp = model::mdp::MdpTask::new(&task.tables, task.devices, cap, &cfg.memory);
            let reps = model.cost.tables(&mdp.features);
            let heads = model.cost.device_heads(&reps, task.devices);
            let mut net = model::search::CostNetOracle::new(heads, &reps, 0);
            let mut r = ChaCha8Rng::seed_from_u64(0);
            let out = model::search::search(
                &mut net,
                &task.tables,
                &heuristics[start],
                cap,
                &cfg.memory,
                2000,
                &mut r,
            )?;
            let found = if out.improved() {
                out.plan
            } else {
                heuristics[start].clone()
            };
            let n = suite.tasks.len() as f64;
            gain += (sim.measure(&task.tables, &found)?.cost_ms / best_h - 1.0) * 100.0 / n;
            gain_ref += (measured[3] / best_h - 1.0) * 100.0 / n;
        }
        println!(
            "  {name}: error per device fwd {:.3} bwd {:.3} comm {:.3} ms, iteration {:.1} %, \
             pairs ordered {:.1} %; search on it {gain:+.2} % vs best heuristic \
             (reference {gain_ref:+.2} %)",
            abs[0] / devices,
            abs[1] / devices,
            abs[2] / devices,
            rel / plans * 100.0,
            ordered / pairs.max(1.0) * 100.0,
        );
    }
    Ok(())
}

/// A fresh cost network fitted to `buffer` with the training schedule:
/// `train.iterations` rounds of `train.cost_steps` steps, the buffer
/// growing round by round as it did in training.
fn refit(cfg: &common::config::Config, buffer: &[CostSample], seed: u64) -> anyhow::Result<Model> {
    tch::manual_seed(seed as i64);
    let model = Model::new(cfg);
    let t = &cfg.train;
    let mut opt =
        model::adam::Adam::new(&model.cost_vs, t.cost_lr).with_weight_decay(t.cost_weight_decay);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rounds = t.iterations.max(1);
    for round in 1..=rounds {
        let seen = (buffer.len() * round / rounds).max(1);
        for _ in 0..t.cost_steps {
            let batch: Vec<&CostSample> = (0..t.cost_batch.min(seen))
                .map(|_| &buffer[rng.gen_range(0..seen)])
                .collect();
            let stepped = opt.backward_step(&cost_loss(&model.cost, &batch, t.cost_loss));
            anyhow::ensure!(
                stepped,
                "round {round}: the cost loss's gradient is not finite"
            );
        }
    }
    Ok(model)
}

/// Three random perturbations of `reference` (2, 4 and 6 tables moved),
/// those that fit.
fn perturbed(
    reference: &Plan,
    task: &common::Task,
    mem: &common::MemoryModel,
    r: &mut ChaCha8Rng,
) -> Vec<Plan> {
    let mut out = Vec::new();
    for k in 0..3 {
        let mut p = reference.clone();
        for _ in 0..2 + 2 * k {
            let t = r.gen_range(0..p.assignment.len());
            p.assignment[t] = r.gen_range(0..p.devices);
        }
        if p.fits(&task.tables, mem, task.cap_bytes()) {
            out.push(p);
        }
    }
    out
}
