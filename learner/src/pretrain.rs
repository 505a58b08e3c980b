//! Pre-training across the whole table space (`learner pretrain`), so that
//! a model placed on tables and shapes it never saw is not extrapolating.
//!
//! Real measurements are scarce; `sim`'s are not (tens of thousands of
//! plans a second). NeuroShard pre-trains its cost models on such a bulk;
//! DreamShard trains from scratch per setting. Pre-training here has two
//! stages, both resumable:
//!
//! 1. **Bulk** (`RUN/stage1`): `pretrain.tasks` tasks drawn from
//!    [`common::space`] (2–64 devices, 1–64 tables per device, every table
//!    style, memory from roomy to 1.05× an even share); for each,
//!    `pretrain.plans_per_task` plans measured on `sim`: every heuristic's,
//!    random ones (uniform among the devices that fit, and skewed onto a
//!    few devices), and the plans that the local search on `sim` visits
//!    from the best heuristic's (`pretrain.search_share` of them: near good
//!    plans, where `plan`'s own search leans on the cost network). The cost
//!    network fits them for `pretrain.cost_steps` steps, in
//!    `pretrain.search_rounds + 1` shares: between shares, `plan`'s search
//!    on the cost network runs from each heuristic's plan of every task,
//!    and the plans it finds are measured and join the bulk (the search
//!    seeks out plans the network underrates; DAgger's idea). With
//!    `pretrain.found_share` they are a fixed share of each batch instead.
//!    The bulk is regenerated from its seed on a resume (`sim` is
//!    deterministic), not logged: it would take gigabytes.
//! 2. **Algorithm 1** (`RUN` itself): `learner train` on the same tasks
//!    from stage 1's networks, with the cluster machinery (actors,
//!    benchworkers, checkpoints, resume): the plans the policy and `plan`'s
//!    search visit are measured and added, and the policy learns on the
//!    estimated MDP across shapes. Its cost steps draw from the bulk too
//!    ([`crate::train::Trainer::prior`]).
//!
//! A held-out share of the bulk's tasks (every 20th) is never trained on:
//! the cost network's error on their plans, and on the plans its search
//! finds for them, is reported after stage 1. A stage 1 resumed after its
//! first round derives the rounds' plans again with the networks it
//! resumes with (they are not logged).

use std::path::{Path, PathBuf};

use anyhow::Context;
use benchworker::Oracle;
use common::config::Config;
use common::{Measurement, Plan, Task};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use model::baselines::{self, Method};
use model::loss::CostSample;
use model::search::PlanCost;

/// Stage 1's folder inside the run.
pub const STAGE1: &str = "stage1";
/// Where the tasks are written inside the run (a pool CSV and a suite).
pub const DATA: &str = "data";
/// Every `HOLD_OUT`-th task's bulk is held out of training.
pub const HOLD_OUT: usize = 20;

/// The pre-training tasks: deterministic from `cfg.pretrain`.
pub fn tasks(cfg: &Config) -> Vec<Task> {
    let p = &cfg.pretrain;
    common::space::tasks(&p.space, p.tasks, p.seed, "pretrain", &cfg.memory)
}

/// Writes `tasks` into `RUN/data` as `pretrain.csv` and `pretrain.json`
/// (the suite Algorithm 1 trains on); returns the suite's path.
pub fn write_tasks(run: &Path, tasks: &[Task]) -> anyhow::Result<PathBuf> {
    let dir = run.join(DATA);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (pool, suite) = common::space::suite(tasks, "pretrain.csv");
    common::pool::write(&dir.join("pretrain.csv"), &pool)?;
    let path = dir.join("pretrain.json");
    common::suite::write(&path, &suite)?;
    Ok(path)
}

/// Records every plan a search measures.
struct Recording<'o> {
    oracle: &'o mut dyn Oracle,
    seen: Vec<(Plan, Measurement)>,
}

