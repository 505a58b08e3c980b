//! `cpu`: real fused lookups forward and backward on this machine's CPU, one
//! fused call per device, with the all-to-all done as real memory movement
//! between device buffers (DESIGN §6). It measures the effects the `sim`
//! backend models — fusion, locality, exchange volume — on a kernel that
//! really runs. `cpu.kernel` picks it: FBGEMM's table-batched embedding
//! (`fbgemm`, the default: [`crate::fbgemm`], each table at its own dim,
//! row-wise AdaGrad fused in the backward), or libtorch's `embedding_bag`
//! (`torch`, below: padded to the widest dim, an SGD backward).
//!
//! One iteration, for a plan over `D` devices and a batch of `B` samples:
//! - *weights*: each device's tables (rows capped at `cpu.max_rows`) are
//!   concatenated into one fp32 weight, padded to the widest dim on the device,
//!   as FBGEMM's table-batched kernel is launched for the widest table. fp32,
//!   whatever `memory.precision` says: half-precision `embedding_bag` on the
//!   CPU is a slow fallback path, not a model of the GPU's fp16 kernel. The
//!   weights live in one arena kept across measurements, so a measurement does
//!   not pay for allocating and touching gigabytes of memory;
//! - *lookups*: [`crate::indices`], deterministic from `cpu.seed` and the
//!   table's name, generated once per table and kept between measurements
//!   ([`LookupCache`]), table-major in one fused call;
//! - *forward*: one `embedding_bag` call (mode sum) per device, giving
//!   `[T_d·B, D_max]`;
//! - *forward all-to-all*: device `d` copies to every device `e` (itself
//!   included, as NCCL does) the `B/D` samples `e` owns of each of its tables,
//!   cut to the table's true dim, into `e`'s receive buffer `[B_e, Σ dims]`;
//! - *backward all-to-all*: the reverse — device `d` gathers its tables'
//!   output gradients from every peer's gradient buffer into `[T_d·B, D_max]`;
//! - *backward*: FBGEMM's structure (`embedding_backward_split_template.cu`):
//!   sort the lookups by row, reduce each unique row's segment of output
//!   gradients (one more `embedding_bag` over the gradient, with the sorted
//!   lookups' bags as indices), then update only the unique rows (SGD, whatever
//!   `memory.optimizer` says). libtorch's own sparse backward materialises a
//!   `[lookups, D_max]` gradient before coalescing it (~50× the forward's
//!   time for 50 tables at B = 2048 here); its dense backward zeroes a gradient as large as the
//!   weight. Neither is what a GPU does. Hot rows make long segments, reduced
//!   serially: the contention the GPU kernel also has.
//!
//! There is one CPU, so devices are timed one after another with
//! [`Instant`]; each phase's figure is its median over `cpu.repeats` rounds
//! after `cpu.warmup` unmeasured ones. As in `sim`, the forward all-to-all is
//! a collective that starts when the slowest device arrives:
//! `fwd_comm_d = max_e fwd_e − fwd_d + copy_d`, and `bwd_comm_d = copy_d`.
//!
//! *Memory*: before allocating anything, a measurement estimates what it
//! will take (`Footprint`: the weights the arena must grow by, outputs and
//! gradients, lookups) and is refused, with an error naming the largest
//! device and table and saying which of `cpu.max_rows` and `cpu.batch` to
//! lower, when that is more than [`MEMORY_SHARE`] of the memory
//! `/proc/meminfo` says is available, or that the process's memory cgroup
//! (a container's limit) leaves where that is less (a fixed
//! [`FALLBACK_MEMORY`] where neither can be read), or when it draws more than [`MAX_LOOKUPS`] lookups. An
//! allocation that fails nonetheless is an error too, never a panic.

use std::time::Instant;

use common::config::{CpuConfig, Kernel};
use common::{DeviceCost, Measurement, MemoryModel, Plan, Precision, Table};
use tch::{Device, Kind, TchError, Tensor};

use crate::indices::{self, LookupCache};
use crate::layout::sample_split;
use crate::oracle::{check_plan, Oracle, OracleError, Spread};
use crate::timing::{median, spread};

