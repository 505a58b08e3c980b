//! The `search` reference: iterated local search on the oracle itself, to
//! show how far from the best known plan each method is.
//!
//! From a start plan (the best heuristic's), it proposes moving a table off
//! the slowest device, or swapping it with a table of another device, keeps
//! any proposal that lowers the cost (ties broken by the sum of squared
//! device totals, so it can make progress while the slowest device stays the
//! slowest), and after a stretch without progress perturbs the best plan with
//! a few random moves. Every proposal is one oracle measurement; the budget
//! counts them.

use actor::nets::DeviceHeads;
use benchworker::{Oracle, OracleError};
use common::{DeviceCost, Measurement, MemoryModel, Plan, Table};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use tch::{Kind, Tensor};

/// What a search found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub plan: Plan,
    pub cost_ms: f64,
    /// The start's cost.
    pub start_cost_ms: f64,
    /// Oracle measurements spent, the start's included.
    pub evaluations: usize,
}

impl Outcome {
    /// Whether the plan costs less than the start. The search's tie-break
    /// (balance below the bottleneck) helps it make progress, and on the
    /// oracle a plan that costs as much is as good; but `plan`, searching on
    /// the cost network, keeps its start unless this holds: where one
    /// device's cost is the iteration's whatever the others hold, it would
    /// trade a plan for one that only predicts as well.
    pub fn improved(&self) -> bool {
        self.cost_ms < self.start_cost_ms - 1e-5 * self.start_cost_ms.abs()
    }
}

fn key(m: &Measurement) -> (f64, f64) {
    (
        m.cost_ms,
        m.devices.iter().map(|d| d.total_ms * d.total_ms).sum(),
    )
}

fn better(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 < b.0 - 1e-12 || (a.0 <= b.0 + 1e-12 && a.1 < b.1 - 1e-12)
}

/// Moves and swaps that keep every device within its cap.
struct Neighbourhood<'a> {
    bytes: Vec<u64>,
    cap: u64,
    tables: &'a [Table],
}

impl Neighbourhood<'_> {
    /// A random feasible move or swap of a table on `from`; `None` if the
    /// draw was infeasible.
    fn propose(&self, plan: &Plan, from: usize, rng: &mut impl Rng) -> Option<Plan> {
        let on_from: Vec<usize> = (0..self.tables.len())
            .filter(|&i| plan.assignment[i] == from)
            .collect();
        if on_from.is_empty() || plan.devices < 2 {
            return None;
        }
        let i = on_from[rng.gen_range(0..on_from.len())];
        let mut to = rng.gen_range(0..plan.devices - 1);
        if to >= from {
            to += 1;
        }
        // The two devices' memory from the tables' bytes, found once.
        let used_from: u64 = on_from.iter().map(|&t| self.bytes[t]).sum();
        let on_to: Vec<usize> = (0..self.tables.len())
            .filter(|&j| plan.assignment[j] == to)
            .collect();
        let used_to: u64 = on_to.iter().map(|&t| self.bytes[t]).sum();
        let mut next = plan.clone();
        if rng.gen_bool(0.5) {
            if used_to.saturating_add(self.bytes[i]) > self.cap {
                return None;
            }
            next.assignment[i] = to;
        } else {
            if on_to.is_empty() {
                return None;
            }
            let j = on_to[rng.gen_range(0..on_to.len())];
            if (used_to - self.bytes[j]).saturating_add(self.bytes[i]) > self.cap
                || (used_from - self.bytes[i]).saturating_add(self.bytes[j]) > self.cap
            {
                return None;
            }
            next.assignment[i] = to;
            next.assignment[j] = from;
        }
        Some(next)
    }
}