impl PlanCost for Recording<'_> {
    fn plan_cost(
        &mut self,
        tables: &[common::Table],
        plan: &Plan,
        _moved: Option<&[usize]>,
        totals: &mut [f64],
    ) -> Result<f64, benchworker::OracleError> {
        let m = self.oracle.measure(tables, plan)?;
        for (t, d) in totals.iter_mut().zip(&m.devices) {
            *t = d.total_ms;
        }
        let cost = m.cost_ms;
        self.seen.push((plan.clone(), m));
        Ok(cost)
    }
}

/// A plan that puts each table (in a random order) on a device drawn with
/// weights from a flat Dirichlet of concentration `alpha` among those it
/// fits: low `alpha` piles the tables on a few devices, plans no heuristic
/// makes but a policy early in training does.
fn skewed(task: &Task, mem: &common::MemoryModel, alpha: f64, rng: &mut impl Rng) -> Option<Plan> {
    use rand_distr::Distribution;
    let d = task.devices;
    let gamma = rand_distr::Gamma::new(alpha, 1.0).ok()?;
    let weights: Vec<f64> = (0..d).map(|_| gamma.sample(rng) + 1e-12).collect();
    let mut order: Vec<usize> = (0..task.tables.len()).collect();
    rand::seq::SliceRandom::shuffle(order.as_mut_slice(), rng);
    let mut free = vec![task.cap_bytes(); d];
    let mut assignment = vec![0; task.tables.len()];
    for i in order {
        let b = mem.table_bytes(&task.tables[i]);
        let total: f64 = (0..d).filter(|&k| free[k] >= b).map(|k| weights[k]).sum();
        if total <= 0.0 {
            return None;
        }
        let mut pick = rng.gen::<f64>() * total;
        let mut chosen = None;
        for k in (0..d).filter(|&k| free[k] >= b) {
            chosen = Some(k);
            if pick < weights[k] {
                break;
            }
            pick -= weights[k];
        }
        let k = chosen?;
        free[k] -= b;
        assignment[i] = k;
    }
    Some(Plan {
        devices: d,
        assignment,
    })
}

/// The bulk plans of one task, measured on `oracle` (see the module doc).
pub fn bulk_of(
    task: &Task,
    cfg: &Config,
    oracle: &mut dyn Oracle,
    seed: u64,
) -> anyhow::Result<Vec<(Plan, Measurement)>> {
    let p = &cfg.pretrain;
    let mem = &cfg.memory;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(p.plans_per_task);
    let ctx = baselines::Context::for_task(task, mem, cfg.sim.batch);
    let mut best: Option<(Plan, f64)> = None;
    for m in Method::ALL.into_iter().filter(|m| m.is_heuristic()) {
        if let Some(plan) = baselines::place(m, &ctx, &mut rng) {
            let measured = oracle.measure(&task.tables, &plan)?;
            if best.as_ref().is_none_or(|(_, c)| measured.cost_ms < *c) {
                best = Some((plan.clone(), measured.cost_ms));
            }
            out.push((plan, measured));
        }
    }
    let searched = (p.plans_per_task as f64 * p.search_share).round() as usize;
    if let (Some((start, _)), true) = (best, searched > 1 && task.devices > 1) {
        let mut rec = Recording {
            oracle: &mut *oracle,
            seen: Vec::new(),
        };
        model::search::search(
            &mut rec,
            &task.tables,
            &start,
            task.cap_bytes(),
            mem,
            searched,
            &mut rng,
        )?;
        out.extend(rec.seen);
    }
    let mut tries = 0;
    while out.len() < p.plans_per_task && tries < 4 * p.plans_per_task {
        tries += 1;
        // Half uniform among the devices that fit, half skewed (α from
        // 0.05, nearly all on one device, to 2, mild).
        let plan = if rng.gen_bool(0.5) {
            baselines::place(Method::Random, &ctx, &mut rng)
        } else {
            let alpha = 10f64.powf(rng.gen_range(-1.3..0.3));
            skewed(task, mem, alpha, &mut rng)
        };
        if let Some(plan) = plan {
            let measured = oracle.measure(&task.tables, &plan)?;
            out.push((plan, measured));
        }
    }
    Ok(out)
}

