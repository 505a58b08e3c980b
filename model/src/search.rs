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
//!
//! Proposals are made and undone in place, on a plan whose memory per device
//! is kept up to date (and its tables per device, as of the last kept
//! move), so that a proposal costs what
//! its costing does: `plan` runs thousands of them on the cost network
//! ([`CostNetOracle`]) within its few milliseconds.

use crate::nets::DeviceHeads;
use common::oracle::{Oracle, OracleError};
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

/// What the search needs of a plan: its cost, and each device's total.
pub trait PlanCost {
    /// The iteration cost of `plan` (ms); each device's total into
    /// `totals` (one slot per device). `moved`, when known: the tables
    /// that may sit on another device than in the last plan this was asked
    /// about (the others sit where they did), for costings that update
    /// what they know of the last plan rather than start afresh.
    fn plan_cost(
        &mut self,
        tables: &[Table],
        plan: &Plan,
        moved: Option<&[usize]>,
        totals: &mut [f64],
    ) -> Result<f64, OracleError>;
}

/// Any oracle, through its measurement.
impl<O: Oracle + ?Sized> PlanCost for O {
    fn plan_cost(
        &mut self,
        tables: &[Table],
        plan: &Plan,
        _moved: Option<&[usize]>,
        totals: &mut [f64],
    ) -> Result<f64, OracleError> {
        let m = self.measure(tables, plan)?;
        for (t, d) in totals.iter_mut().zip(&m.devices) {
            *t = d.total_ms;
        }
        Ok(m.cost_ms)
    }
}

/// How a plan ranks: its cost, then the sum of its squared device totals.
#[derive(Debug, Clone, Copy)]
struct Score {
    cost: f64,
    balance: f64,
    /// The device with the largest total (the last of equals).
    slowest: usize,
}

impl Score {
    fn of(cost: f64, totals: &[f64]) -> Score {
        Score {
            cost,
            balance: totals.iter().map(|t| t * t).sum(),
            slowest: totals
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(d, _)| d)
                .unwrap_or(0),
        }
    }

    fn better(&self, than: &Score) -> bool {
        let (a, b) = ((self.cost, self.balance), (than.cost, than.balance));
        a.0 < b.0 - 1e-12 || (a.0 <= b.0 + 1e-12 && a.1 < b.1 - 1e-12)
    }
}

/// A plan with its tables per device (ascending) and bytes per device, and
/// the tables put elsewhere since it was last costed.
struct Placed {
    plan: Plan,
    /// The tables per device, as of the last kept move: a move being
    /// costed ([`Placed::try_move`]) is not in them.
    on: Vec<Vec<usize>>,
    used: Vec<u64>,
    /// Tables moved since the last costing; `None` before the first.
    moved: Option<Vec<usize>>,
}

impl Placed {
    fn new(plan: &Plan, bytes: &[u64]) -> Placed {
        let mut on = vec![Vec::new(); plan.devices];
        let mut used = vec![0u64; plan.devices];
        for (t, &d) in plan.assignment.iter().enumerate() {
            on[d].push(t);
            used[d] += bytes[t];
        }
        Placed {
            plan: plan.clone(),
            on,
            used,
            moved: None,
        }
    }

    /// Puts table `t` on device `to` in the plan and the bytes, not in the
    /// tables per device ([`Placed::list`] brings them along).
    fn shift(&mut self, t: usize, to: usize, bytes: &[u64]) {
        let from = self.plan.assignment[t];
        if from == to {
            return;
        }
        self.used[from] -= bytes[t];
        self.used[to] += bytes[t];
        self.plan.assignment[t] = to;
        if let Some(moved) = &mut self.moved {
            moved.push(t);
        }
    }