/// Searches from `start` (which must fit `cap_bytes`) with at most `budget`
/// oracle measurements.
pub fn search(
    oracle: &mut dyn Oracle,
    tables: &[Table],
    start: &Plan,
    cap_bytes: u64,
    mem: &MemoryModel,
    budget: usize,
    rng: &mut impl Rng,
) -> Result<Outcome, OracleError> {
    let hood = Neighbourhood {
        bytes: tables.iter().map(|t| mem.table_bytes(t)).collect(),
        cap: cap_bytes,
        tables,
    };
    let mut cur = start.clone();
    let mut cur_m = oracle.measure(tables, &cur)?;
    let start_cost_ms = cur_m.cost_ms;
    let mut best = (cur.clone(), cur_m.clone());
    let mut evaluations = 1;
    let patience = (budget / 20).max(20);
    let mut since_progress = 0;
    let mut draws = 0usize;
    while evaluations < budget && draws < budget.saturating_mul(50) {
        draws += 1;
        let from = if rng.gen_bool(0.8) {
            slowest(&cur_m)
        } else {
            rng.gen_range(0..cur.devices)
        };
        let Some(cand) = hood.propose(&cur, from, rng) else {
            continue;
        };
        let m = oracle.measure(tables, &cand)?;
        evaluations += 1;
        if better(key(&m), key(&cur_m)) {
            cur = cand;
            cur_m = m;
            since_progress = 0;
            if better(key(&cur_m), key(&best.1)) {
                best = (cur.clone(), cur_m.clone());
            }
        } else {
            since_progress += 1;
        }
        if since_progress >= patience && evaluations < budget {
            // Perturb the best plan and measure the new starting point.
            cur = best.0.clone();
            for _ in 0..3 {
                let from = rng.gen_range(0..cur.devices);
                if let Some(p) = hood.propose(&cur, from, rng) {
                    cur = p;
                }
            }
            cur_m = oracle.measure(tables, &cur)?;
            evaluations += 1;
            since_progress = 0;
        }
    }
    Ok(Outcome {
        cost_ms: best.1.cost_ms,
        plan: best.0,
        start_cost_ms,
        evaluations,
    })
}

/// The cost network as an oracle, for [`search`] at `plan` time: each
/// device's (fwd, bwd, comm) from its summed table representations through
/// [`DeviceHeads`], composed as the measurement is (`fwd_comm` includes the
/// wait for the slowest forward), so the iteration cost is the network's
/// `max_d fwd + max_d (bwd + 2·comm)`.
///
/// A search proposal changes one or two devices of the plan it starts from,
/// so the costs of devices are cached by their set of tables (a sum of
/// random 64-bit keys per table): only the changed devices are re-costed,
/// and their summed projections are updated from the previous plan's by the
/// tables that moved, so a proposal's cost does not grow with the tables a
/// device holds (it grows linearly with the ensemble's members).
pub struct CostNetOracle {
    /// `[tables × projected width]` table projections (see
    /// [`DeviceHeads::project`]).
    projected: Vec<f32>,
    heads: DeviceHeads,
    keys: Vec<u64>,
    cache: HashMap<u64, [f32; 3], BuildHasherDefault<KeyHasher>>,
    /// The per-device summed projections of the last plan that needed them
    /// (none yet: empty).
    last: Sums,
}

/// Per-device sums of table projections for one assignment.
struct Sums {
    assignment: Vec<usize>,
    /// `[devices × projected width]`.
    sums: Vec<f32>,
    /// Incremental updates since the sums were last computed afresh (float
    /// rounding accumulates).
    updates: usize,
}

/// Incremental updates after which the sums are recomputed.
const REFRESH_SUMS: usize = 1024;

/// Tables moved since the sums' plan beyond which they are recomputed.
const MAX_MOVED: usize = 8;

/// The cache's keys are already random: they hash to themselves.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Entries after which the cache starts over (a few MB).
const CACHE_LIMIT: usize = 1 << 16;

impl CostNetOracle {
    /// `reps`: the cost network's `[tables, width]` table representations of
    /// the task the plans will be of.
    pub fn new(heads: DeviceHeads, reps: &Tensor, seed: u64) -> CostNetOracle {
        let reps = Vec::<f32>::try_from(reps.to_kind(Kind::Float).view([-1])).unwrap_or_default();
        let projected: Vec<f32> = reps
            .chunks_exact(heads.width().max(1))
            .flat_map(|r| heads.project(r))
            .collect();
        let tables = projected.len() / heads.projected_width().max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        CostNetOracle {
            keys: (0..tables).map(|_| rng.gen()).collect(),
            projected,
            heads,
            cache: HashMap::default(),
            last: Sums {
                assignment: Vec::new(),
                sums: Vec::new(),
                updates: 0,
            },
        }
    }

