//! `cpu`: the measuring engine ([`crate::engine`]) on this machine's CPU:
//! each device's tables in one kernel, forward and backward, with the
//! all-to-all done as real memory movement between device buffers
//! (DESIGN §6). It measures the effects the `sim` backend models — fusion,
//! locality, exchange volume — on a kernel that really runs. `cpu.kernel`
//! picks it: FBGEMM's table-batched embedding (`fbgemm`, the default), or
//! libtorch's `embedding_bag` (`torch`); both apply `memory.optimizer`'s
//! step to the rows looked up (FBGEMM: SGD, AdaGrad or row-wise AdaGrad).
//!
//! One iteration, for a plan over `D` devices and a batch of `B` samples:
//! - *weights*: each device's tables, rows capped at `cpu.max_rows`, in
//!   `memory.precision` for FBGEMM's kernel, in fp32 for libtorch's (its
//!   half-precision `embedding_bag` on the CPU is a slow fallback path,
//!   not a model of the GPU's fp16 kernel);
//! - *lookups*: [`crate::indices`], deterministic from `cpu.seed` and the
//!   table's name, generated once per table and kept between measurements
//!   ([`LookupCache`]);
//! - *forward*: each device's kernel gives its `[B, S_d]` pooled output;
//! - *forward all-to-all*: device `d` copies to every device `e` (itself
//!   included, as NCCL does) its output's rows of `e`'s `B/D` samples
//!   ([`crate::layout`]);
//! - *backward all-to-all*: the reverse — device `d` gathers its tables'
//!   output gradients from every peer into its `[B, S_d]` gradient;
//! - *backward*: the kernel's backward, the optimizer's step fused.
//!
//! There is one CPU, so devices are timed one after another with
//! [`Instant`]; each phase's figure is its median over `cpu.repeats` rounds
//! after `cpu.warmup` unmeasured ones. As in `sim`, the forward all-to-all is
//! a collective that starts when the slowest device arrives:
//! `fwd_comm_d = max_e fwd_e − fwd_d + copy_d`, and `bwd_comm_d = copy_d`.
//!
//! *Memory*: before allocating anything, a measurement estimates what it
//! will take (`Footprint`: weights and optimizer state, outputs and
//! gradients, lookups) and is refused, with an error naming the largest
//! device and table and saying which of `cpu.max_rows` and `cpu.batch` to
//! lower, when that is more than [`MEMORY_SHARE`] of the memory
//! `/proc/meminfo` says is available, or that the process's memory cgroup
//! (a container's limit) leaves where that is less (a fixed
//! [`FALLBACK_MEMORY`] where neither can be read), or when it draws more
//! than [`MAX_LOOKUPS`] lookups. An allocation that fails nonetheless is an
//! error too, never a panic.

use std::time::Instant;

use common::config::{CpuConfig, Kernel};
use common::{Measurement, MemoryModel, Plan, Precision, Table};
use tch::{Device, TchError};

use crate::engine::{copy_transfers, DeviceEngine, EngineSpec};
use crate::indices::{self, LookupCache, Lookups};
use crate::layout::{PlanLayout, Transfer};
use crate::oracle::{check_plan, Oracle, OracleError, Spread};
use crate::timing::{self, Phases};

const BACKEND: &str = "cpu";
const LEARNING_RATE: f64 = 1e-3;
/// Most lookups one measurement may draw, whatever the memory. On one core
/// here, generating them takes about 0.4 s per million (once: they are
/// kept) and each round 0.05 s per million, so this cap keeps a measurement
/// under a minute at the default 7 rounds; the whole 856-table trace at the
/// default `cpu.batch` (2048) draws 27.7 million.
pub const MAX_LOOKUPS: f64 = (1u64 << 26) as f64;
/// Bytes a lookup takes at a measurement's peak: its generation's
/// temporaries, its copies in the cache and in its device's fused lookups,
/// the backward's sort and segment reduction. Measured here as the peak
/// resident memory of single-table measurements of 8 and 17 million lookups,
/// less that of a tiny one: 79 to 80 bytes.
const LOOKUP_BYTES: f64 = 80.0;
const F32_BYTES: f64 = 4.0;
const GIB: f64 = (1u64 << 30) as f64;
/// Share of the memory this machine has available (`MemAvailable` in
/// `/proc/meminfo`, read before each measurement) that one measurement may
/// take: the rest is a margin for the estimate's error and for the other
/// processes on the host. Several `cpu` benchworkers on one host each see
/// what the others hold already, but not what they are about to allocate.
pub const MEMORY_SHARE: f64 = 0.75;
/// What one measurement may take where `/proc/meminfo` cannot be read.
pub const FALLBACK_MEMORY: f64 = 8.0 * GIB;
/// Lookups kept between measurements (about 16 bytes each), so that plans
/// over the same tables do not generate them again.
const LOOKUP_CACHE: i64 = 1 << 25;

