//! A seeded generator of tables and placement tasks over the whole table
//! space: the pre-training data of `learner pretrain`, and held-out suites
//! of shapes no model trained on. The DLRM-like pool of
//! [`crate::generate`] stays the main job's data.
//!
//! Each task first draws a [`Style`], then its tables from that style, so
//! tasks differ from one another as real models do (one model's tables
//! are all narrow, another's mix narrow and very wide ones).
//!
//! | what | range | drawn as |
//! |---|---|---|
//! | dim | 4–1024, multiples of 4 | log-uniform, rounded to 4: production dims are not only powers of two |
//! | rows | 10²–10⁹ | log-uniform: hash sizes span seven orders of magnitude |
//! | pooling | 0.1–300 | log-uniform: optional features are looked up less than once per sample |
//! | reuse bins | flat to extremely hot, trace-like | per style (below) |
//! | devices | 2–64 | log-uniform |
//! | tables per device | 1–64 | log-uniform, at most `max_tables` per task |
//! | memory per device | 1.05× to 4× an even share, or roomy | uniform share; a quarter of tasks roomy |
//!
//! Consistency: a table cannot touch more unique rows in one batch than it
//! has. Where `batch × pooling / mean reuse` exceeds its rows, the rows are
//! raised to that count if the table then still fits `device_gb`;
//! otherwise its reuse bins are made hotter (shifted up one bucket at a
//! time) until it is consistent.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::suite::{first_fit_decreasing, share_memory_gb, SuiteFile, TaskSpec};
use crate::table::{MemoryModel, Table, BYTES_PER_GB, NUM_BINS};
use crate::Task;

/// How a task's tables look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    /// Every feature from its full range, independently.
    Mixed,
    /// Like the DLRM-like pool: dims 16–128 in powers of two, geometric
    /// reuse around half the rows used once.
    Dlrm,
    /// Like tables derived from a lookup trace: a narrow band of dims, reuse
    /// concentrated in middle buckets, almost no row used once.
    TraceLike,
    /// Extremely skewed: most rows looked up thousands of times.
    Hot,
    /// Little reuse: most rows looked up once.
    Cold,
    /// Wide tables (256–1024) mixed with narrow ones: fusion is sized for
    /// the widest table, so such mixes are the non-separable cases.
    Wide,
}

impl Style {
    pub const ALL: [Style; 6] = [
        Style::Mixed,
        Style::Dlrm,
        Style::TraceLike,
        Style::Hot,
        Style::Cold,
        Style::Wide,
    ];
}

/// The ranges of the space. The default is the whole space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpaceConfig {
    pub dim_min: u32,
    pub dim_max: u32,
    pub log10_rows_min: f64,
    pub log10_rows_max: f64,
    pub pooling_min: f64,
    pub pooling_max: f64,
    pub devices_min: usize,
    pub devices_max: usize,
    /// Tables per device.
    pub per_device_min: usize,
    pub per_device_max: usize,
    /// Tables per task at most: 64 devices × 64 tables would be 4096, too
    /// many to train on in minutes; a task over it keeps its devices and
    /// gets fewer tables per device.
    pub max_tables: usize,
    /// Memory per device as a multiple of an even share of the task's
    /// tables' memory, drawn uniformly (never under the largest table).
    pub share_min: f64,
    pub share_max: f64,
    /// Share of tasks whose memory never binds (every table fits on one
    /// device).
    pub roomy_share: f64,
    /// The largest table must fit this (GB): one device of a real cluster.
    pub device_gb: f64,
    /// Samples per batch that the reuse bins refer to.
    pub batch: u64,
    /// The styles tasks draw from, uniformly.
    pub styles: Vec<Style>,
}

impl Default for SpaceConfig {
    fn default() -> Self {
        SpaceConfig {
            dim_min: 4,
            dim_max: 1024,
            log10_rows_min: 2.0,
            log10_rows_max: 9.0,
            pooling_min: 0.1,
            pooling_max: 300.0,
            devices_min: 2,
            devices_max: 64,
            per_device_min: 1,
            per_device_max: 64,
            max_tables: 512,
            share_min: 1.05,
            share_max: 4.0,
            roomy_share: 0.25,
            device_gb: 80.0,
            batch: 65536,
            styles: Style::ALL.to_vec(),
        }
    }
}