    /// Brings the per-device sums to `plan`: by the tables that moved since
    /// the plan they were last brought to when few did, afresh otherwise.
    fn update_sums(&mut self, plan: &Plan) {
        let w = self.heads.projected_width();
        let (projected, l) = (&self.projected, &mut self.last);
        let projection = |t: usize| &projected[t * w..(t + 1) * w];
        let few_moved = l.sums.len() == plan.devices * w
            && l.updates < REFRESH_SUMS
            && l.assignment
                .iter()
                .zip(&plan.assignment)
                .filter(|(a, b)| a != b)
                .take(MAX_MOVED + 1)
                .count()
                <= MAX_MOVED;
        if !few_moved {
            let mut sums = vec![0.0f32; plan.devices * w];
            for (t, &d) in plan.assignment.iter().enumerate() {
                for (s, &x) in sums[d * w..(d + 1) * w].iter_mut().zip(projection(t)) {
                    *s += x;
                }
            }
            *l = Sums {
                assignment: plan.assignment.clone(),
                sums,
                updates: 0,
            };
            return;
        }
        for (t, &to) in plan.assignment.iter().enumerate() {
            let from = l.assignment[t];
            if from == to {
                continue;
            }
            let (lo, hi) = l.sums.split_at_mut(from.max(to) * w);
            let (src, dst) = if from < to {
                (&mut lo[from * w..(from + 1) * w], &mut hi[..w])
            } else {
                (&mut hi[..w], &mut lo[to * w..(to + 1) * w])
            };
            for ((s, d), &x) in src.iter_mut().zip(dst.iter_mut()).zip(projection(t)) {
                *s -= x;
                *d += x;
            }
            l.assignment[t] = to;
        }
        l.updates += 1;
    }

    /// Device `d`'s costs under `plan`, from the cache or its summed
    /// projections (brought to `plan` once per plan, when first needed).
    fn device(&mut self, key: u64, plan: &Plan, d: usize, synced: &mut bool) -> [f32; 3] {
        if let Some(c) = self.cache.get(&key) {
            return *c;
        }
        if !*synced {
            self.update_sums(plan);
            *synced = true;
        }
        let w = self.heads.projected_width();
        let c = self.heads.finish(&self.last.sums[d * w..(d + 1) * w]);
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(key, c);
        c
    }
}

impl Oracle for CostNetOracle {
    fn name(&self) -> &'static str {
        "cost_net"
    }

    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        benchworker::oracle::check_plan(tables, plan)?;
        if tables.len() != self.keys.len() {
            return Err(OracleError::Backend {
                backend: "cost_net",
                message: format!(
                    "prepared for a task of {} tables, asked about {}",
                    self.keys.len(),
                    tables.len()
                ),
            });
        }
        let mut keys = vec![0u64; plan.devices];
        for (t, &d) in plan.assignment.iter().enumerate() {
            keys[d] = keys[d].wrapping_add(self.keys[t]);
        }
        let mut synced = false;
        let costs: Vec<[f32; 3]> = (0..plan.devices)
            .map(|d| self.device(keys[d], plan, d, &mut synced))
            .collect();
        let slowest = costs.iter().map(|c| c[0] as f64).fold(f64::MIN, f64::max);
        let devices: Vec<DeviceCost> = costs
            .iter()
            .map(|c| {
                let (fwd, bwd, comm) = (c[0] as f64, c[1] as f64, c[2] as f64);
                DeviceCost::new(fwd, bwd, slowest - fwd + comm, comm)
            })
            .collect();
        // The network's figure as it is, even below zero (an untrained one).
        let cost_ms = devices.iter().map(|d| d.total_ms).fold(f64::MIN, f64::max);
        Ok(Measurement { cost_ms, devices })
    }
}