fn backend_error(e: impl ToString) -> OracleError {
    OracleError::Backend {
        backend: BACKEND,
        message: e.to_string(),
    }
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// The `cpu` oracle. Keeps the tables' lookups between measurements.
pub struct CpuOracle {
    cfg: CpuConfig,
    spec: EngineSpec,
    /// Repeat-to-repeat spread of the last measurement's iteration cost.
    last_spread: Option<Spread>,
    /// Each table's lookups, generated once for all the plans measured.
    lookups: LookupCache,
}

/// How the `cpu` backend builds its devices' work: `cpu.kernel` with
/// `memory.optimizer`, in `memory.precision` for FBGEMM's kernel and fp32
/// for libtorch's (see the module's doc).
fn engine_spec(cfg: &CpuConfig, mem: &MemoryModel) -> EngineSpec {
    let precision = match cfg.kernel {
        Kernel::Fbgemm => mem.precision,
        Kernel::Torch => Precision::Fp32,
    };
    EngineSpec {
        device: Device::Cpu,
        kernel: cfg.kernel,
        precision,
        optimizer: mem.optimizer,
        learning_rate: LEARNING_RATE,
    }
}

impl CpuOracle {
    pub fn new(cfg: CpuConfig, mem: MemoryModel) -> Result<Self, OracleError> {
        cfg.validate().map_err(backend_error)?;
        let spec = engine_spec(&cfg, &mem);
        if spec.precision != mem.precision {
            tracing::debug!(
                "cpu backend: libtorch's weights are measured in fp32 (CPU half precision is slow)"
            );
        }
        spec.check().map_err(backend_error)?;
        if cfg.threads > 0 {
            let threads = i32::try_from(cfg.threads).map_err(|_| {
                backend_error(format!("cpu.threads = {} is too large", cfg.threads))
            })?;
            tch::set_num_threads(threads);
        }
        Ok(CpuOracle {
            lookups: LookupCache::new(cfg.seed, cfg.batch, cfg.max_rows, Device::Cpu, LOOKUP_CACHE),
            cfg,
            spec,
            last_spread: None,
        })
    }

    /// Refuses a plan whose measurement would take more memory than
    /// `budget`, saying what to lower.
    fn check_memory(
        &self,
        tables: &[Table],
        plan: &Plan,
        budget: &Budget,
    ) -> Result<(), OracleError> {
        let f = Footprint::of(tables, plan, &self.cfg, &self.spec);
        tracing::debug!(
            "cpu backend: the plan takes about {:.3} GiB ({:.3} weights, {:.3} outputs, \
             {:.3} lookups) of the {:.3} GiB {}",
            f.total() / GIB,
            f.weights / GIB,
            f.outputs / GIB,
            f.lookups / GIB,
            budget.bytes / GIB,
            budget.source
        );
        if f.total() <= budget.bytes {
            return Ok(());
        }
        Err(backend_error(f.refusal(tables, &self.cfg, budget)))
    }

    fn run(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, TchError> {
        let mut it = Iteration::build(tables, plan, &self.cfg, self.spec, &mut self.lookups)?;
        for _ in 0..self.cfg.warmup {
            it.round()?;
        }
        let rounds = (0..self.cfg.repeats.max(1))
            .map(|_| it.round())
            .collect::<Result<Vec<_>, _>>()?;
        let (m, spread) =
            timing::assemble(&rounds).ok_or_else(|| TchError::Kind("no timed repeat".into()))?;
        self.last_spread = Some(spread);
        Ok(m)
    }
}

impl Oracle for CpuOracle {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        check_plan(tables, plan)?;
        self.last_spread = None;
        let per_table: Vec<f64> = tables
            .iter()
            .map(|t| indices::lookups_per_batch(t, self.cfg.batch))
            .collect();
        let lookups: f64 = per_table.iter().sum();
        if lookups > MAX_LOOKUPS {
            let busiest = busiest(&per_table).unwrap_or(0);
            return Err(backend_error(format!(
                "the plan draws {lookups:.0} lookups per iteration at cpu.batch = {} \
                 (table `{}` {:.0} of them), more than the {MAX_LOOKUPS:.0} one \
                 measurement may draw; lower cpu.batch",
                self.cfg.batch, tables[busiest].name, per_table[busiest]
            )));
        }
        self.check_memory(tables, plan, &Budget::here())?;
        self.run(tables, plan).map_err(backend_error)
    }

    fn kernel(&self) -> Option<&'static str> {
        Some(self.cfg.kernel.name())
    }

    fn spread(&self) -> Option<Spread> {
        self.last_spread
    }
}