/// A task's number and its bulk.
type TaskBulk = (usize, Vec<CostSample>);

/// The bulk of every task, as cost samples: `(trained on, held out)`.
/// Spread over the cores, each task seeded by its number (the same
/// whatever the threads).
pub fn bulk(
    cfg: &Config,
    tasks: &[Task],
    on_task: &(dyn Fn() + Sync),
) -> anyhow::Result<(Vec<CostSample>, Vec<CostSample>)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = tasks.len().div_ceil(cores.max(1)).max(1);
    let indexed: Vec<(usize, &Task)> = tasks.iter().enumerate().collect();
    let parts: Vec<anyhow::Result<Vec<TaskBulk>>> = std::thread::scope(|scope| {
        let running: Vec<_> = indexed
            .chunks(share)
            .map(|part| {
                scope.spawn(move || -> anyhow::Result<Vec<TaskBulk>> {
                    let mut oracle = benchworker::build(benchworker::Backend::Sim, cfg)?;
                    let mut out = Vec::with_capacity(part.len());
                    for &(k, task) in part {
                        let seed = cfg.pretrain.seed ^ (k as u64).wrapping_mul(0x9e37_79b9);
                        let plans = bulk_of(task, cfg, oracle.as_mut(), seed)
                            .with_context(|| format!("measuring the bulk of `{}`", task.name))?;
                        out.push((
                            k,
                            plans
                                .into_iter()
                                .map(|(plan, m)| CostSample::new(task, &plan, m))
                                .collect(),
                        ));
                        on_task();
                    }
                    Ok(out)
                })
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for part in parts {
        for (k, samples) in part? {
            if k % HOLD_OUT == HOLD_OUT - 1 {
                held.extend(samples);
            } else {
                train.extend(samples);
            }
        }
    }
    Ok((train, held))
}

/// Where the search on `model`'s cost network goes from each heuristic's
/// plan of each task, measured on `sim`: `(of training tasks, of held-out
/// tasks)` (see `pretrain.search_rounds`).
pub fn searched(
    model: &model::Model,
    cfg: &Config,
    tasks: &[Task],
) -> anyhow::Result<(Vec<CostSample>, Vec<CostSample>)> {
    let mut oracle = benchworker::build(benchworker::Backend::Sim, cfg)?;
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for (k, task) in tasks.iter().enumerate() {
        let mut starts: Vec<Vec<usize>> = Vec::new();
        for &m in &model::guard::HEURISTICS {
            if let Some(p) = baselines::plans_for(task, &cfg.memory, cfg.sim.batch, &[m]).next() {
                if !starts.contains(&p.assignment) {
                    starts.push(p.assignment);
                }
            }
        }
        let mut found = model.searched_from(task, &cfg.memory, &starts);
        found.sort();
        found.dedup();
        let out = if k % HOLD_OUT == HOLD_OUT - 1 {
            &mut held
        } else {
            &mut train
        };
        for assignment in found {
            let plan = Plan {
                devices: task.devices,
                assignment,
            };
            let m = oracle
                .measure(&task.tables, &plan)
                .with_context(|| format!("measuring a searched plan of `{}`", task.name))?;
            out.push(CostSample::new(task, &plan, m));
        }
    }
    Ok((train, held))
}

/// The cost network's mean and 90th-percentile relative error of the
/// iteration cost, `|predicted − measured| / measured`, on `samples`.
pub fn relative_error(model: &model::Model, samples: &[CostSample]) -> (f64, f64) {
    let mut errors: Vec<f64> = samples
        .chunks(256)
        .flat_map(|chunk| {
            let batch = model::nets::PlanBatch::new(chunk.iter().map(|s| &s.placed));
            let pred = tch::no_grad(|| model.cost.forward(&batch));
            let pred: Vec<f64> = model::tensor_vec(&pred.overall.to_kind(tch::Kind::Double));
            chunk
                .iter()
                .zip(pred)
                .map(|(s, p)| (p - s.measurement.cost_ms).abs() / s.measurement.cost_ms.max(1e-9))
                .collect::<Vec<_>>()
        })
        .collect();
    if errors.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    errors.sort_by(f64::total_cmp);
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    (mean, errors[(errors.len() * 9 / 10).min(errors.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_cfg() -> Config {
        let mut cfg = Config::default();
        cfg.pretrain.tasks = 4;
        cfg.pretrain.plans_per_task = 30;
        cfg.pretrain.space.devices_max = 4;
        cfg.pretrain.space.per_device_max = 4;
        cfg
    }

    #[test]
    fn the_bulk_holds_heuristics_search_visits_and_random_plans_that_fit() {
        let cfg = small_cfg();
        let tasks = tasks(&cfg);
        let task = &tasks[0];
        let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg).unwrap();
        let plans = bulk_of(task, &cfg, oracle.as_mut(), 7).unwrap();
        assert!(
            plans.len() >= cfg.pretrain.plans_per_task,
            "{}",
            plans.len()
        );
        let cap = task.cap_bytes();
        for (plan, m) in &plans {
            let mut used = vec![0u64; task.devices];
            for (t, &d) in task.tables.iter().zip(&plan.assignment) {
                used[d] += cfg.memory.table_bytes(t);
            }
            assert!(used.iter().all(|&u| u <= cap), "a plan over memory");
            assert!(m.cost_ms > 0.0);
        }
        let distinct: std::collections::HashSet<&Vec<usize>> =
            plans.iter().map(|(p, _)| &p.assignment).collect();
        assert!(
            distinct.len() > plans.len() / 3,
            "{} distinct",
            distinct.len()
        );
        // The same seed, the same bulk.
        let again = bulk_of(task, &cfg, oracle.as_mut(), 7).unwrap();
        assert_eq!(
            plans.iter().map(|p| &p.0.assignment).collect::<Vec<_>>(),
            again.iter().map(|p| &p.0.assignment).collect::<Vec<_>>()
        );
    }

    #[test]
    fn skewed_plans_pile_tables_on_few_devices_at_low_concentration() {
        let cfg = small_cfg();
        let task = Task {
            name: "t".into(),
            devices: 8,
            memory_gb: 1e6,
            tables: (0..64)
                .map(|i| common::Table::cold(format!("t{i}"), 1000, 16, 2.0))
                .collect(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let busiest = |alpha: f64, rng: &mut ChaCha8Rng| {
            let plan = skewed(&task, &cfg.memory, alpha, rng).unwrap();
            let mut n = [0usize; 8];
            plan.assignment.iter().for_each(|&d| n[d] += 1);
            *n.iter().max().unwrap()
        };
        let low: usize = (0..20).map(|_| busiest(0.05, &mut rng)).sum();
        let high: usize = (0..20).map(|_| busiest(5.0, &mut rng)).sum();
        assert!(low > 2 * high, "low α {low}, high α {high}");
    }

    #[test]
    fn every_twentieth_task_is_held_out() {
        let mut cfg = small_cfg();
        cfg.pretrain.tasks = 2 * HOLD_OUT;
        cfg.pretrain.plans_per_task = 12;
        let tasks = tasks(&cfg);
        let (train, held) = bulk(&cfg, &tasks, &|| {}).unwrap();
        assert!(!held.is_empty() && !train.is_empty());
        // A task's tables, by their features' bits.
        let key = |s: &CostSample| -> Vec<u32> {
            s.placed
                .features
                .iter()
                .flatten()
                .map(|f| f.to_bits())
                .collect()
        };
        let held_tasks: std::collections::HashSet<Vec<u32>> = held.iter().map(key).collect();
        assert!(train.iter().all(|s| !held_tasks.contains(&key(s))));
    }
}