impl SpaceConfig {
    /// Checks every range; the message names the field and its value.
    pub fn validate(&self) -> Result<(), String> {
        let f = |name: &str| format!("space.{name}");
        if self.dim_min < 4 || self.dim_min % 4 != 0 || self.dim_max > 1024 || self.dim_max % 4 != 0
        {
            return Err(format!(
                "{} = {} and {} = {} must be multiples of 4 in 4..=1024",
                f("dim_min"),
                self.dim_min,
                f("dim_max"),
                self.dim_max
            ));
        }
        let ordered = |lo: f64, hi: f64, name: &str| {
            if lo.is_finite() && hi.is_finite() && lo <= hi {
                Ok(())
            } else {
                Err(format!(
                    "{}_min = {lo} must not exceed {}_max = {hi}",
                    f(name),
                    f(name)
                ))
            }
        };
        ordered(self.dim_min as f64, self.dim_max as f64, "dim")?;
        ordered(self.log10_rows_min, self.log10_rows_max, "log10_rows")?;
        if self.log10_rows_min < 0.0 || self.log10_rows_max > 9.0 {
            return Err(format!(
                "{} and {} must lie in [0, 9]",
                f("log10_rows_min"),
                f("log10_rows_max")
            ));
        }
        ordered(self.pooling_min, self.pooling_max, "pooling")?;
        if self.pooling_min <= 0.0 || self.pooling_max > crate::pool::MAX_POOLING {
            return Err(format!(
                "{} = {} must be positive and {} = {} at most {}",
                f("pooling_min"),
                self.pooling_min,
                f("pooling_max"),
                self.pooling_max,
                crate::pool::MAX_POOLING
            ));
        }
        ordered(self.devices_min as f64, self.devices_max as f64, "devices")?;
        if self.devices_min < 2 || self.devices_max > crate::placement::MAX_DEVICES {
            return Err(format!(
                "{} = {} must be at least 2 and {} = {} at most {}",
                f("devices_min"),
                self.devices_min,
                f("devices_max"),
                self.devices_max,
                crate::placement::MAX_DEVICES
            ));
        }
        ordered(
            self.per_device_min as f64,
            self.per_device_max as f64,
            "per_device",
        )?;
        if self.per_device_min < 1 {
            return Err(format!("{} must be at least 1", f("per_device_min")));
        }
        if self.max_tables < self.devices_min {
            return Err(format!(
                "{} = {} must be at least {} = {}",
                f("max_tables"),
                self.max_tables,
                f("devices_min"),
                self.devices_min
            ));
        }
        ordered(self.share_min, self.share_max, "share")?;
        if self.share_min < 1.0 {
            return Err(format!(
                "{} = {} must be at least 1 (an even share)",
                f("share_min"),
                self.share_min
            ));
        }
        if !(0.0..=1.0).contains(&self.roomy_share) {
            return Err(format!(
                "{} = {} must lie in [0, 1]",
                f("roomy_share"),
                self.roomy_share
            ));
        }
        if !(self.device_gb.is_finite() && self.device_gb > 0.0) {
            return Err(format!(
                "{} = {} must be a positive number",
                f("device_gb"),
                self.device_gb
            ));
        }
        if self.batch == 0 {
            return Err(format!("{} must be at least 1", f("batch")));
        }
        if self.styles.is_empty() {
            return Err(format!("{} must name at least one style", f("styles")));
        }
        Ok(())
    }
}

/// `exp` of a uniform draw in `[ln lo, ln hi]`.
fn log_uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> f64 {
    if lo >= hi {
        return lo;
    }
    rng.gen_range(lo.ln()..=hi.ln()).exp()
}

/// A multiple of 4 in `[lo, hi]`, near `x`.
fn dim_of(x: f64, lo: u32, hi: u32) -> u32 {
    (((x / 4.0).round() as u32) * 4).clamp(lo, hi)
}