mod device;
use device::DeviceWork;

const BACKEND: &str = "cpu";
const F32: (Kind, Device) = (Kind::Float, Device::Cpu);
/// Initial weights and output gradients: normal floats (denormals would slow
/// the CPU down and measure the wrong thing); their values do not matter.
const WEIGHT_INIT: f64 = 0.01;
const GRAD_VALUE: f64 = 1e-3;
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
/// less that of a tiny one: 79 to 80 bytes. With it, [`Footprint`] came
/// within −14 % to +7 % of the peak of every plan tried (one table of 2
/// to 17 million lookups, or of dim 4096; 200 tables on 8 devices: 8.7 GiB
/// estimated, 8.2 measured).
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
/// Headroom when the weight arena grows, so plans of slightly different
/// sizes do not reallocate it each time.
const ARENA_SLACK: f64 = 1.25;

fn backend_error(e: TchError) -> OracleError {
    OracleError::Backend {
        backend: BACKEND,
        message: e.to_string(),
    }
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// The `cpu` oracle. Holds the weight arena between measurements.
pub struct CpuOracle {
    cfg: CpuConfig,
    /// Flat fp32 storage every device's weight is a view of, grown on demand.
    arena: Option<Tensor>,
    /// Repeat-to-repeat spread of the last measurement's iteration cost.
    last_spread: Option<Spread>,
    /// Each table's lookups, generated once for all the plans measured.
    lookups: LookupCache,
}

impl CpuOracle {
    pub fn new(cfg: CpuConfig, mem: MemoryModel) -> Result<Self, OracleError> {
        cfg.validate().map_err(|e| OracleError::Backend {
            backend: BACKEND,
            message: e.to_string(),
        })?;
        if mem.precision == Precision::Fp16 {
            tracing::debug!(
                "cpu backend: weights are measured in fp32 (CPU half precision is slow)"
            );
        }
        if cfg.kernel == Kernel::Fbgemm {
            crate::fbgemm::load().map_err(|e| OracleError::Backend {
                backend: BACKEND,
                message: e.to_string(),
            })?;
        }
        if cfg.threads > 0 {
            let threads = i32::try_from(cfg.threads).map_err(|_| OracleError::Backend {
                backend: BACKEND,
                message: format!("cpu.threads = {} is too large", cfg.threads),
            })?;
            tch::set_num_threads(threads);
        }
        Ok(CpuOracle {
            lookups: LookupCache::new(cfg.seed, cfg.batch, cfg.max_rows, Device::Cpu, LOOKUP_CACHE),
            cfg,
            arena: None,
            last_spread: None,
        })
    }

    /// Elements the weight arena holds now.
    fn arena_elements(&self) -> f64 {
        self.arena.as_ref().map_or(0.0, |a| a.numel() as f64)
    }

    /// Refuses a plan whose measurement would take more memory than
    /// `budget`, saying what to lower.
    fn check_memory(
        &self,
        tables: &[Table],
        plan: &Plan,
        budget: &Budget,
    ) -> Result<(), OracleError> {
        let f = Footprint::of(tables, plan, &self.cfg, self.arena_elements());
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
        Err(OracleError::Backend {
            backend: BACKEND,
            message: f.refusal(tables, &self.cfg, budget),
        })
    }

    /// Views of the arena shaped `[rows, dim]`, one per shape.
    fn weights(&mut self, shapes: &[(i64, i64)]) -> Result<Vec<Tensor>, TchError> {
        let need: i64 = shapes.iter().map(|(r, c)| r * c).sum();
        let have = self.arena.as_ref().map_or(0, |a| a.numel() as i64);
        if have < need {
            self.arena = None; // free the old arena before allocating the new one
            let size = (need as f64 * ARENA_SLACK) as i64;
            // Not `f_full`: an op taking a `Scalar` panics when it fails
            // (the scalar's drop unwraps libtorch's pending error), and an
            // allocation may. Filling in place allocates nothing.
            let mut arena = Tensor::f_empty([size], F32)?;
            let _ = arena.f_fill_(WEIGHT_INIT)?;
            self.arena = Some(arena);
        }
        let Some(arena) = self.arena.as_ref() else {
            return Ok(Vec::new());
        };
        let mut start = 0;
        shapes
            .iter()
            .map(|&(rows, dim)| {
                let w = arena.f_narrow(0, start, rows * dim)?.f_view([rows, dim])?;
                start += rows * dim;
                Ok(w)
            })
            .collect()
    }

    fn run(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, TchError> {
        let groups = plan.groups();
        let shapes: Vec<(i64, i64)> = groups
            .iter()
            .map(|g| weight_shape(tables, g, self.cfg.max_rows))
            .collect();
        // FBGEMM's kernel holds its own weights, unpadded.
        let weights = match self.cfg.kernel {
            Kernel::Torch => self.weights(&shapes)?.into_iter().map(Some).collect(),
            Kernel::Fbgemm => groups.iter().map(|_| None).collect(),
        };
        let mut it = Iteration::build(tables, plan, &self.cfg, weights, &mut self.lookups)?;
        for _ in 0..self.cfg.warmup {
            it.round()?;
        }
        let rounds = (0..self.cfg.repeats.max(1))
            .map(|_| it.round())
            .collect::<Result<Vec<_>, _>>()?;
        let costs: Vec<f64> = rounds
            .iter()
            .map(|r| Measurement::from_devices(r.device_costs()).cost_ms)
            .collect();
        self.last_spread = Some(spread(&costs));
        let phase = |f: fn(&RoundTimes) -> &Vec<f64>, d: usize| {
            median(&rounds.iter().map(|r| f(r)[d]).collect::<Vec<_>>())
        };
        let n = plan.devices;
        let median_round = RoundTimes {
            fwd: (0..n).map(|d| phase(|r| &r.fwd, d)).collect(),
            fwd_copy: (0..n).map(|d| phase(|r| &r.fwd_copy, d)).collect(),
            bwd_copy: (0..n).map(|d| phase(|r| &r.bwd_copy, d)).collect(),
            bwd: (0..n).map(|d| phase(|r| &r.bwd, d)).collect(),
        };
        Ok(Measurement::from_devices(median_round.device_costs()))
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
            return Err(OracleError::Backend {
                backend: BACKEND,
                message: format!(
                    "the plan draws {lookups:.0} lookups per iteration at cpu.batch = {} \
                     (table `{}` {:.0} of them), more than the {MAX_LOOKUPS:.0} one \
                     measurement may draw; lower cpu.batch",
                    self.cfg.batch, tables[busiest].name, per_table[busiest]
                ),
            });
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
    /// What the weight arena must grow by: the devices' fused fp32 weights
    /// (`[Σ capped rows, widest dim]` each) with [`ARENA_SLACK`], less what it
    /// holds already (freed first). No optimizer state: the update is plain
    /// SGD, whatever `memory.optimizer` says.
    weights: f64,
    /// Per device, its pooled output and its output gradient (`[T_d·B,
    /// widest dim]` each); the exchange's receive and gradient buffers
    /// (`[B_e, Σ dims]` each); the backward's per-row gradients (`[unique
    /// rows, widest dim]`, unique rows at most its lookups and its rows) of
    /// the device with the most, one device at a time.
    outputs: f64,
    /// [`LOOKUP_BYTES`] per lookup.
    lookups: f64,
    /// The device with the largest weight, its widest table and its rows.
    heaviest: Option<(usize, usize, f64)>,
    /// The table with the most lookups.
    busiest: Option<usize>,
}

impl Footprint {
    /// The footprint of measuring `plan` with an arena of `arena` elements.
    fn of(tables: &[Table], plan: &Plan, cfg: &CpuConfig, arena: f64) -> Footprint {
        let batch = cfg.batch as f64;
        let per_table: Vec<f64> = tables
            .iter()
            .map(|t| indices::lookups_per_batch(t, cfg.batch))
            .collect();
        let (mut weight, mut outputs, mut row_grads) = (0.0, 0.0, 0.0f64);
        let mut heaviest: Option<(usize, usize, f64, f64)> = None;
        for (d, group) in plan.groups().iter().enumerate() {
            let Some(&widest) = group.iter().max_by_key(|&&t| tables[t].dim) else {
                continue;
            };
            let dim = f64::from(tables[widest].dim);
            let rows: f64 = group
                .iter()
                .map(|&t| indices::capped_rows(&tables[t], cfg.max_rows) as f64)
                .sum();
            let lookups: f64 = group.iter().map(|&t| per_table[t]).sum();
            let elements = rows * dim;
            weight += elements;
            if heaviest.is_none_or(|(_, _, _, e)| elements > e) {
                heaviest = Some((d, widest, rows, elements));
            }
            outputs += 2.0 * group.len() as f64 * batch * dim * F32_BYTES;
            row_grads = row_grads.max(lookups.min(rows) * dim * F32_BYTES);
        }
        let dims: f64 = tables.iter().map(|t| f64::from(t.dim)).sum();
        outputs += 2.0 * batch * dims * F32_BYTES + row_grads;
        let weights = if weight > arena {
            (weight * ARENA_SLACK - arena).max(0.0) * F32_BYTES
        } else {
            0.0
        };
        Footprint {
            weights,
            outputs,
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
                "{:.1} GiB of fp32 weights (the largest, device {d}'s: {rows:.0} rows, each \
                 table's capped at cpu.max_rows, × dim {} of its widest table `{}`)",
                gib(self.weights),
                tables[t].dim,
                tables[t].name
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

/// `[Σ capped rows, widest dim]` of a device's fused weight.
fn weight_shape(tables: &[Table], group: &[usize], max_rows: u64) -> (i64, i64) {
    let rows = group
        .iter()
        .map(|&t| indices::capped_rows(&tables[t], max_rows) as i64)
        .sum();
    let dim = group
        .iter()
        .map(|&t| tables[t].dim as i64)
        .max()
        .unwrap_or(0);
    (rows, dim)
}

/// One round's timings per device, in ms.
#[derive(Debug, Clone)]
struct RoundTimes {
    fwd: Vec<f64>,
    /// Device's own sends in the forward all-to-all.
    fwd_copy: Vec<f64>,
    /// Device's own gathering of gradients in the backward all-to-all.
    bwd_copy: Vec<f64>,
    bwd: Vec<f64>,
}

impl RoundTimes {
    fn zeros(devices: usize) -> Self {
        RoundTimes {
            fwd: vec![0.0; devices],
            fwd_copy: vec![0.0; devices],
            bwd_copy: vec![0.0; devices],
            bwd: vec![0.0; devices],
        }
    }

    /// Device costs, with the forward all-to-all waiting for the slowest.
    fn device_costs(&self) -> Vec<DeviceCost> {
        let slowest = self.fwd.iter().copied().fold(0.0, f64::max);
        (0..self.fwd.len())
            .map(|d| {
                DeviceCost::new(
                    self.fwd[d],
                    self.bwd[d],
                    slowest - self.fwd[d] + self.fwd_copy[d],
                    self.bwd_copy[d],
                )
            })
            .collect()
    }
}

/// The buffers of the all-to-all: what each device holds for its own samples.
struct Exchange {
    /// Samples of each device, `(first, count)`.
    split: Vec<(i64, i64)>,
    /// First column of each task table in a device's buffers.
    cols: Vec<i64>,
    /// Pooled outputs each device receives for its samples, `[B_e, Σ dims]`.
    recv: Vec<Tensor>,
    /// Output gradients each device computed for its samples, `[B_e, Σ dims]`.
    grads: Vec<Tensor>,
}

impl Exchange {
    fn build(tables: &[Table], devices: usize, batch: u64) -> Result<Self, TchError> {
        let split: Vec<(i64, i64)> = sample_split(batch, devices)
            .into_iter()
            .map(|(s, n)| (s as i64, n as i64))
            .collect();
        let mut cols = Vec::with_capacity(tables.len());
        let mut width = 0i64;
        for t in tables {
            cols.push(width);
            width += t.dim as i64;
        }
        // Allocated, then filled in place (see [`CpuOracle::weights`]).
        let buffers = |fill: f64| {
            split
                .iter()
                .map(|&(_, n)| {
                    let mut b = Tensor::f_empty([n, width], F32)?;
                    let _ = b.f_fill_(fill)?;
                    Ok(b)
                })
                .collect::<Result<Vec<_>, TchError>>()
        };
        let (recv, grads) = (buffers(0.0)?, buffers(GRAD_VALUE)?);
        Ok(Exchange {
            split,
            cols,
            recv,
            grads,
        })
    }

    /// Device `w`'s part of the forward all-to-all: every peer gets its
    /// samples of each of `w`'s tables, cut to the table's dim. Returns the
    /// elements moved.
    fn send(&mut self, w: &DeviceWork, out: &Tensor) -> Result<i64, TchError> {
        let mut moved = 0;
        for (&(first, count), recv) in self.split.iter().zip(&self.recv) {
            for (i, (&t, &dim)) in w.tables.iter().zip(&w.dims).enumerate() {
                let src = w.block(out, i, first, count)?;
                recv.f_narrow(1, self.cols[t], dim)?.f_copy_(&src)?;
                moved += count * dim;
            }
        }
        Ok(moved)
    }

    /// Device `w`'s part of the backward all-to-all: it gathers the gradients
    /// of its tables' outputs from every peer. Returns the elements moved.
    fn gather(&self, w: &DeviceWork) -> Result<i64, TchError> {
        let mut moved = 0;
        for (&(first, count), grads) in self.split.iter().zip(&self.grads) {
            for (i, (&t, &dim)) in w.tables.iter().zip(&w.dims).enumerate() {
                let src = grads.f_narrow(1, self.cols[t], dim)?;
                w.block(&w.grad, i, first, count)?.f_copy_(&src)?;
                moved += count * dim;
            }
        }
        Ok(moved)
    }
}

/// Everything one plan's iterations need; `None` for a device with no table.
struct Iteration {
    devices: Vec<Option<DeviceWork>>,
    exchange: Exchange,
}

impl Iteration {
    /// `weights[d]`: device `d`'s fused weight (shape from [`weight_shape`])
    /// for the `torch` kernel, `None` for FBGEMM's.
    fn build(
        tables: &[Table],
        plan: &Plan,
        cfg: &CpuConfig,
        weights: Vec<Option<Tensor>>,
        lookups: &mut LookupCache,
    ) -> Result<Self, TchError> {
        let devices = plan
            .groups()
            .iter()
            .zip(weights)
            .map(|(g, w)| match g.is_empty() {
                true => Ok(None),
                false => DeviceWork::build(tables, g, cfg, w, lookups).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Iteration {
            devices,
            exchange: Exchange::build(tables, plan.devices, cfg.batch)?,
        })
    }

    /// One timed iteration: every device's forward, the forward exchange, the
    /// backward exchange, every device's backward.
    fn round(&mut self) -> Result<RoundTimes, TchError> {
        let mut t = RoundTimes::zeros(self.devices.len());
        let mut pooled = Vec::with_capacity(self.devices.len());
        for (d, w) in self.devices.iter_mut().enumerate() {
            let Some(w) = w else {
                pooled.push(None);
                continue;
            };
            let start = Instant::now();
            pooled.push(Some(w.forward()?));
            t.fwd[d] = ms_since(start);
        }
        for (d, (w, p)) in self.devices.iter().zip(&pooled).enumerate() {
            if let (Some(w), Some(p)) = (w, p) {
                let start = Instant::now();
                self.exchange.send(w, p)?;
                t.fwd_copy[d] = ms_since(start);
            }
        }
        for (d, w) in self.devices.iter().enumerate() {
            if let Some(w) = w {
                let start = Instant::now();
                self.exchange.gather(w)?;
                t.bwd_copy[d] = ms_since(start);
            }
        }
        for (d, (w, p)) in self.devices.iter_mut().zip(&pooled).enumerate() {
            if let (Some(w), Some(p)) = (w, p) {
                let start = Instant::now();
                w.backward(p)?;
                t.bwd[d] = ms_since(start);
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::device::DeviceKernel;
    use super::*;
    use crate::fused::sum_bags;
    use crate::layout::exchange_elements;

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

    impl DeviceWork {
        /// The `torch` kernel's weight, fused lookups and their bags.
        fn torch_parts(&self) -> (&Tensor, &Tensor, &Tensor) {
            match &self.kernel {
                DeviceKernel::Torch {
                    weight,
                    indices,
                    bags,
                    ..
                } => (weight, indices, bags),
                DeviceKernel::Fbgemm { .. } => panic!("the fbgemm kernel"),
            }
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

    fn plan(devices: usize, assignment: Vec<usize>) -> Plan {
        Plan {
            devices,
            assignment,
        }
    }

    #[test]
    fn a_plan_gives_positive_phases_and_cost_is_the_max_total() {
        let tables = vec![
            table("a", 3000, 16, 4.0),
            table("b", 9000, 64, 2.0),
            table("c", 500, 32, 8.0),
        ];
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
        // Past the check, should the estimate fall short: 2^58 bytes.
        let mut o = oracle(16);
        assert!(o.weights(&[(1 << 40, 1 << 16)]).is_err());
        let wide = [crate::test_table("w", 10, 1 << 16, 1.0, &[(0, 1.0)])];
        assert!(Exchange::build(&wide, 1, 1 << 40).is_err());
        let m = o.measure(&wide, &plan(1, vec![0])).unwrap();
        assert!(m.cost_ms > 0.0);
    }

    #[test]
    fn the_footprint_counts_weights_outputs_and_lookups() {
        let tables = vec![
            table("a", 3000, 16, 4.0),
            table("b", 9000, 64, 2.0),
            table("c", 500, 32, 8.0),
        ];
        let p = plan(2, vec![0, 1, 1]);
        let c = cfg(128); // rows capped at 5000
        let f = Footprint::of(&tables, &p, &c, 0.0);
        // Device 0: 3000 rows × 16; device 1: (5000 + 500) rows × 64.
        let elements = 3000.0 * 16.0 + 5500.0 * 64.0;
        assert_eq!(f.weights, elements * ARENA_SLACK * 4.0);
        // Outputs and gradients [T_d·B, D_max]; the exchange's two
        // [B, Σ dims]; device 1's row gradients, min(1280 lookups, 5500
        // rows) × 64.
        let outputs = 2.0 * 128.0 * (16.0 + 2.0 * 64.0) * 4.0
            + 2.0 * 128.0 * (16.0 + 64.0 + 32.0) * 4.0
            + 1280.0 * 64.0 * 4.0;
        assert_eq!(f.outputs, outputs);
        assert_eq!(f.lookups, (512.0 + 256.0 + 1024.0) * LOOKUP_BYTES);
        assert_eq!(f.heaviest, Some((1, 1, 5500.0)));
        assert_eq!(f.busiest, Some(2));
        assert_eq!(f.total(), f.weights + f.outputs + f.lookups);
        // An arena that holds the weights already: nothing to grow.
        let mut o = oracle(128);
        o.measure(&tables, &p).unwrap();
        assert_eq!(o.arena_elements(), (elements * ARENA_SLACK).floor());
        assert_eq!(
            Footprint::of(&tables, &p, &c, o.arena_elements()).weights,
            0.0
        );
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

    /// Checks, against references written element by element: the fused
    /// forward (each bag sums the rows it looks up), both exchanges (every
    /// cell lands where its sample and table say, padding stays zero, the
    /// element counts match [`crate::layout::exchange_elements`]) and the backward (each row
    /// moves by −lr × the summed output gradients of the bags that looked it up).
    #[test]
    fn fused_pass_and_exchanges_match_naive_references() {
        let tables = three_tables();
        let c = CpuConfig {
            max_rows: 25,
            ..cfg(5)
        };
        let batch = c.batch as usize;
        let p = plan(2, vec![1, 0, 1]);
        let groups = p.groups();
        let weights: Vec<Option<Tensor>> = groups
            .iter()
            .map(|g| {
                let (r, d) = weight_shape(&tables, g, c.max_rows);
                Some(Tensor::arange(r * d, F32).view([r, d]) * 0.001)
            })
            .collect();
        let before: Vec<Tensor> = weights.iter().flatten().map(|w| w.copy()).collect();
        let mut cache = LookupCache::new(c.seed, c.batch, c.max_rows, Device::Cpu, 1 << 20);
        let mut it = Iteration::build(&tables, &p, &c, weights, &mut cache).unwrap();
        for (e, g) in it.exchange.grads.iter_mut().enumerate() {
            *g = Tensor::arange(g.numel() as i64, F32).view(g.size().as_slice()) * 0.01
                + (e + 1) as f64;
        }
        // Which device owns sample b, and its row in that device's buffers.
        let split = sample_split(c.batch, 2);
        let owner = |b: usize| {
            let e = split
                .iter()
                .position(|&(f, n)| (f..f + n).contains(&(b as u64)));
            let e = e.unwrap();
            (e, (b as u64 - split[e].0) as i64)
        };
        let dim_sums: Vec<u64> = groups
            .iter()
            .map(|g| g.iter().map(|&t| tables[t].dim as u64).sum())
            .collect();
        let sent = exchange_elements(c.batch, &dim_sums);
        let cell = |x: &Tensor, row: i64, col: i64, len: i64| x.get(row).narrow(0, col, len);

        for (d, w) in it.devices.iter_mut().enumerate() {
            let w = w.as_mut().unwrap();
            let out = w.forward().unwrap();
            let (weight, fused_rows, fused_bags) = w.torch_parts();
            let (weight, fused_rows, fused_bags) =
                (weight.shallow_clone(), fused_rows.copy(), fused_bags.copy());
            let mut first_row = 0;
            for (i, &t) in w.tables.iter().enumerate() {
                let l =
                    indices::for_table(c.seed, &tables[t], batch as u64, c.max_rows, Device::Cpu)
                        .unwrap()
                        .to_host()
                        .unwrap();
                for (b, len) in l.bag_lengths().into_iter().enumerate() {
                    let start = l.offsets[b] as usize;
                    let rows = Tensor::from_slice(&l.indices[start..start + len]) + first_row;
                    let expect = weight.index_select(0, &rows).sum_dim_intlist(
                        [0i64].as_slice(),
                        false,
                        Kind::Float,
                    );
                    let got = out.get((i * batch + b) as i64);
                    assert!(
                        got.allclose(&expect, 1e-5, 1e-6, false),
                        "table {t} bag {b}"
                    );
                }
                first_row += indices::capped_rows(&tables[t], c.max_rows) as i64;
            }

            let moved = it.exchange.send(w, &out).unwrap();
            assert_eq!(moved as u64, sent[d].iter().sum::<u64>());
            let gathered = it.exchange.gather(w).unwrap();
            assert_eq!(gathered, moved);
            let dmax = w.dims.iter().copied().max().unwrap();
            for (i, (&t, &dim)) in w.tables.iter().zip(&w.dims).enumerate() {
                let col = it.exchange.cols[t];
                for b in 0..batch {
                    let (e, row) = owner(b);
                    let at = (i * batch + b) as i64;
                    let pooled = cell(&out, at, 0, dim);
                    assert!(cell(&it.exchange.recv[e], row, col, dim).equal(&pooled));
                    let grad = cell(&it.exchange.grads[e], row, col, dim);
                    assert!(cell(&w.grad, at, 0, dim).equal(&grad));
                    let padding = cell(&w.grad, at, dim, dmax - dim);
                    assert_eq!(padding.abs().sum(Kind::Float).double_value(&[]), 0.0);
                }
            }

            // Naive backward: every lookup adds its bag's gradient to its row.
            let rows = Vec::<i64>::try_from(&fused_rows).unwrap();
            let bags = Vec::<i64>::try_from(&fused_bags).unwrap();
            let expect = Tensor::zeros(weight.size().as_slice(), F32);
            for (&r, &b) in rows.iter().zip(&bags) {
                let mut row = expect.get(r);
                row += w.grad.get(b);
            }
            w.backward(&out).unwrap();
            let delta = &weight - &before[d];
            assert!(delta.allclose(&(expect * -LEARNING_RATE), 1e-4, 1e-7, false));
        }
        // A whole round later, the kept lookups are still the tables' own.
        it.round().unwrap();
        for t in &tables {
            let kept = cache.get(t).unwrap().to_host().unwrap();
            let fresh = indices::for_table(c.seed, t, c.batch, c.max_rows, Device::Cpu).unwrap();
            assert_eq!(kept, fresh.to_host().unwrap(), "{}", t.name);
        }
    }

    /// FBGEMM's kernel in the `cpu` backend: its sample-major output is
    /// each table's pooled lookups, the exchange moves each table's block
    /// of it and of the gradient, the backward updates the weights, and a
    /// measurement of it has the phases of one.
    #[test]
    fn the_fbgemm_kernel_pools_exchanges_and_measures() {
        let tables = three_tables();
        let c = CpuConfig {
            max_rows: 25,
            kernel: Kernel::Fbgemm,
            ..cfg(6)
        };
        let p = plan(2, vec![1, 0, 1]);
        let weights = p.groups().iter().map(|_| None).collect();
        let mut cache = LookupCache::new(c.seed, c.batch, c.max_rows, Device::Cpu, 1 << 20);
        let mut it = Iteration::build(&tables, &p, &c, weights, &mut cache).unwrap();
        let split = sample_split(c.batch, 2);
        for w in it.devices.iter_mut() {
            let w = w.as_mut().unwrap();
            let DeviceKernel::Fbgemm { tbe, .. } = &w.kernel else {
                panic!("the torch kernel");
            };
            let before: Vec<Tensor> = (0..w.tables.len())
                .map(|i| tbe.table_weight(i).unwrap().copy())
                .collect();
            let out = w.forward().unwrap();
            let width: u32 = w.tables.iter().map(|&t| tables[t].dim).sum();
            assert_eq!(out.size(), [c.batch as i64, width as i64]);
            for (i, &t) in w.tables.iter().enumerate() {
                let l = cache.get(&tables[t]).unwrap();
                let want = sum_bags(&before[i], &l.indices, &l.offsets).unwrap();
                let got = w.block(&out, i, 0, c.batch as i64).unwrap();
                assert!(got.allclose(&want, 1e-5, 1e-6, false), "table {t}");
            }
            it.exchange.send(w, &out).unwrap();
            it.exchange.gather(w).unwrap();
            for (i, &t) in w.tables.iter().enumerate() {
                let dim = tables[t].dim as i64;
                for (e, &(first, count)) in split.iter().enumerate() {
                    let (first, count) = (first as i64, count as i64);
                    let recv = it.exchange.recv[e].narrow(1, it.exchange.cols[t], dim);
                    assert!(recv.equal(&w.block(&out, i, first, count).unwrap()));
                    let grad = it.exchange.grads[e].narrow(1, it.exchange.cols[t], dim);
                    assert!(grad.equal(&w.block(&w.grad, i, first, count).unwrap()));
                }
            }
            w.backward(&out).unwrap();
            let DeviceKernel::Fbgemm { tbe, .. } = &w.kernel else {
                unreachable!()
            };
            let moved = (0..w.tables.len())
                .map(|i| {
                    (tbe.table_weight(i).unwrap() - &before[i])
                        .abs()
                        .sum(Kind::Float)
                })
                .map(|d| d.double_value(&[]))
                .sum::<f64>();
            assert!(moved > 0.0, "the backward updated nothing");
        }
        let mut o = CpuOracle::new(c, MemoryModel::default()).unwrap();
        assert_eq!(o.kernel(), Some("fbgemm"));
        let m = o.measure(&tables, &p).unwrap();
        assert_eq!(m.devices.len(), 2);
        assert!(
            m.devices.iter().all(|d| d.fwd_ms > 0.0 && d.bwd_ms > 0.0),
            "{m:?}"
        );
    }
}