/// How much memory one measurement may take, and where the figure comes from.
#[derive(Debug, Clone, PartialEq)]
struct Budget {
    bytes: f64,
    /// Says where `bytes` comes from, after "the N GiB".
    source: String,
}

impl Budget {
    /// [`MEMORY_SHARE`] of this machine's available memory, or of what
    /// this process's memory cgroup (a container's limit) leaves where that
    /// is less, or [`FALLBACK_MEMORY`] where `/proc/meminfo` cannot be read.
    fn here() -> Budget {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        // cgroup v2, then v1.
        let room = cgroup_room(
            read("/sys/fs/cgroup/memory.max").as_deref(),
            read("/sys/fs/cgroup/memory.current").as_deref(),
        )
        .or_else(|| {
            cgroup_room(
                read("/sys/fs/cgroup/memory/memory.limit_in_bytes").as_deref(),
                read("/sys/fs/cgroup/memory/memory.usage_in_bytes").as_deref(),
            )
        });
        Budget::from_sources(read("/proc/meminfo").as_deref(), room)
    }

    #[cfg(test)]
    fn from_meminfo(meminfo: Option<&str>) -> Budget {
        Budget::from_sources(meminfo, None)
    }

    fn from_sources(meminfo: Option<&str>, cgroup_room: Option<f64>) -> Budget {
        let available = meminfo.and_then(mem_available);
        match (available, cgroup_room) {
            (a, Some(room)) if a.is_none_or(|a| room < a) => Budget {
                bytes: MEMORY_SHARE * room,
                source: format!(
                    "one measurement may take ({:.0} % of the {:.1} GiB this process's \
                     memory cgroup leaves below its limit)",
                    100.0 * MEMORY_SHARE,
                    room / GIB
                ),
            },
            (Some(available), _) => Budget {
                bytes: MEMORY_SHARE * available,
                source: format!(
                    "one measurement may take ({:.0} % of the {:.1} GiB /proc/meminfo \
                     says are available)",
                    100.0 * MEMORY_SHARE,
                    available / GIB
                ),
            },
            (None, _) => Budget {
                bytes: FALLBACK_MEMORY,
                source: "one measurement may take where /proc/meminfo cannot be read".into(),
            },
        }
    }
}

/// What a memory cgroup's limit leaves above its usage, in bytes (`None`
/// without a limit: v2's `max`, or v1's near-2^63 "unlimited").
fn cgroup_room(limit: Option<&str>, usage: Option<&str>) -> Option<f64> {
    let limit: u64 = limit?.trim().parse().ok()?;
    let usage: u64 = usage?.trim().parse().ok()?;
    (limit < 1 << 60).then(|| limit.saturating_sub(usage) as f64)
}

/// `MemAvailable` of a `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<f64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: f64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024.0)
}

/// The table with the most lookups, first among equals.
fn busiest(lookups: &[f64]) -> Option<usize> {
    (0..lookups.len()).reduce(|a, b| if lookups[b] > lookups[a] { b } else { a })
}

/// What one measurement will allocate, in bytes, by what for, and who asks
/// for most of it.
#[derive(Debug, Clone, PartialEq)]
struct Footprint {
    /// The devices' weights (each table's capped rows × its own dim, in the
    /// kernel's precision) and `memory.optimizer`'s state beside them.
    weights: f64,
    /// Per device, its pooled output and its output gradient (`[B, S_d]`
    /// fp32 each); the exchange's receive and send buffers (`[B_e, Σ S]`
    /// each); at the device with the most, the backward's temporaries: two
    /// more copies of its output gradient, and its per-row gradients
    /// (`[unique rows, widest dim]`, unique rows at most its lookups and
    /// its rows). Devices run one at a time.
    outputs: f64,
    /// [`LOOKUP_BYTES`] per lookup.
    lookups: f64,
    /// The device with the largest weights, its widest table and its rows.
    heaviest: Option<(usize, usize, f64)>,
    /// The table with the most lookups.
    busiest: Option<usize>,
}