/// Geometric bins `bin_k ∝ (1 − r)·r^k`, the tail folded into `bin_16`:
/// `r` near 0 is cold, near 1 hot.
fn geometric(r: f64) -> [f64; NUM_BINS] {
    let mut bins = [0.0; NUM_BINS];
    for (k, b) in bins.iter_mut().enumerate().take(NUM_BINS - 1) {
        *b = (1.0 - r) * r.powi(k as i32);
    }
    bins[NUM_BINS - 1] = r.powi(NUM_BINS as i32 - 1);
    bins
}

/// A bump of bins around bucket `centre` with `width` (in buckets), as a
/// lookup trace's reuse histogram looks: rows reused about `2^centre`
/// times, few used once.
fn bump(centre: f64, width: f64) -> [f64; NUM_BINS] {
    let mut bins = [0.0; NUM_BINS];
    for (k, b) in bins.iter_mut().enumerate() {
        let z = (k as f64 - centre) / width.max(0.3);
        *b = (-0.5 * z * z).exp();
    }
    normalised(bins)
}

fn normalised(mut bins: [f64; NUM_BINS]) -> [f64; NUM_BINS] {
    let total: f64 = bins.iter().sum();
    if total > 0.0 {
        bins.iter_mut().for_each(|b| *b /= total);
    } else {
        bins = [0.0; NUM_BINS];
        bins[0] = 1.0;
    }
    bins
}

/// The same bins one bucket hotter (bin_16 keeps what reaches it).
fn hotter(bins: &[f64; NUM_BINS]) -> [f64; NUM_BINS] {
    let mut out = [0.0; NUM_BINS];
    for k in 0..NUM_BINS {
        out[(k + 1).min(NUM_BINS - 1)] += bins[k];
    }
    out
}

/// Per-task draws that a style's tables share.
#[derive(Debug, Clone, Copy)]
struct TaskLook {
    style: Style,
    /// The task's band of dims (TraceLike).
    dims: (u32, u32),
    /// The task's centre of reuse (TraceLike).
    centre: f64,
}

impl TaskLook {
    fn draw(cfg: &SpaceConfig, style: Style, rng: &mut impl Rng) -> TaskLook {
        let lo = log_uniform(rng, cfg.dim_min as f64, cfg.dim_max as f64);
        let lo = dim_of(lo, cfg.dim_min, cfg.dim_max);
        let hi = dim_of(
            lo as f64 * rng.gen_range(1.0..4.0),
            cfg.dim_min,
            cfg.dim_max,
        );
        TaskLook {
            style,
            dims: (lo, hi.max(lo)),
            centre: rng.gen_range(2.0..12.0),
        }
    }
}

