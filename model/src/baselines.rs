//! Placement heuristics to compare learnt placements against (DESIGN §8):
//! `random`, `round_robin`, DreamShard's greedy family (`size`, `dim`,
//! `lookup`, `size_lookup`), TorchRec's greedy perf partitioner, and the
//! `search` reference ([`crate::search`]). A method that finds no
//! memory-feasible plan returns `None`: a failure to report, never a task
//! to drop.

use common::{MemoryModel, Plan, Table, Task};
use rand::{Rng, SeedableRng};

use crate::torchrec;

/// A placement method `eval` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    Random,
    RoundRobin,
    Size,
    Dim,
    Lookup,
    SizeLookup,
    Torchrec,
    Search,
    /// A trained policy (needs a checkpoint).
    Policy,
}

impl Method {
    pub const ALL: [Method; 8] = [
        Method::Random,
        Method::RoundRobin,
        Method::Size,
        Method::Dim,
        Method::Lookup,
        Method::SizeLookup,
        Method::Torchrec,
        Method::Search,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Random => "random",
            Method::RoundRobin => "round_robin",
            Method::Size => "size",
            Method::Dim => "dim",
            Method::Lookup => "lookup",
            Method::SizeLookup => "size_lookup",
            Method::Torchrec => "torchrec",
            Method::Search => "search",
            Method::Policy => "policy",
        }
    }

    /// A heuristic places by a fixed rule; `search` measures, `policy` learns.
    pub fn is_heuristic(self) -> bool {
        !matches!(self, Method::Search | Method::Policy)
    }

    /// Parses `a,b,…` or `all`; the message lists the known names.
    pub fn parse_list(s: &str) -> Result<Vec<Method>, String> {
        if s.trim() == "all" {
            return Ok(Method::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let m = Method::ALL
                .into_iter()
                .chain([Method::Policy])
                .find(|m| m.name() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
                    format!(
                        "unknown method `{name}` (known: {}, policy, or all)",
                        known.join(", ")
                    )
                })?;
            if !out.contains(&m) {
                out.push(m);
            }
        }
        if out.is_empty() {
            return Err("no method given".into());
        }
        Ok(out)
    }
}

/// What a heuristic needs to know about a task.
pub struct Context<'a> {
    pub tables: &'a [Table],
    pub devices: usize,
    pub cap_bytes: u64,
    pub mem: &'a MemoryModel,
    /// Global batch, for TorchRec's estimator.
    pub batch: u64,
}

impl<'a> Context<'a> {
    /// A suite task's tables, devices and memory cap.
    pub fn for_task(task: &'a Task, mem: &'a MemoryModel, batch: u64) -> Context<'a> {
        Context {
            tables: &task.tables,
            devices: task.devices,
            cap_bytes: task.cap_bytes(),
            mem,
            batch,
        }
    }

    fn bytes(&self) -> Vec<u64> {
        self.tables
            .iter()
            .map(|t| self.mem.table_bytes(t))
            .collect()
    }
}

/// The plans that `methods` (heuristics) find for `task`, in that order,
/// those that find none left out; a heuristic that draws (`random`) draws
/// from seed 0.
pub fn plans_for<'a>(
    task: &'a Task,
    mem: &'a MemoryModel,
    batch: u64,
    methods: &'a [Method],
) -> impl Iterator<Item = Plan> + 'a {
    let ctx = Context::for_task(task, mem, batch);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    methods
        .iter()
        .filter_map(move |&m| place(m, &ctx, &mut rng))
}

/// Runs a heuristic. `search` is not one: see [`crate::search::search`].
pub fn place(method: Method, ctx: &Context, rng: &mut impl Rng) -> Option<Plan> {
    match method {
        Method::Random => random(ctx, rng),
        Method::RoundRobin => round_robin(ctx),
        Method::Size => greedy(ctx, |t| ctx.mem.table_bytes(t) as f64),
        Method::Dim => greedy(ctx, |t| t.dim as f64),
        Method::Lookup => greedy(ctx, lookup_cost),
        Method::SizeLookup => greedy(ctx, |t| lookup_cost(t) * (t.rows as f64).log10()),
        Method::Torchrec => {
            torchrec::partition(ctx.tables, ctx.devices, ctx.cap_bytes, ctx.mem, ctx.batch)
        }
        Method::Search | Method::Policy => None,
    }
}

fn lookup_cost(t: &Table) -> f64 {
    t.dim as f64 * t.pooling_factor
}

/// Each table on a uniformly drawn device among those it still fits.
fn random(ctx: &Context, rng: &mut impl Rng) -> Option<Plan> {
    let bytes = ctx.bytes();
    let mut free = vec![ctx.cap_bytes; ctx.devices];
    let mut assignment = Vec::with_capacity(ctx.tables.len());
    for &b in &bytes {
        let legal: Vec<usize> = (0..ctx.devices).filter(|&d| free[d] >= b).collect();
        if legal.is_empty() {
            return None;
        }
        let d = legal[rng.gen_range(0..legal.len())];
        free[d] -= b;
        assignment.push(d);
    }
    Some(Plan {
        devices: ctx.devices,
        assignment,
    })
}