impl Footprint {
    /// The footprint of measuring `plan` as `spec` builds it.
    fn of(tables: &[Table], plan: &Plan, cfg: &CpuConfig, spec: &EngineSpec) -> Footprint {
        let batch = cfg.batch as f64;
        let per_table: Vec<f64> = tables
            .iter()
            .map(|t| indices::lookups_per_batch(t, cfg.batch))
            .collect();
        let weight_bytes = match spec.precision {
            Precision::Fp16 => 2.0,
            Precision::Fp32 => F32_BYTES,
        };
        let (mut weights, mut temporaries) = (0.0, 0.0f64);
        let mut heaviest: Option<(usize, usize, f64, f64)> = None;
        for (d, group) in plan.groups().iter().enumerate() {
            let Some(&widest) = group.iter().max_by_key(|&&t| tables[t].dim) else {
                continue;
            };
            let (mut bytes, mut rows, mut lookups, mut dims) = (0.0, 0.0, 0.0, 0.0);
            for &t in group {
                let r = indices::capped_rows(&tables[t], cfg.max_rows);
                bytes += r as f64 * f64::from(tables[t].dim) * weight_bytes
                    + spec.optimizer.state_bytes(r, tables[t].dim) as f64;
                rows += r as f64;
                lookups += per_table[t];
                dims += f64::from(tables[t].dim);
            }
            weights += bytes;
            if heaviest.is_none_or(|(_, _, _, b)| bytes > b) {
                heaviest = Some((d, widest, rows, bytes));
            }
            let widest_dim = f64::from(tables[widest].dim);
            let backward = 2.0 * batch * dims + lookups.min(rows) * widest_dim;
            temporaries = temporaries.max(backward * F32_BYTES);
        }
        let dims: f64 = tables.iter().map(|t| f64::from(t.dim)).sum();
        Footprint {
            weights,
            outputs: 4.0 * batch * dims * F32_BYTES + temporaries,
            lookups: per_table.iter().sum::<f64>() * LOOKUP_BYTES,
            heaviest: heaviest.map(|(d, t, rows, _)| (d, t, rows)),
            busiest: busiest(&per_table),
        }
    }

    fn total(&self) -> f64 {
        self.weights + self.outputs + self.lookups
    }

    /// Why a plan of this footprint is refused, and what to lower.
    fn refusal(&self, tables: &[Table], cfg: &CpuConfig, budget: &Budget) -> String {
        let gib = |b: f64| b / GIB;
        let mut parts = Vec::new();
        if let Some((d, t, rows)) = self.heaviest {
            parts.push(format!(
                "{:.1} GiB of weights and optimizer state (the largest, device {d}'s: \
                 {rows:.0} rows, each table's capped at cpu.max_rows, its widest table `{}` \
                 of dim {})",
                gib(self.weights),
                tables[t].name,
                tables[t].dim
            ));
        }
        parts.push(format!(
            "{:.1} GiB of outputs and gradients",
            gib(self.outputs)
        ));
        if let Some(t) = self.busiest {
            parts.push(format!(
                "{:.1} GiB of lookups (table `{}` draws the most, {:.0} per iteration)",
                gib(self.lookups),
                tables[t].name,
                indices::lookups_per_batch(&tables[t], cfg.batch)
            ));
        }
        let lower = if self.weights >= self.outputs + self.lookups {
            format!(
                "lower cpu.max_rows (now {}) to shrink the weights, or cpu.batch (now {})",
                cfg.max_rows, cfg.batch
            )
        } else {
            format!(
                "lower cpu.batch (now {}) to shrink the lookups and outputs, or \
                 cpu.max_rows (now {})",
                cfg.batch, cfg.max_rows
            )
        };
        format!(
            "measuring the plan would take about {:.1} GiB: {}; more than the {:.1} GiB {}; {lower}",
            gib(self.total()),
            parts.join(", "),
            gib(budget.bytes),
            budget.source
        )
    }
}

/// Everything one plan's iterations need: every device's engine, and the
/// all-to-all's transfers by the device that times them.
struct Iteration {
    engines: Vec<DeviceEngine>,
    /// The forward exchange's transfers, by sender.
    sends: Vec<Vec<Transfer>>,
    /// The backward exchange's transfers, by receiver: a device gathers its
    /// tables' gradients.
    gathers: Vec<Vec<Transfer>>,
}