    /// Lists table `t` on device `to` rather than `from`.
    fn list(&mut self, t: usize, from: usize, to: usize) {
        if from == to {
            return;
        }
        if let Ok(k) = self.on[from].binary_search(&t) {
            self.on[from].remove(k);
        }
        if let Err(k) = self.on[to].binary_search(&t) {
            self.on[to].insert(k, t);
        }
    }

    /// The plan's score, with what moved since the last.
    fn score<C: PlanCost + ?Sized>(
        &mut self,
        oracle: &mut C,
        tables: &[Table],
        totals: &mut [f64],
    ) -> Result<Score, OracleError> {
        let cost = oracle.plan_cost(tables, &self.plan, self.moved.as_deref(), totals)?;
        match &mut self.moved {
            Some(moved) => moved.clear(),
            None => self.moved = Some(Vec::new()),
        }
        Ok(Score::of(cost, totals))
    }

    fn apply(&mut self, m: Move, bytes: &[u64]) {
        self.try_move(m, bytes);
        self.keep(m);
    }

    /// Makes move `m` in the plan and the bytes, for a costing; then
    /// [`Placed::keep`] or [`Placed::take_back`]. Most proposals are taken
    /// back: the tables per device are left as they are until one is kept.
    fn try_move(&mut self, m: Move, bytes: &[u64]) {
        self.shift(m.table, m.to, bytes);
        if let Some(j) = m.swap {
            self.shift(j, m.from, bytes);
        }
    }

    /// Keeps the move [`Placed::try_move`] made.
    fn keep(&mut self, m: Move) {
        self.list(m.table, m.from, m.to);
        if let Some(j) = m.swap {
            self.list(j, m.to, m.from);
        }
    }

    /// Takes back the move [`Placed::try_move`] made.
    fn take_back(&mut self, m: Move, bytes: &[u64]) {
        self.shift(m.table, m.from, bytes);
        if let Some(j) = m.swap {
            self.shift(j, m.to, bytes);
        }
    }
}

/// A table moved from one device to another, in exchange for one of the
/// other's when a swap.
#[derive(Debug, Clone, Copy)]
struct Move {
    table: usize,
    from: usize,
    to: usize,
    swap: Option<usize>,
}

/// Moves and swaps that keep every device within its cap.
struct Neighbourhood {
    bytes: Vec<u64>,
    cap: u64,
}

impl Neighbourhood {
    /// A random feasible move or swap of a table on `from`; `None` if the
    /// draw was infeasible. Not while a move is being costed: its tables
    /// are not yet listed where it put them.
    fn propose(&self, at: &Placed, from: usize, rng: &mut impl Rng) -> Option<Move> {
        let on_from = &at.on[from];
        let devices = at.plan.devices;
        if on_from.is_empty() || devices < 2 {
            return None;
        }
        let i = on_from[rng.gen_range(0..on_from.len())];
        let mut to = rng.gen_range(0..devices - 1);
        if to >= from {
            to += 1;
        }
        let (used_from, used_to) = (at.used[from], at.used[to]);
        let mut m = Move {
            table: i,
            from,
            to,
            swap: None,
        };
        if rng.gen_bool(0.5) {
            if used_to.saturating_add(self.bytes[i]) > self.cap {
                return None;
            }
        } else {
            let on_to = &at.on[to];
            if on_to.is_empty() {
                return None;
            }
            let j = on_to[rng.gen_range(0..on_to.len())];
            if (used_to - self.bytes[j]).saturating_add(self.bytes[i]) > self.cap
                || (used_from - self.bytes[i]).saturating_add(self.bytes[j]) > self.cap
            {
                return None;
            }
            m.swap = Some(j);
        }
        Some(m)
    }
}