fn slowest(m: &Measurement) -> usize {
    m.devices
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_ms.total_cmp(&b.1.total_ms))
        .map(|(d, _)| d)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchworker::sim::SimOracle;
    use common::config::SimConfig;
    use common::generate::{generate_pool, PoolGenConfig};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn pool(tables: usize, seed: u64) -> Vec<Table> {
        generate_pool(
            &PoolGenConfig {
                tables,
                ..Default::default()
            },
            seed,
        )
        .unwrap()
    }

    #[test]
    fn the_cost_network_oracle_predicts_what_the_cost_network_does() {
        use actor::nets::{CostNet, PlacedTables, PlanBatch};
        use common::config::ModelConfig;
        let tables = pool(24, 5);
        tch::manual_seed(1);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        // An ensemble of two: each member's heads read its own part.
        let cfg = ModelConfig {
            cost_members: 2,
            ..ModelConfig::default()
        };
        let net = CostNet::new(&vs.root(), &cfg);
        let features: Vec<_> = tables.iter().map(common::features::scaled).collect();
        let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&features)));
        let mut oracle = CostNetOracle::new(net.device_heads(), &reps, 0);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let plans: Vec<Plan> = (0..6)
            .map(|_| Plan {
                devices: 3,
                assignment: (0..tables.len()).map(|_| rng.gen_range(0..3)).collect(),
            })
            .collect();
        // Then a walk of single moves and swaps, longer than the sums'
        // refresh period (the sums are updated by the tables that moved).
        let mut walk = vec![plans[0].clone()];
        for _ in 0..1100 {
            let mut next = walk.last().unwrap().clone();
            for _ in 0..rng.gen_range(1..3) {
                let t = rng.gen_range(0..tables.len());
                next.assignment[t] = rng.gen_range(0..3);
            }
            walk.push(next);
        }
        // The same tables on 2 devices and back: the sums start afresh.
        let two = Plan {
            devices: 2,
            assignment: (0..tables.len()).map(|t| t % 2).collect(),
        };
        // The random plans twice over, so that the second pass comes from
        // the cache.
        for plan in plans
            .iter()
            .chain(&plans)
            .chain(&walk)
            .chain([&two, &plans[3], &two])
        {
            let got = oracle.measure(&tables, plan).unwrap();
            let batch = PlanBatch::new([&PlacedTables {
                features: features.clone(),
                assignment: plan.assignment.clone(),
                devices: plan.devices,
            }]);
            let want = tch::no_grad(|| net.forward(&batch));
            let expected = want.overall.double_value(&[0]);
            assert!(
                (got.cost_ms - expected).abs() < 1e-4 * (1.0 + expected.abs()),
                "{} vs {expected}",
                got.cost_ms
            );
            for (d, dev) in got.devices.iter().enumerate() {
                let fwd = want.per_device.double_value(&[d as i64, 0]);
                let bwd = want.per_device.double_value(&[d as i64, 1]);
                let comm = want.per_device.double_value(&[d as i64, 2]);
                for (g, w) in [
                    (dev.fwd_ms, fwd),
                    (dev.bwd_ms, bwd),
                    (dev.bwd_comm_ms, comm),
                ] {
                    assert!((g - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
                }
            }
        }
        let fewer = &tables[..10];
        assert!(oracle
            .measure(
                fewer,
                &Plan {
                    devices: 3,
                    assignment: vec![0; 10]
                }
            )
            .is_err());
    }

    #[test]
    fn search_improves_a_poor_start_within_budget_and_memory() {
        let tables = pool(30, 4);
        let mem = MemoryModel::default();
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        // Everything on device 0 of 4: a poor start.
        let start = Plan {
            devices: 4,
            assignment: vec![0; 30],
        };
        let start_cost = sim.evaluate(&tables, &start).cost_ms;
        let run = |sim: &mut SimOracle, start: &Plan, cap: u64, budget: usize, seed: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            search(sim, &tables, start, cap, &mem, budget, &mut rng).unwrap()
        };
        let out = run(&mut sim, &start, u64::MAX, 500, 0);
        assert!(out.evaluations <= 500);
        assert!(
            out.cost_ms < 0.5 * start_cost,
            "{} vs {start_cost}",
            out.cost_ms
        );
        assert_eq!(out.cost_ms, sim.evaluate(&tables, &out.plan).cost_ms);

        // With a cap, every plan it returns fits.
        let total: u64 = tables.iter().map(|t| mem.table_bytes(t)).sum();
        let cap = total / 3;
        let start = common::suite::first_fit_decreasing(&tables, 4, cap, &mem).unwrap();
        let start = Plan {
            devices: 4,
            assignment: start,
        };
        let out = run(&mut sim, &start, cap, 300, 1);
        assert!(out.plan.fits(&tables, &mem, cap));
    }

    #[test]
    fn a_search_that_only_ties_has_not_improved() {
        // One table far busier than the rest, alone on device 0: no plan
        // costs less, while moves among the other devices tie.
        let mut tables = pool(12, 6);
        tables[0] = Table::cold("busy", 2_000_000, 128, 2000.0);
        let mem = MemoryModel::default();
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        let start = Plan {
            devices: 3,
            assignment: (0..12)
                .map(|t| if t == 0 { 0 } else { 1 + t % 2 })
                .collect(),
        };
        let start_cost = sim.evaluate(&tables, &start).cost_ms;
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let out = search(&mut sim, &tables, &start, u64::MAX, &mem, 200, &mut rng).unwrap();
        assert_eq!(out.cost_ms, start_cost, "nothing beats the busy device");
        assert_ne!(out.plan, start, "the tie-break rebalanced the others");
        assert!(!out.improved());
        // With a gain to find, it finds it.
        let poor = Plan {
            devices: 3,
            assignment: vec![0; 12],
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let better = search(&mut sim, &tables, &poor, u64::MAX, &mem, 200, &mut rng).unwrap();
        assert!(better.improved());
        assert_eq!(better.start_cost_ms, sim.evaluate(&tables, &poor).cost_ms);
    }
}