/// One table of `look`'s style.
fn table_of(cfg: &SpaceConfig, look: &TaskLook, rng: &mut impl Rng, name: String) -> Table {
    let (dlo, dhi) = (cfg.dim_min as f64, cfg.dim_max as f64);
    let clamp_dim = |x: f64| dim_of(x, cfg.dim_min, cfg.dim_max);
    let (dim, pooling, bins) = match look.style {
        Style::Mixed => (
            clamp_dim(log_uniform(rng, dlo, dhi)),
            pooling_of(cfg, rng),
            if rng.gen_bool(0.5) {
                geometric(rng.gen_range(0.02..0.98))
            } else {
                bump(rng.gen_range(0.0..16.0), rng.gen_range(0.5..4.0))
            },
        ),
        Style::Dlrm => {
            let dims = [16.0, 32.0, 64.0, 128.0];
            (
                clamp_dim(dims[rng.gen_range(0..dims.len())]),
                log_uniform(rng, 1.0, 100.0),
                geometric(rng.gen_range(0.46..0.56)),
            )
        }
        Style::TraceLike => {
            let (a, b) = look.dims;
            let mut bins = bump(
                look.centre + rng.gen_range(-1.0..1.0),
                rng.gen_range(0.7..2.0),
            );
            bins[0] *= 0.05;
            (
                clamp_dim(log_uniform(rng, a as f64, b as f64)),
                pooling_of(cfg, rng),
                normalised(bins),
            )
        }
        Style::Hot => (
            clamp_dim(log_uniform(rng, dlo, dhi)),
            pooling_of(cfg, rng),
            if rng.gen_bool(0.5) {
                geometric(rng.gen_range(0.85..0.99))
            } else {
                // Some rows once, the rest looked up thousands of times.
                let mut bins = bump(rng.gen_range(11.0..16.0), 1.0);
                let once = rng.gen_range(0.0..0.5);
                bins.iter_mut().for_each(|b| *b *= 1.0 - once);
                bins[0] += once;
                bins
            },
        ),
        Style::Cold => {
            let mut bins = geometric(rng.gen_range(0.01..0.3));
            if rng.gen_bool(0.3) {
                bins = [0.0; NUM_BINS];
                bins[0] = 1.0;
            }
            (
                clamp_dim(log_uniform(rng, dlo, dhi)),
                pooling_of(cfg, rng),
                bins,
            )
        }
        Style::Wide => (
            if rng.gen_bool(0.4) {
                clamp_dim(log_uniform(rng, 256f64.clamp(dlo, dhi), dhi))
            } else {
                clamp_dim(log_uniform(rng, dlo, 64f64.clamp(dlo, dhi)))
            },
            pooling_of(cfg, rng),
            geometric(rng.gen_range(0.2..0.9)),
        ),
    };
    let pooling = pooling.clamp(cfg.pooling_min, cfg.pooling_max);
    let max_rows_by_memory = |dim: u32| {
        let mem = MemoryModel::default();
        // Bytes per row of the default memory model (weights and
        // optimizer state), bounded by one device.
        let per_row = mem.table_bytes(&Table::cold("r", 1_000_000, dim, 1.0)) as f64 / 1e6;
        (cfg.device_gb * BYTES_PER_GB / per_row).floor()
    };
    let rows_cap = (10f64.powf(cfg.log10_rows_max)).min(max_rows_by_memory(dim));
    let rows_floor = 10f64.powf(cfg.log10_rows_min).min(rows_cap);
    let mut rows = log_uniform(rng, rows_floor, rows_cap).round().max(1.0);
    let mut t = Table {
        name,
        rows: rows as u64,
        dim,
        pooling_factor: pooling,
        bins: normalised(bins),
    };
    // Consistency: unique rows in a batch at most the rows.
    let unique = |t: &Table| cfg.batch as f64 * t.pooling_factor / t.mean_reuse();
    if unique(&t) > rows {
        let needed = unique(&t).ceil();
        if needed <= rows_cap {
            rows = needed;
            t.rows = rows as u64;
        } else {
            for _ in 0..NUM_BINS {
                if unique(&t) <= t.rows as f64 {
                    break;
                }
                t.bins = hotter(&t.bins);
            }
        }
    }
    t
}

/// A pooling factor from the whole range.
fn pooling_of(cfg: &SpaceConfig, rng: &mut impl Rng) -> f64 {
    log_uniform(rng, cfg.pooling_min, cfg.pooling_max)
}

/// One table of `style`, named `name`.
pub fn table(cfg: &SpaceConfig, style: Style, rng: &mut impl Rng, name: String) -> Table {
    let look = TaskLook::draw(cfg, style, rng);
    table_of(cfg, &look, rng, name)
}

/// One task named `name`: devices, tables per device, one style for its
/// tables, and memory per device (see the module doc); always has a plan
/// that fits (first-fit decreasing finds one).
pub fn task(cfg: &SpaceConfig, rng: &mut impl Rng, name: String, mem: &MemoryModel) -> Task {
    let devices = log_uniform(rng, cfg.devices_min as f64, cfg.devices_max as f64 + 0.999)
        .floor()
        .clamp(cfg.devices_min as f64, cfg.devices_max as f64) as usize;
    let per_device = log_uniform(
        rng,
        cfg.per_device_min as f64,
        cfg.per_device_max as f64 + 0.999,
    )
    .floor()
    .clamp(cfg.per_device_min as f64, cfg.per_device_max as f64) as usize;
    let count = (devices * per_device).min(cfg.max_tables).max(1);
    let style = cfg.styles[rng.gen_range(0..cfg.styles.len())];
    let look = TaskLook::draw(cfg, style, rng);
    let tables: Vec<Table> = (0..count)
        .map(|i| table_of(cfg, &look, rng, format!("{name}/t{i}")))
        .collect();
    let roomy = rng.gen_bool(cfg.roomy_share);
    let mut share = if roomy {
        devices as f64
    } else {
        rng.gen_range(cfg.share_min..=cfg.share_max)
    };
    loop {
        let memory_gb = share_memory_gb(&tables, devices, share, mem);
        let cap = (memory_gb * BYTES_PER_GB) as u64;
        if first_fit_decreasing(&tables, devices, cap, mem).is_some() || share >= devices as f64 {
            return Task {
                name,
                devices,
                memory_gb,
                tables,
            };
        }
        // Bin packing at this share failed: a little more room.
        share *= 1.02;
    }
}