/// Searches from `start` (which must fit `cap_bytes`) with at most `budget`
/// measurements of `oracle` (an [`Oracle`], or the cost network's
/// [`CostNetOracle`]).
pub fn search<C: PlanCost + ?Sized>(
    oracle: &mut C,
    tables: &[Table],
    start: &Plan,
    cap_bytes: u64,
    mem: &MemoryModel,
    budget: usize,
    rng: &mut impl Rng,
) -> Result<Outcome, OracleError> {
    common::oracle::check_plan(tables, start)?;
    let hood = Neighbourhood {
        bytes: tables.iter().map(|t| mem.table_bytes(t)).collect(),
        cap: cap_bytes,
    };
    let mut totals = vec![0.0; start.devices];
    let mut cur = Placed::new(start, &hood.bytes);
    let mut cur_s = cur.score(oracle, tables, &mut totals)?;
    let start_cost_ms = cur_s.cost;
    let mut best = (cur.plan.assignment.clone(), cur_s);
    let mut evaluations = 1;
    let patience = (budget / 20).max(20);
    let mut since_progress = 0;
    let mut draws = 0usize;
    while evaluations < budget && draws < budget.saturating_mul(50) {
        draws += 1;
        let from = if rng.gen_bool(0.8) {
            cur_s.slowest
        } else {
            rng.gen_range(0..cur.plan.devices)
        };
        let Some(m) = hood.propose(&cur, from, rng) else {
            continue;
        };
        cur.try_move(m, &hood.bytes);
        let s = cur.score(oracle, tables, &mut totals)?;
        evaluations += 1;
        if s.better(&cur_s) {
            cur.keep(m);
            cur_s = s;
            since_progress = 0;
            if cur_s.better(&best.1) {
                best = (cur.plan.assignment.clone(), cur_s);
            }
        } else {
            cur.take_back(m, &hood.bytes);
            since_progress += 1;
        }
        if since_progress >= patience && evaluations < budget {
            // Perturb the best plan and measure the new starting point.
            cur = Placed::new(
                &Plan {
                    devices: start.devices,
                    assignment: best.0.clone(),
                },
                &hood.bytes,
            );
            for _ in 0..3 {
                let from = rng.gen_range(0..cur.plan.devices);
                if let Some(m) = hood.propose(&cur, from, rng) {
                    cur.apply(m, &hood.bytes);
                }
            }
            cur_s = cur.score(oracle, tables, &mut totals)?;
            evaluations += 1;
            since_progress = 0;
            // The perturbation itself may have found a better plan.
            if cur_s.better(&best.1) {
                best = (cur.plan.assignment.clone(), cur_s);
            }
        }
    }
    Ok(Outcome {
        cost_ms: best.1.cost,
        plan: Plan {
            devices: start.devices,
            assignment: best.0,
        },
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
/// A search proposal changes one or two devices of the plan before it, so
/// each costing starts from the last plan's: the device keys (a sum of
/// random 64-bit keys per table) and costs of the devices whose tables did
/// not change are kept; a changed device's costs come from a cache by its
/// key, or from its summed projections, brought to the plan by the tables
/// that moved since they were last needed. Told which tables moved (see
/// [`PlanCost::plan_cost`]), a proposal's cost grows with neither the
/// tables of the task nor those of a device (it grows linearly with the
/// ensemble's members). Told or not, a plan's figures are the same, bit
/// for bit, until the cache starts over (after [`CACHE_LIMIT`] devices):
/// from then on a device's costs may be recomputed from sums rounded
/// otherwise.
#[derive(Clone)]
pub struct CostNetOracle {
    /// `[tables × projected width]` table projections (see
    /// [`DeviceHeads::project`]).
    /// Shared by the copies (one per search).
    projected: std::sync::Arc<[f32]>,
    heads: DeviceHeads,
    keys: Vec<u64>,
    cache: HashMap<u64, [f32; 3], BuildHasherDefault<KeyHasher>>,
    /// The last plan costed (none yet: empty), its device keys and its
    /// devices' costs.
    plan: Vec<usize>,
    dev_keys: Vec<u64>,
    costs: Vec<[f32; 3]>,
    /// Per-device summed projections, brought to the last plan when a
    /// device's costs are not cached.
    sums: Sums,
    /// Scratch: the devices whose tables changed since the last plan.
    changed: Vec<bool>,
}

/// Per-device sums of table projections for one assignment.
#[derive(Clone)]
struct Sums {
    assignment: Vec<usize>,
    /// `[devices × projected width]` (none yet: empty).
    sums: Vec<f32>,
    /// Incremental updates since the sums were last computed afresh (float
    /// rounding accumulates).
    updates: usize,
    /// The tables that may sit elsewhere in the last plan than in
    /// `assignment` (`None`: any).
    stale: Option<Vec<usize>>,
}

/// Incremental updates after which the sums are recomputed.
const REFRESH_SUMS: usize = 1024;

/// Tables moved since the sums' plan beyond which they are recomputed.
const MAX_MOVED: usize = 8;

/// The cache's keys are already random: they hash to themselves.
#[derive(Default, Clone)]
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

/// Entries the cache makes room for at once (a search of a few thousand
/// plans adds about one per plan): it need not grow step by step.
const CACHE_RESERVE: usize = 1 << 12;

/// Entries after which the cache starts over (a few MB).
pub const CACHE_LIMIT: usize = 1 << 16;

impl CostNetOracle {
    /// `reps`: the cost network's `[tables, width]` table representations of
    /// the task the plans will be of.
    pub fn new(heads: DeviceHeads, reps: &Tensor, seed: u64) -> CostNetOracle {
        let reps = crate::tensor_vec::<f32>(&reps.to_kind(Kind::Float));
        let projected = heads.project_rows(&reps);
        Self::from_projected(heads, projected, seed)
    }

    /// From the tables' projections already made (`[tables ×
    /// projected width]`, see [`DeviceHeads::project_rows`]).
    pub fn from_projected(heads: DeviceHeads, projected: Vec<f32>, seed: u64) -> CostNetOracle {
        let tables = projected.len() / heads.projected_width().max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        CostNetOracle {
            keys: (0..tables).map(|_| rng.gen()).collect(),
            projected: projected.into(),
            heads,
            cache: HashMap::with_capacity_and_hasher(CACHE_RESERVE, Default::default()),
            plan: Vec::new(),
            dev_keys: Vec::new(),
            costs: Vec::new(),
            sums: Sums {
                assignment: Vec::new(),
                sums: Vec::new(),
                updates: 0,
                stale: None,
            },
            changed: Vec::new(),
        }
    }

    /// Brings the per-device sums to the last plan: by the tables that
    /// moved since the plan they were last brought to when few did, in
    /// table order; afresh otherwise.
    fn update_sums(&mut self) {
        let w = self.heads.projected_width();
        let devices = self.dev_keys.len();
        let (projected, plan, l) = (&self.projected, &self.plan, &mut self.sums);
        let projection = |t: usize| &projected[t * w..(t + 1) * w];
        let fresh = l.sums.len() != devices * w
            || l.assignment.len() != plan.len()
            || l.updates >= REFRESH_SUMS;
        // Unknown: any table may have moved (a look at each costs far less
        // than summing afresh).
        let mut moved = l.stale.take().unwrap_or_else(|| (0..plan.len()).collect());
        if !fresh {
            moved.sort_unstable();
            moved.dedup();
            moved.retain(|&t| l.assignment[t] != plan[t]);
        }
        // Moving a table costs two of its additions, summing afresh one.
        if fresh || moved.len() > MAX_MOVED.max(plan.len() / 4) {
            let mut sums = vec![0.0f32; devices * w];
            for (t, &d) in plan.iter().enumerate() {
                crate::nets::add_into(&mut sums[d * w..(d + 1) * w], projection(t));
            }
            l.assignment.clone_from(plan);
            l.sums = sums;
            l.updates = 0;
            moved.clear();
            l.stale = Some(moved);
            return;
        }
        for &t in &moved {
            let (from, to) = (l.assignment[t], plan[t]);
            let (lo, hi) = l.sums.split_at_mut(from.max(to) * w);
            let (src, dst) = if from < to {
                (&mut lo[from * w..(from + 1) * w], &mut hi[..w])
            } else {
                (&mut hi[..w], &mut lo[to * w..(to + 1) * w])
            };
            crate::nets::move_between(src, dst, projection(t));
            l.assignment[t] = to;
        }
        l.updates += 1;
        moved.clear();
        l.stale = Some(moved);
    }

    /// Device `d`'s costs in the last plan (its key `key`), from the cache
    /// or its summed projections (brought to the plan once, when first
    /// needed).
    fn device(&mut self, key: u64, d: usize, synced: &mut bool) -> [f32; 3] {
        if let Some(c) = self.cache.get(&key) {
            return *c;
        }
        if !*synced {
            self.update_sums();
            *synced = true;
        }
        let w = self.heads.projected_width();
        let c = self.heads.finish(&self.sums.sums[d * w..(d + 1) * w]);
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(key, c);
        c
    }

    /// Makes `plan` the last plan: its device keys into `self.dev_keys`,
    /// each device's (fwd, bwd, comm) into `self.costs`. With `moved` (see
    /// [`PlanCost::plan_cost`]), from the last plan's by those tables.
    fn cost_devices(
        &mut self,
        tables: &[Table],
        plan: &Plan,
        moved: Option<&[usize]>,
    ) -> Result<(), OracleError> {
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
        if let Some(d) = self.heads.devices().filter(|&d| d != plan.devices) {
            return Err(OracleError::Backend {
                backend: "cost_net",
                message: format!(
                    "prepared for a task on {d} devices (its exchange heads hold the task's \
                     context), asked about a plan on {}",
                    plan.devices
                ),
            });
        }
        let moved = moved.filter(|_| {
            self.plan.len() == tables.len()
                && plan.assignment.len() == tables.len()
                && self.dev_keys.len() == plan.devices
        });
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        changed.resize(plan.devices, false);
        match moved {
            Some(moved) => {
                // Checked before anything changes: an error leaves the last
                // plan as it was.
                if let Some(&t) = moved
                    .iter()
                    .find(|&&t| t >= tables.len() || plan.assignment[t] >= plan.devices)
                {
                    self.changed = changed;
                    return Err(match plan.assignment.get(t) {
                        Some(&device) => OracleError::DeviceOutOfRange {
                            table: t,
                            device,
                            devices: plan.devices,
                        },
                        None => OracleError::Backend {
                            backend: "cost_net",
                            message: format!("table {t} moved, of {}", tables.len()),
                        },
                    });
                }
                for &t in moved {
                    let (was, now) = (self.plan[t], plan.assignment[t]);
                    if was == now {
                        continue;
                    }
                    self.dev_keys[was] = self.dev_keys[was].wrapping_sub(self.keys[t]);
                    self.dev_keys[now] = self.dev_keys[now].wrapping_add(self.keys[t]);
                    (changed[was], changed[now]) = (true, true);
                    self.plan[t] = now;
                    if let Some(stale) = &mut self.sums.stale {
                        stale.push(t);
                        if stale.len() > 64 * MAX_MOVED {
                            self.sums.stale = None;
                        }
                    }
                }
            }
            None => {
                common::oracle::check_plan(tables, plan)?;
                self.plan.clone_from(&plan.assignment);
                self.dev_keys.clear();
                self.dev_keys.resize(plan.devices, 0);
                for (t, &d) in plan.assignment.iter().enumerate() {
                    self.dev_keys[d] = self.dev_keys[d].wrapping_add(self.keys[t]);
                }
                self.costs.clear();
                self.costs.resize(plan.devices, [0.0; 3]);
                self.sums.stale = None;
                changed.fill(true);
            }
        }
        let mut synced = false;
        for (d, &changed) in changed.iter().enumerate() {
            if changed {
                self.costs[d] = self.device(self.dev_keys[d], d, &mut synced);
            }
        }
        self.changed = changed;
        Ok(())
    }

    /// Each device's costs composed as a measurement's are (`fwd_comm`
    /// includes the wait for the slowest forward).
    fn composed(&self) -> impl Iterator<Item = DeviceCost> + '_ {
        let slowest = self
            .costs
            .iter()
            .map(|c| c[0] as f64)
            .fold(f64::MIN, f64::max);
        self.costs.iter().map(move |c| {
            let (fwd, bwd, comm) = (c[0] as f64, c[1] as f64, c[2] as f64);
            DeviceCost::new(fwd, bwd, slowest - fwd + comm, comm)
        })
    }

    /// The network's prediction for `plan`, as a measurement.
    pub fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        self.cost_devices(tables, plan, None)?;
        let devices: Vec<DeviceCost> = self.composed().collect();
        // The network's figure as it is, even below zero (an untrained one).
        let cost_ms = devices.iter().map(|d| d.total_ms).fold(f64::MIN, f64::max);
        Ok(Measurement { cost_ms, devices })
    }
}

impl PlanCost for CostNetOracle {
    fn plan_cost(
        &mut self,
        tables: &[Table],
        plan: &Plan,
        moved: Option<&[usize]>,
        totals: &mut [f64],
    ) -> Result<f64, OracleError> {
        self.cost_devices(tables, plan, moved)?;
        let mut cost_ms = f64::MIN;
        for (d, c) in self.composed().enumerate() {
            if let Some(t) = totals.get_mut(d) {
                *t = c.total_ms;
            }
            cost_ms = cost_ms.max(c.total_ms);
        }
        Ok(cost_ms)
    }
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
        use crate::nets::{PlacedTables, PlanBatch};
        use common::config::ModelConfig;
        let tables = pool(24, 5);
        // An ensemble of two: each member's heads read its own part; and
        // one whose heads see the devices' widest tables.
        for cost_wide_dims in [vec![], vec![32, 64, 100]] {
            tch::manual_seed(1);
            let cfg = ModelConfig {
                cost_members: 2,
                cost_wide_dims,
                ..ModelConfig::default()
            };
            let (_vs, net, features, reps) = cost_net_of(&cfg, &tables);
            let mut oracle = CostNetOracle::new(net.device_heads(&reps, 3), &reps, 0);
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
    }

    /// Heads that hold a task's context cost that task's plans as the
    /// network does, and refuse a plan on another device count (whose
    /// exchanges they would get wrong) without losing the last plan.
    #[test]
    fn a_cost_net_oracle_with_context_keeps_to_its_device_count() {
        use crate::nets::{PlacedTables, PlanBatch};
        use common::config::ModelConfig;
        let tables = pool(12, 7);
        tch::manual_seed(3);
        let cfg = ModelConfig {
            cost_context: true,
            ..ModelConfig::default()
        };
        let (_vs, net, features, reps) = cost_net_of(&cfg, &tables);
        let mut oracle = CostNetOracle::new(net.device_heads(&reps, 4), &reps, 0);
        let plan = |devices: usize| Plan {
            devices,
            assignment: (0..tables.len()).map(|t| t % devices).collect(),
        };
        let expected = |p: &Plan| {
            let batch = PlanBatch::new([&PlacedTables {
                features: features.clone(),
                assignment: p.assignment.clone(),
                devices: p.devices,
            }]);
            tch::no_grad(|| net.forward(&batch))
                .overall
                .double_value(&[0])
        };
        let four = oracle.measure(&tables, &plan(4)).unwrap().cost_ms;
        let want = expected(&plan(4));
        assert!(
            (four - want).abs() < 1e-4 * (1.0 + want.abs()),
            "{four} vs {want}"
        );
        let err = oracle.measure(&tables, &plan(2)).unwrap_err().to_string();
        assert!(err.contains("4 devices") && err.contains("on 2"), "{err}");
        assert_eq!(oracle.measure(&tables, &plan(4)).unwrap().cost_ms, four);
    }

    /// A random cost network of `cfg` (its variables' store, kept alive
    /// beside it), the scaled features of `tables` and its table
    /// representations of them.
    fn cost_net_of(
        cfg: &common::config::ModelConfig,
        tables: &[Table],
    ) -> (
        tch::nn::VarStore,
        crate::nets::CostNet,
        Vec<[f32; common::NUM_FEATURES]>,
        Tensor,
    ) {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let net = crate::nets::CostNet::new(&vs.root(), cfg);
        let features: Vec<_> = tables.iter().map(common::features::scaled).collect();
        let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&features)));
        (vs, net, features, reps)
    }

    /// A cost network oracle over a random network of `cfg`, for a task of
    /// `tables`.
    fn cost_net_oracle(tables: &[Table], cfg: &common::config::ModelConfig) -> CostNetOracle {
        let (_vs, net, _, reps) = cost_net_of(cfg, tables);
        CostNetOracle::new(net.device_heads(&reps, 3), &reps, 0)
    }

    /// The cost network oracle told nothing of what moved: it costs every
    /// plan afresh.
    struct Afresh(CostNetOracle);

    impl PlanCost for Afresh {
        fn plan_cost(
            &mut self,
            tables: &[Table],
            plan: &Plan,
            _moved: Option<&[usize]>,
            totals: &mut [f64],
        ) -> Result<f64, OracleError> {
            self.0.plan_cost(tables, plan, None, totals)
        }
    }

    #[test]
    fn told_what_moved_the_cost_network_costs_as_it_does_afresh() {
        let tables = pool(40, 8);
        // The widest-table counts are moved with the rest.
        for cost_wide_dims in [vec![], vec![32, 64, 100]] {
            let cfg = common::config::ModelConfig {
                cost_wide_dims,
                ..Default::default()
            };
            let mut told = cost_net_oracle(&tables, &cfg);
            let mut fresh = told.clone();
            let mut compare =
                |told: &mut CostNetOracle, plan: &Plan, moved: &[usize], what: &str| {
                    let (mut a, mut b) = (vec![0.0; plan.devices], vec![0.0; plan.devices]);
                    let got = told.plan_cost(&tables, plan, Some(moved), &mut a).unwrap();
                    let want = fresh.plan_cost(&tables, plan, None, &mut b).unwrap();
                    assert_eq!(got, want, "{what}");
                    assert_eq!(a, b, "{what}");
                };
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let mut plan = Plan {
                devices: 5,
                assignment: (0..40).map(|_| rng.gen_range(0..5)).collect(),
            };
            let mut a = vec![0.0; 6];
            told.plan_cost(&tables, &plan, None, &mut a).unwrap();
            // A walk of moves, swaps and moves back (some tables named as moved
            // stay where they were, as an undone proposal's do), longer than the
            // sums' refresh period, now and then moving more tables than the
            // sums are updated by; the hints of a step name that step's tables.
            for step in 0..1500 {
                let mut moved = Vec::new();
                let n = if step % 50 == 7 {
                    12
                } else {
                    rng.gen_range(1..4)
                };
                for _ in 0..n {
                    let t = rng.gen_range(0..40);
                    moved.push(t);
                    if step % 3 != 0 {
                        plan.assignment[t] = rng.gen_range(0..5);
                    }
                }
                compare(&mut told, &plan, &moved, &format!("step {step}"));
            }
            // One table back and forth between cached plans, more often than
            // the tables awaiting the sums are listed; then a new plan.
            for k in 0..600 {
                plan.assignment[3] = k % 2;
                compare(&mut told, &plan, &[3], &format!("toggle {k}"));
            }
            plan.assignment[4] = (plan.assignment[4] + 1) % 5;
            compare(&mut told, &plan, &[4], "after the toggling");
            // The same tables on more devices: costed afresh, whatever the hint.
            let mut wider = Plan {
                devices: 6,
                assignment: plan.assignment.clone(),
            };
            wider.assignment[9] = 5;
            compare(&mut told, &wider, &[9], "six devices");
            // A moved table on a device the plan does not have: refused, and
            // the last plan stays what it was.
            wider.assignment[9] = 0;
            wider.assignment[7] = 6;
            let err = told.plan_cost(&tables, &wider, Some(&[9, 7]), &mut a);
            assert!(matches!(
                err,
                Err(OracleError::DeviceOutOfRange { table: 7, .. })
            ));
            wider.assignment[7] = 5;
            compare(&mut told, &wider, &[9, 7], "after the error");
        }
    }

    #[test]
    fn a_search_told_what_moved_finds_what_one_costing_afresh_does() {
        let tables = pool(60, 9);
        let mem = MemoryModel::default();
        let total: u64 = tables.iter().map(|t| mem.table_bytes(t)).sum();
        let cap = total / 2;
        let start = Plan {
            devices: 4,
            assignment: common::suite::first_fit_decreasing(&tables, 4, cap, &mem).unwrap(),
        };
        let oracle = cost_net_oracle(&tables, &Default::default());
        let run =
            |c: &mut dyn FnMut(&mut ChaCha8Rng) -> Outcome| c(&mut ChaCha8Rng::seed_from_u64(4));
        let told = run(&mut |rng| {
            search(&mut oracle.clone(), &tables, &start, cap, &mem, 1500, rng).unwrap()
        });
        let afresh = run(&mut |rng| {
            search(
                &mut Afresh(oracle.clone()),
                &tables,
                &start,
                cap,
                &mem,
                1500,
                rng,
            )
            .unwrap()
        });
        assert_eq!(told.plan, afresh.plan);
        assert_eq!(told.cost_ms, afresh.cost_ms);
        assert_eq!(told.evaluations, afresh.evaluations);
        assert!(told.plan.fits(&tables, &mem, cap));
        assert_ne!(told.plan, start, "a random network's search moved nothing");
    }

    #[test]
    fn moves_kept_or_taken_back_keep_the_tables_per_device_and_their_bytes() {
        let tables = pool(30, 2);
        let mem = MemoryModel::default();
        let bytes: Vec<u64> = tables.iter().map(|t| mem.table_bytes(t)).collect();
        let hood = Neighbourhood {
            bytes: bytes.clone(),
            cap: u64::MAX,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let start = Plan {
            devices: 3,
            assignment: (0..30).map(|_| rng.gen_range(0..3)).collect(),
        };
        let mut at = Placed::new(&start, &bytes);
        let (mut applied, mut taken_back) = (Vec::new(), 0);
        for _ in 0..300 {
            let from = rng.gen_range(0..3);
            if let Some(m) = hood.propose(&at, from, &mut rng) {
                at.try_move(m, &bytes);
                if rng.gen_bool(0.6) {
                    at.keep(m);
                    applied.push(m);
                } else {
                    at.take_back(m, &bytes);
                    taken_back += 1;
                }
            }
            let fresh = Placed::new(&at.plan, &bytes);
            assert_eq!(at.on, fresh.on);
            assert_eq!(at.used, fresh.used);
        }
        assert!(applied.len() > 100 && taken_back > 50);
        // Undone in reverse, each as the opposite move.
        for m in applied.into_iter().rev() {
            let back = Move {
                from: m.to,
                to: m.from,
                ..m
            };
            at.apply(back, &bytes);
        }
        assert_eq!(at.plan, start);
        let fresh = Placed::new(&start, &bytes);
        assert_eq!((at.on, at.used), (fresh.on, fresh.used));
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