/// Table `i` on device `i mod D`, or the next device round that fits.
fn round_robin(ctx: &Context) -> Option<Plan> {
    let bytes = ctx.bytes();
    let mut free = vec![ctx.cap_bytes; ctx.devices];
    let mut assignment = Vec::with_capacity(ctx.tables.len());
    for (i, &b) in bytes.iter().enumerate() {
        let d = (0..ctx.devices)
            .map(|k| (i + k) % ctx.devices)
            .find(|&d| free[d] >= b)?;
        free[d] -= b;
        assignment.push(d);
    }
    Some(Plan {
        devices: ctx.devices,
        assignment,
    })
}

/// DreamShard's greedy: tables by `cost` descending, each on the device with
/// the lowest running cost sum among those it fits (ties: lower bytes).
fn greedy(ctx: &Context, cost: impl Fn(&Table) -> f64) -> Option<Plan> {
    let bytes = ctx.bytes();
    let costs: Vec<f64> = ctx.tables.iter().map(cost).collect();
    let mut order: Vec<usize> = (0..ctx.tables.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
    let mut sum = vec![0.0f64; ctx.devices];
    let mut used = vec![0u64; ctx.devices];
    let mut assignment = vec![0; ctx.tables.len()];
    for i in order {
        let d = (0..ctx.devices)
            .filter(|&d| used[d].saturating_add(bytes[i]) <= ctx.cap_bytes)
            .min_by(|&a, &b| {
                sum[a]
                    .total_cmp(&sum[b])
                    .then(used[a].cmp(&used[b]))
                    .then(a.cmp(&b))
            })?;
        sum[d] += costs[i];
        used[d] += bytes[i];
        assignment[i] = d;
    }
    Some(Plan {
        devices: ctx.devices,
        assignment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{Optimizer, Precision};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn table(i: usize, rows: u64, dim: u32, pooling: f64) -> Table {
        Table::cold(format!("t{i}"), rows, dim, pooling)
    }

    const MEM: MemoryModel = MemoryModel {
        precision: Precision::Fp32,
        optimizer: Optimizer::Sgd,
    };

    fn ctx(tables: &[Table], devices: usize, cap: u64) -> Context<'_> {
        Context {
            tables,
            devices,
            cap_bytes: cap,
            mem: &MEM,
            batch: 1024,
        }
    }

    #[test]
    fn parse_list_accepts_all_and_rejects_unknown_names() {
        assert_eq!(Method::parse_list("all").unwrap().len(), 8);
        assert_eq!(
            Method::parse_list("size, dim,size").unwrap(),
            vec![Method::Size, Method::Dim]
        );
        let e = Method::parse_list("size,best").unwrap_err();
        assert!(e.contains("`best`") && e.contains("size_lookup"), "{e}");
    }

    #[test]
    fn greedy_lookup_balances_dim_times_pooling() {
        // Costs 8·10=80, 8·6=48, 8·5=40, 8·3=24, 8·2=16 on two devices:
        // 80 → d0; 48 → d1; 40 → d1 (88); 24 → d0 (104); 16 → d1 (104).
        let tables: Vec<Table> = [10.0, 6.0, 5.0, 3.0, 2.0]
            .iter()
            .enumerate()
            .map(|(i, &p)| table(i, 100, 8, p))
            .collect();
        let plan = place(
            Method::Lookup,
            &ctx(&tables, 2, u64::MAX),
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        assert_eq!(plan.assignment, vec![0, 1, 1, 0, 1]);
    }

    #[test]
    fn greedy_ties_go_to_the_device_with_fewer_bytes() {
        // `dim` sees equal costs everywhere: after t0 (big) on device 0 and
        // t1 on device 1, t2 ties on cost sum and goes where fewer bytes are.
        let tables = vec![
            table(0, 5000, 8, 1.0),
            table(1, 100, 8, 1.0),
            table(2, 100, 8, 1.0),
        ];
        let plan = place(
            Method::Dim,
            &ctx(&tables, 2, u64::MAX),
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        assert_eq!(plan.assignment, vec![0, 1, 1]);
    }

    #[test]
    fn heuristics_respect_memory_and_fail_when_nothing_fits() {
        let tables: Vec<Table> = (0..8).map(|i| table(i, 1000, 16, 1.0 + i as f64)).collect();
        let one = MEM.table_bytes(&tables[0]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for m in Method::ALL.into_iter().filter(|m| m.is_heuristic()) {
            let plan = place(m, &ctx(&tables, 4, 2 * one), &mut rng)
                .unwrap_or_else(|| panic!("{} found no plan", m.name()));
            assert!(plan.fits(&tables, &MEM, 2 * one), "{}", m.name());
            assert!(
                place(m, &ctx(&tables, 3, 2 * one), &mut rng).is_none(),
                "{}",
                m.name()
            );
        }
    }

    #[test]
    fn round_robin_cycles_and_random_is_seeded() {
        let tables: Vec<Table> = (0..6).map(|i| table(i, 10, 4, 1.0)).collect();
        let c = ctx(&tables, 3, u64::MAX);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let plan = place(Method::RoundRobin, &c, &mut rng).unwrap();
        assert_eq!(plan.assignment, vec![0, 1, 2, 0, 1, 2]);
        let a = place(Method::Random, &c, &mut ChaCha8Rng::seed_from_u64(3)).unwrap();
        let b = place(Method::Random, &c, &mut ChaCha8Rng::seed_from_u64(3)).unwrap();
        assert_eq!(a, b);
    }
}