impl Iteration {
    fn build(
        tables: &[Table],
        plan: &Plan,
        cfg: &CpuConfig,
        spec: EngineSpec,
        lookups: &mut LookupCache,
    ) -> Result<Self, TchError> {
        let layout = PlanLayout::new(tables, plan, cfg.batch, cfg.max_rows);
        let engines = (0..plan.devices)
            .map(|d| {
                let of_device = layout.devices[d]
                    .tables
                    .iter()
                    .map(|&t| lookups.get(&tables[t]))
                    .collect::<Result<Vec<Lookups>, _>>()?;
                DeviceEngine::build(&layout, d, of_device, spec)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let by = |transfers: Vec<Transfer>, key: fn(&Transfer) -> usize| {
            let mut out = vec![Vec::new(); plan.devices];
            for t in transfers {
                out[key(&t)].push(t);
            }
            out
        };
        Ok(Iteration {
            engines,
            sends: by(layout.forward_transfers(), |t| t.from),
            gathers: by(layout.backward_transfers(), |t| t.to),
        })
    }

    /// One timed iteration: every device's forward, the forward exchange, the
    /// backward exchange, every device's backward.
    fn round(&mut self) -> Result<Vec<Phases>, TchError> {
        let n = self.engines.len();
        let mut phases = vec![Phases::default(); n];
        let mut pooled = Vec::with_capacity(n);
        for (d, e) in self.engines.iter_mut().enumerate() {
            if !e.has_tables() {
                pooled.push(None);
                continue;
            }
            let start = Instant::now();
            pooled.push(e.forward()?);
            phases[d].fwd = ms_since(start);
        }
        let engines = &self.engines;
        let mut fwd_copy = vec![0.0; n];
        for (d, sends) in self.sends.iter().enumerate() {
            if sends.is_empty() {
                continue;
            }
            let start = Instant::now();
            copy_transfers(sends, |s| pooled[s].as_ref(), |e| Some(&engines[e].recv))?;
            fwd_copy[d] = ms_since(start);
        }
        for (d, gathers) in self.gathers.iter().enumerate() {
            if gathers.is_empty() {
                continue;
            }
            let start = Instant::now();
            copy_transfers(
                gathers,
                |e| Some(&engines[e].grad_out),
                |to| Some(&engines[to].grad_in),
            )?;
            phases[d].bwd_comm = ms_since(start);
        }
        for (d, (e, p)) in self.engines.iter_mut().zip(&pooled).enumerate() {
            if let Some(p) = p {
                let start = Instant::now();
                e.backward(p)?;
                phases[d].bwd = ms_since(start);
            }
        }
        // The forward all-to-all starts when the slowest device arrives.
        let slowest = phases.iter().map(|p| p.fwd).fold(0.0, f64::max);
        for (p, copy) in phases.iter_mut().zip(fwd_copy) {
            p.fwd_comm = slowest - p.fwd + copy;
        }
        Ok(phases)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, rows: u64, dim: u32, pooling: f64) -> Table {
        crate::test_table(name, rows, dim, pooling, &[(0, 0.6), (2, 0.3), (5, 0.1)])
    }

    fn cfg(batch: u64) -> CpuConfig {
        CpuConfig {
            batch,
            max_rows: 5000,
            warmup: 1,
            repeats: 3,
            threads: 0,
            seed: 7,
            kernel: Kernel::Torch,
        }
    }

    /// Three small tables of odd dims, the first two capped at 25 rows.
    fn three_tables() -> Vec<Table> {
        vec![
            table("a", 40, 3, 2.0),
            table("b", 30, 5, 3.0),
            table("c", 20, 2, 1.5),
        ]
    }

    fn oracle(batch: u64) -> CpuOracle {
        CpuOracle::new(cfg(batch), MemoryModel::default()).unwrap()
    }

    /// Three tables of three dims, the second capped at `cfg`'s 5000 rows.
    fn three_sizes() -> Vec<Table> {
        vec![
            table("a", 3000, 16, 4.0),
            table("b", 9000, 64, 2.0),
            table("c", 500, 32, 8.0),
        ]
    }

    fn plan(devices: usize, assignment: Vec<usize>) -> Plan {
        Plan {
            devices,
            assignment,
        }
    }

    #[test]
    fn a_plan_gives_positive_phases_and_cost_is_the_max_total() {
        let tables = three_sizes();
        let mut o = oracle(128);
        let m = o.measure(&tables, &plan(2, vec![0, 1, 1])).unwrap();
        assert_eq!(m.devices.len(), 2);
        for d in &m.devices {
            for x in [d.fwd_ms, d.bwd_ms, d.fwd_comm_ms, d.bwd_comm_ms] {
                assert!(x.is_finite() && x > 0.0, "{m:?}");
            }
        }
        let max = m.devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
        assert_eq!(m.cost_ms, max);
        let s = o.spread().unwrap();
        assert_eq!(s.repeats, 3);
        assert!(s.min_ms <= s.median_ms && s.median_ms <= s.max_ms, "{s:?}");
        assert_eq!(o.spread(), Some(s));
    }

    #[test]
    fn an_empty_device_computes_nothing_but_waits_for_the_exchange() {
        let tables = vec![table("a", 2000, 32, 6.0), table("b", 2000, 32, 6.0)];
        // The empty device sits between busy ones.
        let m = oracle(64).measure(&tables, &plan(3, vec![0, 2])).unwrap();
        let empty = m.devices[1];
        assert_eq!(
            (empty.fwd_ms, empty.bwd_ms, empty.bwd_comm_ms),
            (0.0, 0.0, 0.0)
        );
        assert!(empty.fwd_comm_ms > 0.0, "it waits for the slowest: {m:?}");
    }

    #[test]
    fn plans_beyond_the_lookup_budget_are_refused() {
        let t = table("huge", 100, 8, 1e5);
        let e = oracle(1 << 12)
            .measure(&[t], &plan(1, vec![0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lower cpu.batch"), "{e}");
        // 2 × 10^8 lookups at the default batch, all of the 100 rows hot:
        // it took minutes and 11 GB, refused now before anything is drawn.
        let hot = crate::test_table("hot", 100, 16, 1e5, &[(16, 1.0)]);
        let start = Instant::now();
        let e = oracle(CpuConfig::default().batch)
            .measure(&[table("a", 100, 8, 1.0), hot], &plan(2, vec![0, 1]))
            .unwrap_err()
            .to_string();
        assert!(start.elapsed().as_secs_f64() < 5.0, "{e}");
        assert!(
            e.contains("204802048 lookups") && e.contains("table `hot` 204800000 of them"),
            "{e}"
        );
        assert!(e.contains("lower cpu.batch"), "{e}");
    }

    #[test]
    fn a_plan_whose_weights_cannot_fit_memory_is_refused_naming_device_and_table() {
        // A CSV accepts 2^40 rows of dim 65536: with that row cap, 2^58
        // bytes of weights, which no machine has.
        let tables = vec![
            table("a", 100, 8, 1.0),
            crate::test_table("huge", 1 << 40, 1 << 16, 1.0, &[(0, 1.0)]),
        ];
        let mut o = CpuOracle::new(
            CpuConfig {
                max_rows: 1 << 40,
                ..cfg(16)
            },
            MemoryModel::default(),
        )
        .unwrap();
        let e = o.measure(&tables, &plan(2, vec![0, 1])).unwrap_err();
        assert!(matches!(e, OracleError::Backend { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("cpu backend: "), "{e}");
        assert!(
            e.contains("device 1's: 1099511627776 rows") && e.contains("`huge`"),
            "{e}"
        );
        assert!(
            e.contains("lower cpu.max_rows (now 1099511627776)") && e.contains("cpu.batch"),
            "{e}"
        );
        assert!(o.spread().is_none());
        // The oracle goes on measuring what fits.
        let m = o.measure(&tables[..1], &plan(1, vec![0])).unwrap();
        assert!(m.cost_ms > 0.0);
    }

    #[test]
    fn an_allocation_that_fails_is_an_error_not_a_panic() {
        // Past the check, should the estimate fall short: 2^58 bytes of
        // weights, or 2^40 samples' lookups (the engine's tests refuse
        // exchange buffers of that size).
        let huge = [crate::test_table("h", 1 << 40, 1 << 16, 1.0, &[(0, 1.0)])];
        let wide = [crate::test_table("w", 10, 1 << 16, 1.0, &[(0, 1.0)])];
        for kernel in [Kernel::Torch, Kernel::Fbgemm] {
            let c = CpuConfig {
                max_rows: 1 << 40,
                kernel,
                ..cfg(16)
            };
            let spec = engine_spec(&c, &MemoryModel::default());
            let mut cache = LookupCache::new(c.seed, c.batch, c.max_rows, Device::Cpu, 1 << 20);
            let p = plan(1, vec![0]);
            assert!(
                Iteration::build(&huge, &p, &c, spec, &mut cache).is_err(),
                "{kernel:?}"
            );
            let c = CpuConfig {
                batch: 1 << 40,
                ..c
            };
            assert!(
                Iteration::build(&wide, &p, &c, spec, &mut cache).is_err(),
                "{kernel:?}"
            );
            let mut o =
                CpuOracle::new(CpuConfig { kernel, ..cfg(16) }, MemoryModel::default()).unwrap();
            let m = o.measure(&wide, &plan(1, vec![0])).unwrap();
            assert!(m.cost_ms > 0.0);
        }
    }

    #[test]
    fn the_footprint_counts_weights_outputs_and_lookups() {
        let tables = three_sizes();
        let p = plan(2, vec![0, 1, 1]);
        let c = cfg(128); // rows capped at 5000
        let mem = MemoryModel::default();
        let f = Footprint::of(&tables, &p, &c, &engine_spec(&c, &mem));
        // Device 0: 3000 rows × 16; device 1: 5000 × 64 + 500 × 32; fp32
        // (the torch kernel) and one row-wise AdaGrad accumulator per row.
        let elements = 3000.0 * 16.0 + 5000.0 * 64.0 + 500.0 * 32.0;
        assert_eq!(mem.optimizer, common::Optimizer::RowwiseAdagrad);
        assert_eq!(f.weights, (elements + 8500.0) * 4.0);
        // Outputs and gradients, the exchange's buffers: 4 × [B, Σ dims];
        // device 1's backward: two [B, 96] and its row gradients, min(1280
        // lookups, 5500 rows) × 64.
        let outputs =
            4.0 * 128.0 * (16.0 + 64.0 + 32.0) * 4.0 + (2.0 * 128.0 * 96.0 + 1280.0 * 64.0) * 4.0;
        assert_eq!(f.outputs, outputs);
        assert_eq!(f.lookups, (512.0 + 256.0 + 1024.0) * LOOKUP_BYTES);
        assert_eq!(f.heaviest, Some((1, 1, 5500.0)));
        assert_eq!(f.busiest, Some(2));
        assert_eq!(f.total(), f.weights + f.outputs + f.lookups);
        // FBGEMM's kernel keeps fp16 weights in fp16; Adam two moments.
        let half = MemoryModel {
            precision: Precision::Fp16,
            optimizer: common::Optimizer::Adam,
        };
        let fbgemm = CpuConfig {
            kernel: Kernel::Fbgemm,
            ..c
        };
        let f = Footprint::of(&tables, &p, &fbgemm, &engine_spec(&fbgemm, &half));
        assert_eq!(f.weights, elements * (2.0 + 8.0));
    }

    #[test]
    fn plans_beyond_the_memory_budget_are_refused_saying_what_to_lower() {
        // 2048 × 1000 lookups: about 156 MiB of them, little else.
        let tables = vec![table("a", 1000, 8, 1.0), table("busy", 1000, 8, 1000.0)];
        let p = plan(2, vec![0, 1]);
        let o = oracle(2048);
        let budget = |mib: f64| Budget {
            bytes: mib * (1 << 20) as f64,
            source: "allowed here".into(),
        };
        assert!(o.check_memory(&tables, &p, &budget(200.0)).is_ok());
        let e = o
            .check_memory(&tables, &p, &budget(100.0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("than the 0.1 GiB allowed here")
                && e.contains("table `busy` draws the most"),
            "{e}"
        );
        assert!(
            e.contains("lower cpu.batch (now 2048) to shrink the lookups and outputs"),
            "{e}"
        );
    }

    #[test]
    fn the_budget_is_a_share_of_the_available_memory_or_a_fixed_one() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        let b = Budget::from_meminfo(Some(meminfo));
        assert_eq!(b.bytes, MEMORY_SHARE * 2048.0 * 1024.0);
        assert!(b.source.contains("/proc/meminfo says"), "{}", b.source);
        for unreadable in [None, Some("MemTotal: 1 kB\n"), Some("MemAvailable: lots\n")] {
            let b = Budget::from_meminfo(unreadable);
            assert_eq!(b.bytes, FALLBACK_MEMORY, "{unreadable:?}");
            assert!(b.source.contains("cannot be read"), "{}", b.source);
        }
        assert!(Budget::here().bytes > 0.0);
        // A container's limit, where it leaves less than the host has.
        let room = cgroup_room(Some("1073741824\n"), Some("536870912\n"));
        assert_eq!(room, Some(512.0 * 1024.0 * 1024.0));
        let b = Budget::from_sources(Some(meminfo), Some(1024.0));
        assert_eq!(b.bytes, MEMORY_SHARE * 1024.0);
        assert!(b.source.contains("cgroup"), "{}", b.source);
        let b = Budget::from_sources(Some(meminfo), Some(1e12));
        assert_eq!(b.bytes, MEMORY_SHARE * 2048.0 * 1024.0);
        for unlimited in ["max\n", "9223372036854771712\n"] {
            assert_eq!(cgroup_room(Some(unlimited), Some("100\n")), None);
        }
        assert_eq!(cgroup_room(None, Some("100")), None);
    }

    #[test]
    fn bad_plans_are_errors_not_panics() {
        let tables = vec![table("a", 100, 8, 1.0)];
        let mut o = oracle(16);
        assert!(matches!(
            o.measure(&tables, &plan(2, vec![0, 1])),
            Err(OracleError::PlanLength { .. })
        ));
        assert!(matches!(
            o.measure(&tables, &plan(2, vec![5])),
            Err(OracleError::DeviceOutOfRange { device: 5, .. })
        ));
        assert!(matches!(
            o.measure(&tables, &plan(0, vec![])),
            Err(OracleError::NoDevice)
        ));
        assert!(o.spread().is_none());
        assert!(CpuOracle::new(cfg(0), MemoryModel::default()).is_err());
    }

    /// Each transfer of both exchanges is timed once, by its sender in
    /// the forward and its receiver in the backward; and a whole round
    /// leaves the kept lookups the tables' own.
    #[test]
    fn each_device_times_its_own_transfers() {
        let tables = three_tables();
        let c = CpuConfig {
            max_rows: 25,
            ..cfg(5)
        };
        let p = plan(3, vec![1, 0, 1]);
        let spec = engine_spec(&c, &MemoryModel::default());
        let mut cache = LookupCache::new(c.seed, c.batch, c.max_rows, Device::Cpu, 1 << 20);
        let mut it = Iteration::build(&tables, &p, &c, spec, &mut cache).unwrap();
        let layout = PlanLayout::new(&tables, &p, c.batch, c.max_rows);
        let flat = |by: &[Vec<Transfer>], key: fn(&Transfer) -> usize| {
            for (d, ts) in by.iter().enumerate() {
                assert!(ts.iter().all(|t| key(t) == d));
            }
            by.concat()
        };
        let mut sends = flat(&it.sends, |t| t.from);
        let mut want = layout.forward_transfers();
        let order = |t: &Transfer| (t.from, t.to);
        sends.sort_by_key(order);
        want.sort_by_key(order);
        assert_eq!(sends, want);
        let mut gathers = flat(&it.gathers, |t| t.to);
        let mut want = layout.backward_transfers();
        gathers.sort_by_key(order);
        want.sort_by_key(order);
        assert_eq!(gathers, want);
        // Device 2 has no table: it sends nothing, but receives its samples.
        assert!(it.sends[2].is_empty() && it.gathers[2].is_empty());
        let phases = it.round().unwrap();
        assert_eq!(
            (phases[2].fwd, phases[2].bwd, phases[2].bwd_comm),
            (0.0, 0.0, 0.0)
        );
        for t in &tables {
            let kept = cache.get(t).unwrap().to_host().unwrap();
            let fresh = indices::for_table(c.seed, t, c.batch, c.max_rows, Device::Cpu).unwrap();
            assert_eq!(kept, fresh.to_host().unwrap(), "{}", t.name);
        }
    }

    /// Both kernels measure a plan, and say which they are; FBGEMM's has no
    /// Adam and says so when the oracle starts.
    #[test]
    fn both_kernels_measure_and_fbgemm_refuses_adam() {
        let tables = three_tables();
        let p = plan(2, vec![1, 0, 1]);
        for kernel in [Kernel::Torch, Kernel::Fbgemm] {
            let c = CpuConfig { kernel, ..cfg(6) };
            let mut o = CpuOracle::new(c, MemoryModel::default()).unwrap();
            assert_eq!(o.kernel(), Some(kernel.name()));
            let m = o.measure(&tables, &p).unwrap();
            assert!(
                m.devices.iter().all(|d| d.fwd_ms > 0.0 && d.bwd_ms > 0.0),
                "{kernel:?}: {m:?}"
            );
        }
        let adam = MemoryModel {
            optimizer: common::Optimizer::Adam,
            precision: Precision::Fp32,
        };
        let fbgemm = CpuConfig {
            kernel: Kernel::Fbgemm,
            ..cfg(6)
        };
        let e = CpuOracle::new(fbgemm, adam).err().unwrap().to_string();
        assert!(
            e.contains("Adam") && e.contains("kernel = \"torch\""),
            "{e}"
        );
        assert!(CpuOracle::new(cfg(6), adam).is_ok());
    }
}