/// `n` tasks from `seed`, named `{prefix}-{k:04}`: the same config and
/// seed give the same tasks.
pub fn tasks(cfg: &SpaceConfig, n: usize, seed: u64, prefix: &str, mem: &MemoryModel) -> Vec<Task> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|k| task(cfg, &mut rng, format!("{prefix}-{k:04}"), mem))
        .collect()
}

/// Tasks as a suite file and the pool of all their tables (names are
/// unique across tasks); `pool_ref` is written as the suite's pool path.
pub fn suite(tasks: &[Task], pool_ref: &str) -> (Vec<Table>, SuiteFile) {
    let pool: Vec<Table> = tasks
        .iter()
        .flat_map(|t| t.tables.iter().cloned())
        .collect();
    let specs = tasks
        .iter()
        .map(|t| TaskSpec {
            name: t.name.clone(),
            devices: t.devices,
            memory_gb: t.memory_gb,
            tables: t.tables.iter().map(|x| x.name.clone()).collect(),
        })
        .collect();
    (
        pool,
        SuiteFile {
            pool: pool_ref.to_string(),
            tasks: specs,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many(cfg: &SpaceConfig, n: usize, seed: u64) -> Vec<Table> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let style = cfg.styles[i % cfg.styles.len()];
                table(cfg, style, &mut rng, format!("t{i}"))
            })
            .collect()
    }

    #[test]
    fn tables_lie_within_the_ranges_and_are_consistent() {
        let cfg = SpaceConfig::default();
        let mem = MemoryModel::default();
        for t in many(&cfg, 3000, 1) {
            assert!(t.dim % 4 == 0 && (4..=1024).contains(&t.dim), "{}", t.dim);
            assert!((1..=1_000_000_000).contains(&t.rows), "{}", t.rows);
            assert!(
                (0.1..=300.0).contains(&t.pooling_factor),
                "{}",
                t.pooling_factor
            );
            let sum: f64 = t.bins.iter().sum();
            assert!((sum - 1.0).abs() < 1e-9 && t.bins.iter().all(|&b| b >= 0.0));
            let unique = cfg.batch as f64 * t.pooling_factor / t.mean_reuse();
            assert!(unique <= t.rows as f64 * 1.000001, "{unique} > {}", t.rows);
            assert!(mem.table_gb(&t) <= cfg.device_gb, "{}", mem.table_gb(&t));
        }
    }

    #[test]
    fn the_space_is_covered() {
        let cfg = SpaceConfig::default();
        let tables = many(&cfg, 3000, 2);
        let any = |f: &dyn Fn(&Table) -> bool| tables.iter().any(f);
        assert!(any(&|t| !t.dim.is_power_of_two()));
        assert!(any(&|t| t.dim < 16) && any(&|t| t.dim > 512));
        assert!(any(&|t| t.pooling_factor < 1.0) && any(&|t| t.pooling_factor > 100.0));
        assert!(any(&|t| t.rows < 1000) && any(&|t| t.rows > 100_000_000));
        let trace = many(
            &SpaceConfig {
                styles: vec![Style::TraceLike],
                ..cfg.clone()
            },
            200,
            3,
        );
        assert!(trace.iter().filter(|t| t.bins[0] < 0.05).count() > 150);
        let cold = many(
            &SpaceConfig {
                styles: vec![Style::Cold],
                ..cfg.clone()
            },
            200,
            3,
        );
        assert!(cold.iter().filter(|t| t.bins[0] > 0.8).count() > 100);
    }

    #[test]
    fn tasks_are_seeded_feasible_and_span_the_shapes() {
        let cfg = SpaceConfig {
            max_tables: 256,
            ..SpaceConfig::default()
        };
        let mem = MemoryModel::default();
        let a = tasks(&cfg, 120, 7, "p", &mem);
        assert_eq!(a, tasks(&cfg, 120, 7, "p", &mem));
        assert_ne!(a, tasks(&cfg, 120, 8, "p", &mem));
        for t in &a {
            assert!((2..=64).contains(&t.devices));
            assert!(!t.tables.is_empty() && t.tables.len() <= 256);
            let cap = t.cap_bytes();
            assert!(
                first_fit_decreasing(&t.tables, t.devices, cap, &mem).is_some(),
                "{}",
                t.name
            );
            assert_eq!(t.infeasibility(&mem), None);
        }
        assert!(a.iter().any(|t| t.devices <= 3) && a.iter().any(|t| t.devices >= 32));
        let density = |t: &Task| t.tables.len() as f64 / t.devices as f64;
        assert!(a.iter().any(|t| density(t) <= 2.0) && a.iter().any(|t| density(t) >= 32.0));
        assert_eq!(a[3].name, "p-0003");
    }

    #[test]
    fn tight_tasks_get_about_the_share_asked_for() {
        let cfg = SpaceConfig {
            share_min: 1.05,
            share_max: 1.05,
            roomy_share: 0.0,
            max_tables: 128,
            ..SpaceConfig::default()
        };
        let mem = MemoryModel::default();
        let (mut bound, mut near) = (0, 0);
        let all = tasks(&cfg, 60, 3, "tight", &mem);
        for t in &all {
            let bytes: Vec<u64> = t.tables.iter().map(|x| mem.table_bytes(x)).collect();
            let even = bytes.iter().sum::<u64>() as f64 / t.devices as f64;
            let largest = *bytes.iter().max().unwrap() as f64;
            let share = t.cap_bytes() as f64 / even;
            assert!(share >= 1.05 - 1e-6, "{}: {share}", t.name);
            // Where no one table needs more, the share asked for binds
            // (raised a little only where bin packing needed it).
            if largest < 1.05 * even {
                bound += 1;
                if share < 1.2 {
                    near += 1;
                }
            } else {
                assert!(
                    (t.cap_bytes() as f64) < largest * 1.3,
                    "{}: {share}",
                    t.name
                );
            }
        }
        assert!(bound >= 10, "{bound} tasks where the share binds");
        assert!(near * 10 >= bound * 9, "{near} of {bound} near 1.05");
    }

    #[test]
    fn bad_ranges_are_named() {
        let bad = |f: fn(&mut SpaceConfig), field: &str| {
            let mut cfg = SpaceConfig::default();
            f(&mut cfg);
            let e = cfg.validate().unwrap_err();
            assert!(e.contains(field), "{e}");
        };
        bad(|c| c.dim_min = 3, "space.dim_min");
        bad(|c| c.devices_min = 1, "space.devices_min");
        bad(|c| c.share_min = 0.9, "space.share_min");
        bad(|c| c.pooling_min = 500.0, "space.pooling_min");
        bad(|c| c.styles.clear(), "space.styles");
        assert_eq!(SpaceConfig::default().validate(), Ok(()));
        let narrow = SpaceConfig {
            devices_min: 3,
            devices_max: 3,
            ..SpaceConfig::default()
        };
        assert_eq!(narrow.validate(), Ok(()));
        let mem = MemoryModel::default();
        assert!(tasks(&narrow, 10, 1, "n", &mem)
            .iter()
            .all(|t| t.devices == 3));
    }

    #[test]
    fn a_suite_names_each_table_once_and_its_pool_holds_them() {
        let mem = MemoryModel::default();
        let cfg = SpaceConfig {
            max_tables: 64,
            ..SpaceConfig::default()
        };
        let all = tasks(&cfg, 5, 1, "s", &mem);
        let (pool, file) = suite(&all, "s.csv");
        assert_eq!(file.pool, "s.csv");
        let names: std::collections::HashSet<&str> = pool.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), pool.len(), "unique names");
        for (spec, task) in file.tasks.iter().zip(&all) {
            assert_eq!(spec.tables.len(), task.tables.len());
            for (n, t) in spec.tables.iter().zip(&task.tables) {
                assert_eq!(pool.iter().find(|p| &p.name == n), Some(t));
            }
        }
    }
}
