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

use benchworker::{Oracle, OracleError};
use common::{Measurement, MemoryModel, Plan, Table};
use rand::Rng;

/// What a search found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub plan: Plan,
    pub cost_ms: f64,
    /// Oracle measurements spent, the start's included.
    pub evaluations: usize,
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
    mem: &'a MemoryModel,
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
        let used = plan.device_bytes(self.tables, self.mem);
        let mut next = plan.clone();
        if rng.gen_bool(0.5) {
            if used[to].saturating_add(self.bytes[i]) > self.cap {
                return None;
            }
            next.assignment[i] = to;
        } else {
            let on_to: Vec<usize> = (0..self.tables.len())
                .filter(|&j| plan.assignment[j] == to)
                .collect();
            if on_to.is_empty() {
                return None;
            }
            let j = on_to[rng.gen_range(0..on_to.len())];
            if (used[to] - self.bytes[j]).saturating_add(self.bytes[i]) > self.cap
                || (used[from] - self.bytes[i]).saturating_add(self.bytes[j]) > self.cap
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
        mem,
    };
    let mut cur = start.clone();
    let mut cur_m = oracle.measure(tables, &cur)?;
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
        evaluations,
    })
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

    #[test]
    fn search_improves_a_poor_start_within_budget_and_memory() {
        let tables = generate_pool(
            &PoolGenConfig {
                tables: 30,
                ..Default::default()
            },
            4,
        )
        .unwrap();
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
}
