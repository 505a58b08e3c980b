//! A seeded generator of tables and placement tasks over the whole table
//! space. It makes the pre-training data of `learner pretrain`. It also
//! makes held-out suites of shapes a model never trained on. The DLRM-like
//! pool of [`crate::generate`] stays the main job's data.
//!
//! # Styles
//!
//! Each task draws one [`Style`], then all its tables from that style.
//! Tasks thus differ from one another, as real models do: one model's
//! tables are all narrow, another's mix narrow and very wide ones.
//!
//! # Ranges
//!
//! | what | range | drawn as, and why |
//! |---|---|---|
//! | dim | 4–1024, multiples of 4 | log-uniform, rounded to 4: production dims are not only powers of two |
//! | rows | 10²–10⁹, within `device_gb` | log-uniform: hash sizes span seven orders of magnitude |
//! | pooling | 0.1–300 | log-uniform: optional features are looked up less than once per sample |
//! | reuse bins | flat to extremely hot, trace-like | per style: how often rows repeat in a batch differs most between models |
//! | devices | 2–64 | log-uniform: each doubling as likely, so small and large clusters both appear |
//! | tables per device | 1–64 | log-uniform: sparse and dense tasks both appear |
//! | tables per task | at most `max_tables` (512) | larger tasks take too long to train on |
//! | memory per device | 1.05× an even share to 4×, or roomy | uniform share: tight caps change the best plan |
//!
//! The `Dlrm` style keeps to its own narrower ranges ([`Style::Dlrm`]).
//!
//! # Memory
//!
//! `device_gb` bounds every table: its weights and optimizer state fit
//! one device. The bound uses the default memory model (fp16 weights,
//! row-wise Adagrad), so the same seed gives the same tables under any
//! model. A task's memory per device is `share` times an even share of
//! its tables' memory ([`share_memory_gb`]), never under its largest
//! table. Where first-fit decreasing finds no plan at that share, the
//! share is raised by 2 % until it does. A `roomy_share` of tasks (a
//! quarter by default) get the share `devices`: every table fits one
//! device, so memory never binds.
//!
//! # Consistency
//!
//! A table cannot touch more unique rows in one batch than it has. The
//! rows it touches are `batch × pooling / mean reuse`
//! ([`Table::mean_reuse`]). Where that exceeds its rows, three steps
//! apply in order, each only if the one before left it inconsistent:
//!
//! 1. its rows are raised to that count, if it still fits `device_gb` and
//!    `10^log10_rows_max`;
//! 2. its reuse bins are made hotter, one bucket at a time, until it is
//!    consistent or all rows are in `bin_16`;
//! 3. its pooling is lowered to what its rows allow.
//!
//! [`SpaceConfig::validate`] rejects ranges where step 3 would go under
//! `pooling_min`. Where `10^log10_rows_min` rows of a drawn dim exceed
//! `device_gb`, the dim is lowered to the widest that fits.
//!
//! # Narrowing the space
//!
//! A held-out suite narrows a range by setting its minimum and maximum:
//! `devices_min = devices_max = 3` gives every task 3 devices. A one-style
//! suite sets `styles` to that style alone. Narrowing the share keeps the
//! roomy tasks; `roomy_share = 0` gives every task the share asked for.
//! `max_tables` wins over `per_device_min`: a task over `max_tables` keeps
//! its devices and gets fewer tables per device.
//!
//! # Reproducibility
//!
//! The same config and seed give the same tasks. `models/pretrained` and
//! the held-out suites of `docs/results.md` were drawn by this code: a
//! change to the draws changes what their commands make.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::InvalidSetting;
use crate::pool::MAX_POOLING;
use crate::suite::{first_fit_decreasing, share_memory_gb, SuiteFile, TaskSpec};
use crate::table::{MemoryModel, Table, BYTES_PER_GB, NUM_BINS};
use crate::Task;

/// Smallest and largest dim of the space.
const DIM_RANGE: (u32, u32) = (4, 1024);
/// Largest `log10_rows_max`: 10⁹ rows, the top of the space.
const LOG10_ROWS_MAX: f64 = 9.0;

/// How a task's tables look. Each task draws one style, then all its
/// tables from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    /// Every feature from its full range, independently.
    Mixed,
    /// Like the DLRM-like pool of [`crate::generate`]: dims 16–128 in
    /// powers of two, geometric reuse with about half the rows used once,
    /// pooling 1–100.
    Dlrm,
    /// Like tables derived from a lookup trace: each task has a narrow band
    /// of dims, reuse is concentrated in middle buckets (up to nearly all
    /// rows in one), and almost no row is used once.
    TraceLike,
    /// Extremely skewed: most lookups fall on rows read thousands of times.
    Hot,
    /// Little reuse: most rows are read once per batch.
    Cold,
    /// Wide tables (256–1024) mixed with narrow ones. Fusion is sized for
    /// the widest table, so such mixes are the non-separable cases.
    Wide,
    /// Tables as a CSV without reuse bins gives them: any dim, pooling
    /// 1–100, and the bins `plan` fills in for them
    /// ([`crate::generate::default_bins`] of their rows and pooling). Not
    /// in [`Style::ALL`]: name it in `styles` to draw it.
    Defaults,
}

impl Style {
    /// Every style, the default of [`SpaceConfig::styles`].
    pub const ALL: [Style; 6] = [
        Style::Mixed,
        Style::Dlrm,
        Style::TraceLike,
        Style::Hot,
        Style::Cold,
        Style::Wide,
    ];
}

/// The ranges of the space. The default is the whole space; a held-out
/// suite narrows some of them (module doc, "Narrowing the space").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpaceConfig {
    /// Dims, multiples of 4 in 4..=1024.
    pub dim_min: u32,
    pub dim_max: u32,
    /// log10 of the rows, in [0, 9].
    pub log10_rows_min: f64,
    pub log10_rows_max: f64,
    /// Lookups per sample; under 1 for optional features.
    pub pooling_min: f64,
    pub pooling_max: f64,
    /// Devices per task, at least 2: one device leaves nothing to place.
    pub devices_min: usize,
    pub devices_max: usize,
    /// Tables per device.
    pub per_device_min: usize,
    pub per_device_max: usize,
    /// Tables per task at most. 64 devices × 64 tables would be 4096
    /// tables, too many to train on in minutes. A task over it keeps its
    /// devices and gets fewer tables per device.
    pub max_tables: usize,
    /// Memory per device as a multiple of an even share of the task's
    /// tables' memory, drawn uniformly (never under the largest table).
    pub share_min: f64,
    pub share_max: f64,
    /// Share of tasks whose memory never binds: their share is their
    /// device count, so every table fits one device.
    pub roomy_share: f64,
    /// GB that every table fits (weights and state under the default
    /// memory model): one device of a real cluster, an 80 GB H100 by
    /// default. It bounds `rows × dim`.
    pub device_gb: f64,
    /// Samples per batch that the reuse bins refer to.
    pub batch: u64,
    /// The styles tasks draw from, uniformly.
    pub styles: Vec<Style>,
}

impl Default for SpaceConfig {
    fn default() -> Self {
        SpaceConfig {
            dim_min: DIM_RANGE.0,
            dim_max: DIM_RANGE.1,
            log10_rows_min: 2.0,
            log10_rows_max: LOG10_ROWS_MAX,
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
    /// Checks every range; the message names the field (`space.<name>`)
    /// and its value.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.validate_tables()?;
        self.validate_tasks()?;
        self.validate_reach()
    }

    /// The tables' ranges: dims, rows, pooling.
    fn validate_tables(&self) -> Result<(), InvalidSetting> {
        dim("dim_min", self.dim_min)?;
        dim("dim_max", self.dim_max)?;
        ordered("dim", self.dim_min as f64, self.dim_max as f64)?;
        within("log10_rows_min", self.log10_rows_min, 0.0, LOG10_ROWS_MAX)?;
        within("log10_rows_max", self.log10_rows_max, 0.0, LOG10_ROWS_MAX)?;
        ordered("log10_rows", self.log10_rows_min, self.log10_rows_max)?;
        if !(self.pooling_min.is_finite() && self.pooling_min > 0.0) {
            return Err(InvalidSetting::new(
                "space.pooling_min",
                format!(
                    "space.pooling_min = {} must be a positive number",
                    self.pooling_min
                ),
            ));
        }
        within("pooling_max", self.pooling_max, 0.0, MAX_POOLING)?;
        ordered("pooling", self.pooling_min, self.pooling_max)?;
        Ok(())
    }

    /// The tasks' ranges: devices, tables per device, memory, batch, styles.
    fn validate_tasks(&self) -> Result<(), InvalidSetting> {
        let max_devices = crate::placement::MAX_DEVICES;
        if !(2..=max_devices).contains(&self.devices_min) {
            return Err(InvalidSetting::new(
                "space.devices_min",
                format!(
                    "space.devices_min = {} must lie in 2..={max_devices}",
                    self.devices_min
                ),
            ));
        }
        if self.devices_max > max_devices {
            return Err(InvalidSetting::new(
                "space.devices_max",
                format!(
                    "space.devices_max = {} must be at most {max_devices}",
                    self.devices_max
                ),
            ));
        }
        ordered("devices", self.devices_min as f64, self.devices_max as f64)?;
        if self.per_device_min < 1 {
            return Err(InvalidSetting::new(
                "space.per_device_min",
                format!(
                    "space.per_device_min = {} must be at least 1",
                    self.per_device_min
                ),
            ));
        }
        ordered(
            "per_device",
            self.per_device_min as f64,
            self.per_device_max as f64,
        )?;
        if self.max_tables < self.devices_min {
            return Err(InvalidSetting::new(
                "space.max_tables",
                format!(
                    "space.max_tables = {} must be at least space.devices_min = {}",
                    self.max_tables, self.devices_min
                ),
            ));
        }
        if !(self.share_min.is_finite() && self.share_min >= 1.0) {
            return Err(InvalidSetting::new(
                "space.share_min",
                format!(
                    "space.share_min = {} must be at least 1 (an even share)",
                    self.share_min
                ),
            ));
        }
        if !self.share_max.is_finite() {
            return Err(InvalidSetting::new(
                "space.share_max",
                format!(
                    "space.share_max = {} must be a finite number",
                    self.share_max
                ),
            ));
        }
        ordered("share", self.share_min, self.share_max)?;
        within("roomy_share", self.roomy_share, 0.0, 1.0)?;
        if !(self.device_gb.is_finite() && self.device_gb > 0.0) {
            return Err(InvalidSetting::new(
                "space.device_gb",
                format!(
                    "space.device_gb = {} must be a positive number",
                    self.device_gb
                ),
            ));
        }
        if self.batch == 0 {
            return Err(InvalidSetting::new(
                "space.batch",
                "space.batch = 0 must be at least 1",
            ));
        }
        if self.styles.is_empty() {
            return Err(InvalidSetting::new(
                "space.styles",
                "space.styles = [] must name at least one style",
            ));
        }
        Ok(())
    }

    /// That the ranges can be drawn from together.
    fn validate_reach(&self) -> Result<(), InvalidSetting> {
        // The fewest rows must fit one device at the narrowest dim.
        let fewest = rows_floor(self);
        if fewest > rows_that_fit(self, self.dim_min) {
            return Err(InvalidSetting::new(
                "space.log10_rows_min",
                format!(
                    "space.log10_rows_min = {}: {fewest} rows of dim space.dim_min = {} \
                 need more than space.device_gb = {} GiB",
                    self.log10_rows_min, self.dim_min, self.device_gb
                ),
            ));
        }
        // Consistency (module doc) must be reachable without going under
        // pooling_min: the fewest rows, each read as often as bin_16 says.
        let touched = self.batch as f64 * self.pooling_min / Table::bin_count(NUM_BINS - 1);
        if touched > fewest {
            return Err(InvalidSetting::new(
                "space.pooling_min",
                format!(
                    "space.pooling_min = {}: {touched:.0} unique rows a batch even at the \
                 hottest reuse, more than the {fewest} rows of space.log10_rows_min = {} \
                 (space.batch = {})",
                    self.pooling_min, self.log10_rows_min, self.batch
                ),
            ));
        }
        Ok(())
    }
}

/// `space.<name> = v`: a multiple of 4 among the dims the space allows.
fn dim(name: &str, v: u32) -> Result<(), InvalidSetting> {
    if v % 4 == 0 && (DIM_RANGE.0..=DIM_RANGE.1).contains(&v) {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            format!("space.{name}"),
            format!(
                "space.{name} = {v} must be a multiple of 4 in {}..={}",
                DIM_RANGE.0, DIM_RANGE.1
            ),
        ))
    }
}

/// `space.<name> = v`: a finite number in `[lo, hi]`.
fn within(name: &str, v: f64, lo: f64, hi: f64) -> Result<(), InvalidSetting> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            format!("space.{name}"),
            format!("space.{name} = {v} must lie in [{lo}, {hi}]"),
        ))
    }
}

/// `space.<name>_min` no more than `space.<name>_max`.
fn ordered(name: &str, lo: f64, hi: f64) -> Result<(), InvalidSetting> {
    if lo <= hi {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            format!("space.{name}_min"),
            format!("space.{name}_min = {lo} must not exceed space.{name}_max = {hi}"),
        ))
    }
}

/// Bytes of one row of `dim` under the default memory model, which
/// `device_gb` bounds (module doc, "Memory").
fn bytes_per_row(dim: u32) -> f64 {
    let mem = MemoryModel::default();
    mem.table_bytes(&Table::cold("r", 1_000_000, dim, 1.0)) as f64 / 1e6
}

/// The most rows of `dim` that fit `device_gb`.
fn rows_that_fit(cfg: &SpaceConfig, dim: u32) -> f64 {
    (cfg.device_gb * BYTES_PER_GB / bytes_per_row(dim)).floor()
}

/// The fewest rows a table has: `10^log10_rows_min`, rounded up.
fn rows_floor(cfg: &SpaceConfig) -> f64 {
    10f64.powf(cfg.log10_rows_min).ceil()
}

/// `exp` of a uniform draw in `[ln lo, ln hi]`; `lo` where the range is
/// empty or one point.
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

/// Bins scaled to sum to 1; all in `bin_0` where they sum to nothing.
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

/// The same bins one bucket hotter (`bin_16` keeps what reaches it).
fn hotter(bins: &[f64; NUM_BINS]) -> [f64; NUM_BINS] {
    let mut out = [0.0; NUM_BINS];
    for k in 0..NUM_BINS {
        out[(k + 1).min(NUM_BINS - 1)] += bins[k];
    }
    out
}

/// Unique rows `t` touches in one batch of `batch` samples.
fn touched_rows(t: &Table, batch: u64) -> f64 {
    batch as f64 * t.pooling_factor / t.mean_reuse()
}

/// Makes `t` touch no more unique rows than it has, by the rule of the
/// module doc ("Consistency"); `rows_cap` is the most rows it may have.
fn make_consistent(t: &mut Table, batch: u64, rows_cap: f64) {
    let rows = t.rows as f64;
    if touched_rows(t, batch) <= rows {
        return;
    }
    // 1. More rows, where they fit.
    let needed = touched_rows(t, batch).ceil();
    if needed <= rows_cap {
        t.rows = needed as u64;
        return;
    }
    // 2. Hotter bins: after NUM_BINS − 1 shifts all rows are in bin_16.
    for _ in 0..NUM_BINS - 1 {
        if touched_rows(t, batch) <= rows {
            return;
        }
        t.bins = hotter(&t.bins);
    }
    // 3. Fewer lookups. A hair under the bound, so that rounding cannot
    // leave the table a row over.
    if touched_rows(t, batch) > rows {
        t.pooling_factor = rows * t.mean_reuse() / batch as f64 * (1.0 - 1e-12);
    }
}

/// Per-task draws that a style's tables share.
#[derive(Debug, Clone, Copy)]
struct TaskLook {
    style: Style,
    /// The task's band of dims (TraceLike).
    dims: (u32, u32),
    /// The task's centre of reuse, in buckets (TraceLike).
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

/// The DLRM-like pool's dims.
const DLRM_DIMS: [u32; 4] = [16, 32, 64, 128];
/// The DLRM-like pool's range of pooling factors (log-uniform here).
const DLRM_POOLING: (f64, f64) = (1.0, 100.0);

/// A pooling factor in the DLRM-like range within `cfg`'s (log-uniform);
/// the whole DLRM-like range where the two do not meet.
fn dlrm_pooling(cfg: &SpaceConfig, rng: &mut impl Rng) -> f64 {
    let lo = DLRM_POOLING.0.max(cfg.pooling_min);
    let hi = DLRM_POOLING.1.min(cfg.pooling_max);
    if lo <= hi {
        log_uniform(rng, lo, hi)
    } else {
        log_uniform(rng, DLRM_POOLING.0, DLRM_POOLING.1)
    }
}

/// One table of `look`'s style.
fn table_of(cfg: &SpaceConfig, look: &TaskLook, rng: &mut impl Rng, name: String) -> Table {
    let (dlo, dhi) = (cfg.dim_min as f64, cfg.dim_max as f64);
    let clamp_dim = |x: f64| dim_of(x, cfg.dim_min, cfg.dim_max);
    let pooling_of = |rng: &mut _| log_uniform(rng, cfg.pooling_min, cfg.pooling_max);
    let (dim, pooling, bins) = match look.style {
        Style::Mixed => (
            clamp_dim(log_uniform(rng, dlo, dhi)),
            pooling_of(rng),
            if rng.gen_bool(0.5) {
                geometric(rng.gen_range(0.02..0.98))
            } else {
                bump(rng.gen_range(0.0..16.0), rng.gen_range(0.5..4.0))
            },
        ),
        Style::Dlrm => {
            // Within a narrowed space, the DLRM dims and pooling inside it;
            // where none lie inside, the nearest bound.
            let inside: Vec<u32> = DLRM_DIMS
                .into_iter()
                .filter(|d| (cfg.dim_min..=cfg.dim_max).contains(d))
                .collect();
            let dims = if inside.is_empty() {
                DLRM_DIMS.to_vec()
            } else {
                inside
            };
            let dim = clamp_dim(dims[rng.gen_range(0..dims.len())] as f64);
            let pooling = dlrm_pooling(cfg, rng);
            (dim, pooling, geometric(rng.gen_range(0.46..0.56)))
        }
        Style::TraceLike => {
            let (a, b) = look.dims;
            // Widths from 0.3 buckets (a spike: a hot set read uniformly,
            // each row about as often) to 2 (a broad bump).
            let mut bins = bump(
                look.centre + rng.gen_range(-1.0..1.0),
                rng.gen_range(0.3..2.0),
            );
            bins[0] *= 0.05;
            (
                clamp_dim(log_uniform(rng, a as f64, b as f64)),
                pooling_of(rng),
                normalised(bins),
            )
        }
        Style::Hot => (
            clamp_dim(log_uniform(rng, dlo, dhi)),
            pooling_of(rng),
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
            (clamp_dim(log_uniform(rng, dlo, dhi)), pooling_of(rng), bins)
        }
        Style::Defaults => {
            let pooling = dlrm_pooling(cfg, rng);
            // The bins follow the rows, drawn below.
            (
                clamp_dim(log_uniform(rng, dlo, dhi)),
                pooling,
                geometric(0.5),
            )
        }
        Style::Wide => (
            if rng.gen_bool(0.4) {
                clamp_dim(log_uniform(rng, 256f64.clamp(dlo, dhi), dhi))
            } else {
                clamp_dim(log_uniform(rng, dlo, 64f64.clamp(dlo, dhi)))
            },
            pooling_of(rng),
            geometric(rng.gen_range(0.2..0.9)),
        ),
    };
    let pooling = pooling.clamp(cfg.pooling_min, cfg.pooling_max);
    // The widest dim at most this one at which the fewest rows fit a
    // device (validate makes dim_min fit).
    let floor = rows_floor(cfg);
    let mut dim = dim;
    while dim > cfg.dim_min && rows_that_fit(cfg, dim) < floor {
        dim -= 4;
    }
    let rows_cap = 10f64
        .powf(cfg.log10_rows_max)
        .floor()
        .min(rows_that_fit(cfg, dim));
    let rows = log_uniform(rng, floor.min(rows_cap), rows_cap)
        .round()
        .max(1.0);
    let mut t = Table {
        name,
        rows: rows as u64,
        dim,
        pooling_factor: pooling,
        bins: normalised(bins),
    };
    if look.style == Style::Defaults {
        t.bins = normalised(crate::generate::default_bins(t.rows, t.pooling_factor));
    }
    make_consistent(&mut t, cfg.batch, rows_cap);
    t
}

/// One table of `style`, named `name`. A style's per-task draws (the
/// TraceLike band of dims and centre of reuse) are drawn afresh for it.
pub fn table(cfg: &SpaceConfig, style: Style, rng: &mut impl Rng, name: String) -> Table {
    let look = TaskLook::draw(cfg, style, rng);
    table_of(cfg, &look, rng, name)
}

/// A count in `min..=max`, log-uniform.
fn count(rng: &mut impl Rng, min: usize, max: usize) -> usize {
    log_uniform(rng, min as f64, max as f64 + 0.999)
        .floor()
        .clamp(min as f64, max as f64) as usize
}

/// One task named `name`: its devices, tables per device, one style for
/// its tables, and memory per device (module doc, "Memory"). First-fit
/// decreasing always finds it a plan under its cap. Its tables are named
/// `{name}/t{i}`.
pub fn task(cfg: &SpaceConfig, rng: &mut impl Rng, name: String, mem: &MemoryModel) -> Task {
    let devices = count(rng, cfg.devices_min, cfg.devices_max);
    let per_device = count(rng, cfg.per_device_min, cfg.per_device_max);
    let tables_n = devices
        .saturating_mul(per_device)
        .min(cfg.max_tables)
        .max(1);
    let style = cfg.styles[rng.gen_range(0..cfg.styles.len())];
    let look = TaskLook::draw(cfg, style, rng);
    let tables: Vec<Table> = (0..tables_n)
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
        // At the share `devices` the cap holds every table: all fit one
        // device, so the loop ends there at the latest.
        if first_fit_decreasing(&tables, devices, cap, mem).is_some() || share >= devices as f64 {
            return Task {
                name,
                devices,
                memory_gb,
                tables,
            };
        }
        share *= 1.02;
    }
}

/// `n` tasks from `seed`, named `{prefix}-{k:04}`. The same config and
/// seed give the same tasks.
pub fn tasks(cfg: &SpaceConfig, n: usize, seed: u64, prefix: &str, mem: &MemoryModel) -> Vec<Task> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|k| task(cfg, &mut rng, format!("{prefix}-{k:04}"), mem))
        .collect()
}

/// Tasks as a suite file and the pool of all their tables, for a pool CSV
/// written next to the suite. Table names are unique across tasks (each
/// starts with its task's name). `pool_ref` is written as the suite's pool
/// path.
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
    use std::collections::HashMap;

    use super::*;
    use crate::suite::Suite;

    fn mem() -> MemoryModel {
        MemoryModel::default()
    }

    /// `n` tables from `seed`, the styles of `cfg` in turn.
    fn many(cfg: &SpaceConfig, n: usize, seed: u64) -> Vec<Table> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let style = cfg.styles[i % cfg.styles.len()];
                table(cfg, style, &mut rng, format!("t{i}"))
            })
            .collect()
    }

    /// Whether `t` lies within `cfg`'s ranges and is consistent.
    fn check_table(cfg: &SpaceConfig, t: &Table) {
        let name = &t.name;
        assert!(
            t.dim % 4 == 0 && (cfg.dim_min..=cfg.dim_max).contains(&t.dim),
            "{name}: dim {}",
            t.dim
        );
        let rows = t.rows as f64;
        assert!(
            rows >= 10f64.powf(cfg.log10_rows_min) && rows <= 10f64.powf(cfg.log10_rows_max),
            "{name}: rows {rows}"
        );
        assert!(
            (cfg.pooling_min..=cfg.pooling_max).contains(&t.pooling_factor),
            "{name}: pooling {}",
            t.pooling_factor
        );
        let sum: f64 = t.bins.iter().sum();
        assert!((sum - 1.0).abs() < 1e-9, "{name}: bins sum to {sum}");
        assert!(t.bins.iter().all(|&b| b >= 0.0), "{name}: {:?}", t.bins);
        let touched = touched_rows(t, cfg.batch);
        assert!(touched <= rows, "{name}: touches {touched} of {rows} rows");
        assert!(
            mem().table_gb(t) <= cfg.device_gb,
            "{name}: {} GiB",
            mem().table_gb(t)
        );
    }

    #[test]
    fn same_seed_same_draws_other_seed_other_draws() {
        let cfg = SpaceConfig {
            max_tables: 64,
            ..SpaceConfig::default()
        };
        assert_eq!(many(&cfg, 50, 1), many(&cfg, 50, 1));
        assert_ne!(many(&cfg, 50, 1), many(&cfg, 50, 2));
        let a = tasks(&cfg, 20, 7, "p", &mem());
        assert_eq!(a, tasks(&cfg, 20, 7, "p", &mem()));
        assert_ne!(a, tasks(&cfg, 20, 8, "p", &mem()));
        assert_eq!(a[3].name, "p-0003");
        assert_eq!(a[3].tables[1].name, "p-0003/t1");
    }

    #[test]
    fn tables_lie_within_the_ranges_and_are_consistent() {
        let cfg = SpaceConfig::default();
        for t in many(&cfg, 3000, 1) {
            check_table(&cfg, &t);
        }
    }

    /// A `Defaults` table has the bins `plan` fills in for a CSV without
    /// them. The style is drawn only where named.
    #[test]
    fn default_bins_tables_take_the_bins_a_csv_without_them_gets() {
        let cfg = SpaceConfig {
            styles: vec![Style::Defaults],
            ..SpaceConfig::default()
        };
        let tables = many(&cfg, 500, 4);
        // Rounded bins may touch a row more than the table has, and
        // consistency then adds it: within a hair of the default bins.
        let near = |t: &Table| {
            let d = crate::generate::default_bins(t.rows, t.pooling_factor);
            t.bins.iter().zip(d).all(|(a, b)| (a - b).abs() < 1e-3)
        };
        let same = tables.iter().filter(|t| near(t)).count();
        assert!(same > 480, "{same} of 500 with the default bins");
        for t in &tables {
            check_table(&cfg, t);
            assert!(
                (1.0..=100.0).contains(&t.pooling_factor),
                "{}",
                t.pooling_factor
            );
        }
        assert!(tables.iter().any(|t| !t.dim.is_power_of_two()));
        assert!(!Style::ALL.contains(&Style::Defaults));
    }

    #[test]
    fn the_space_is_covered() {
        let cfg = SpaceConfig::default();
        let tables = many(&cfg, 2000, 2);
        let any = |f: &dyn Fn(&Table) -> bool| tables.iter().any(f);
        assert!(any(&|t| !t.dim.is_power_of_two()));
        assert!(any(&|t| t.dim < 16) && any(&|t| t.dim > 512));
        assert!(any(&|t| t.pooling_factor < 1.0) && any(&|t| t.pooling_factor > 100.0));
        assert!(any(&|t| t.rows < 1000) && any(&|t| t.rows > 100_000_000));
        let only = |style| SpaceConfig {
            styles: vec![style],
            ..cfg.clone()
        };
        let trace = many(&only(Style::TraceLike), 200, 3);
        let near_none_once = trace.iter().filter(|t| t.bins[0] < 0.05).count();
        assert!(near_none_once > 150, "{near_none_once} of 200");
        // Spikes too: nearly every row in one bucket (a uniform hot set).
        let peak = |t: &Table| t.bins.iter().copied().fold(0.0, f64::max);
        let spikes = trace.iter().filter(|t| peak(t) > 0.9).count();
        assert!((2..100).contains(&spikes), "{spikes} of 200");
        let cold = many(&only(Style::Cold), 200, 3);
        let mostly_once = cold.iter().filter(|t| t.bins[0] > 0.8).count();
        assert!(mostly_once > 100, "{mostly_once} of 200");
        // Hot tables: most lookups on rows read over a thousand times.
        let hot = many(&only(Style::Hot), 200, 3);
        let skewed = hot
            .iter()
            .filter(|t| t.lookup_share_above(1000.0) > 0.5)
            .count();
        assert!(skewed > 100, "{skewed} of 200");
    }

    #[test]
    fn tasks_are_feasible_and_span_devices_and_tables_per_device() {
        let cfg = SpaceConfig::default();
        let all = tasks(&cfg, 200, 7, "p", &mem());
        for t in &all {
            assert!(
                (cfg.devices_min..=cfg.devices_max).contains(&t.devices),
                "{}: {} devices",
                t.name,
                t.devices
            );
            let n = t.tables.len();
            assert!((1..=cfg.max_tables).contains(&n), "{}: {n} tables", t.name);
            // Tables per device lie in their range, unless max_tables cut
            // them.
            if n < cfg.max_tables {
                assert_eq!(n % t.devices, 0, "{}", t.name);
                let per = n / t.devices;
                assert!(
                    (cfg.per_device_min..=cfg.per_device_max).contains(&per),
                    "{}: {per} a device",
                    t.name
                );
            }
            for x in &t.tables {
                check_table(&cfg, x);
            }
            let cap = t.cap_bytes();
            let plan = first_fit_decreasing(&t.tables, t.devices, cap, &mem());
            assert!(plan.is_some(), "{}: no plan under its cap", t.name);
            assert_eq!(t.infeasibility(&mem()), None);
        }
        let devices = |f: &dyn Fn(usize) -> bool| all.iter().any(|t| f(t.devices));
        assert!(devices(&|d| d <= 3) && devices(&|d| d >= 32));
        let per = |t: &Task| t.tables.len() as f64 / t.devices as f64;
        assert!(all.iter().any(|t| per(t) <= 2.0) && all.iter().any(|t| per(t) >= 32.0));
        assert!(all.iter().any(|t| t.tables.len() == cfg.max_tables));
        // Every style is drawn: TraceLike and Cold tasks tell apart by bin_0.
        let mean_once =
            |t: &Task| t.tables.iter().map(|x| x.bins[0]).sum::<f64>() / t.tables.len() as f64;
        assert!(all.iter().any(|t| mean_once(t) < 0.05) && all.iter().any(|t| mean_once(t) > 0.8));
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
        let (mut bound, mut near) = (0, 0);
        for t in &tasks(&cfg, 60, 3, "tight", &mem()) {
            let bytes: Vec<u64> = t.tables.iter().map(|x| mem().table_bytes(x)).collect();
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

    /// A space with every draw pinned: one dim, row count, pooling, device
    /// count, tables per device and memory share; DLRM-like tables, never
    /// roomy.
    fn pinned(
        dim: u32,
        log10_rows: f64,
        pooling: f64,
        devices: usize,
        per_device: usize,
        share: f64,
    ) -> SpaceConfig {
        SpaceConfig {
            dim_min: dim,
            dim_max: dim,
            log10_rows_min: log10_rows,
            log10_rows_max: log10_rows,
            pooling_min: pooling,
            pooling_max: pooling,
            devices_min: devices,
            devices_max: devices,
            per_device_min: per_device,
            per_device_max: per_device,
            share_min: share,
            share_max: share,
            roomy_share: 0.0,
            styles: vec![Style::Dlrm],
            ..SpaceConfig::default()
        }
    }

    #[test]
    fn a_share_that_packs_no_plan_is_raised_until_one_fits() {
        // Three equal tables on two devices: 1.05 × an even share holds
        // 1.575 tables, so first-fit decreasing needs room for two.
        let cfg = SpaceConfig {
            max_tables: 3,
            ..pinned(64, 5.0, 1.0, 2, 2, 1.05)
        };
        assert_eq!(cfg.validate(), Ok(()));
        for t in &tasks(&cfg, 5, 1, "raise", &mem()) {
            assert_eq!(t.tables.len(), 3);
            let one = mem().table_bytes(&t.tables[0]) as f64;
            let cap = t.cap_bytes();
            assert!(first_fit_decreasing(&t.tables, 2, cap, &mem()).is_some());
            // Raised by 2 % steps: less than a step past two tables.
            assert!(
                cap as f64 <= 2.0 * one * 1.021,
                "{} tables",
                cap as f64 / one
            );
        }
    }

    #[test]
    fn roomy_tasks_never_bind_memory() {
        let cfg = SpaceConfig {
            roomy_share: 1.0,
            max_tables: 64,
            ..SpaceConfig::default()
        };
        for t in &tasks(&cfg, 30, 4, "roomy", &mem()) {
            let total: u64 = t.tables.iter().map(|x| mem().table_bytes(x)).sum();
            assert!(t.cap_bytes() >= total, "{}", t.name);
        }
    }

    #[test]
    fn narrow_ranges_give_the_value_asked_for() {
        let cfg = pinned(96, 5.0, 0.5, 3, 5, 1.1);
        assert_eq!(cfg.validate(), Ok(()));
        for t in &tasks(&cfg, 10, 1, "n", &mem()) {
            assert_eq!((t.devices, t.tables.len()), (3, 15), "{}", t.name);
            for x in &t.tables {
                check_table(&cfg, x);
                assert_eq!((x.dim, x.rows, x.pooling_factor), (96, 100_000, 0.5));
            }
            // 15 equal tables on 3 devices: 1.1 × an even share holds 5.
            let even = 5.0 * mem().table_bytes(&t.tables[0]) as f64;
            let share = t.cap_bytes() as f64 / even;
            assert!((1.1..1.1 + 1e-6).contains(&share), "{share}");
        }
        // One style alone: every table looks like it.
        let trace = SpaceConfig {
            styles: vec![Style::TraceLike],
            max_tables: 64,
            ..SpaceConfig::default()
        };
        for t in &tasks(&trace, 10, 2, "tr", &mem()) {
            let (lo, hi) = t
                .tables
                .iter()
                .fold((u32::MAX, 0), |(lo, hi), x| (lo.min(x.dim), hi.max(x.dim)));
            assert!(hi <= 4 * lo + 4, "{}: dims {lo} to {hi}", t.name);
        }
    }

    #[test]
    fn inconsistent_tables_are_mended_by_the_documented_rule() {
        let batch = 65536;
        let cold = |rows: u64, pooling: f64| Table::cold("c", rows, 16, pooling);
        // 1. Rows raised where they may be.
        let mut t = cold(100, 300.0);
        make_consistent(&mut t, batch, 1e9);
        assert_eq!(t.rows, 65536 * 300);
        assert_eq!((t.bins[0], t.pooling_factor), (1.0, 300.0));
        // 2. Else hotter bins, the rows kept.
        let mut t = cold(100_000, 300.0);
        make_consistent(&mut t, batch, 100_000.0);
        assert_eq!((t.rows, t.pooling_factor), (100_000, 300.0));
        assert_eq!(t.bins[0], 0.0);
        assert!(touched_rows(&t, batch) <= 100_000.0);
        // No further than needed: one bucket cooler touches too many.
        let mut cooler = t.bins;
        cooler.rotate_left(1);
        cooler[0] += cooler[NUM_BINS - 1];
        cooler[NUM_BINS - 1] = 0.0;
        let cooler = Table {
            bins: cooler,
            ..t.clone()
        };
        assert!(touched_rows(&cooler, batch) > 100_000.0);
        // 3. Else fewer lookups: every row in bin_16 still touches too many.
        let mut t = cold(100, 300.0);
        make_consistent(&mut t, batch, 100.0);
        assert_eq!(t.rows, 100);
        assert_eq!(t.bins[NUM_BINS - 1], 1.0);
        assert!((t.pooling_factor - 100.0 * 1.5 * 32768.0 / 65536.0).abs() < 1e-6);
        assert!(touched_rows(&t, batch) <= 100.0);
        // Through the generator: 100 rows a table makes many hot or less
        // looked up, all still within the ranges.
        let tiny = SpaceConfig {
            log10_rows_min: 2.0,
            log10_rows_max: 2.0,
            ..SpaceConfig::default()
        };
        assert_eq!(tiny.validate(), Ok(()));
        let tables = many(&tiny, 600, 5);
        for t in &tables {
            check_table(&tiny, t);
        }
        assert!(tables.iter().any(|t| t.bins[NUM_BINS - 1] == 1.0));
    }

    #[test]
    fn huge_tables_get_a_dim_that_fits_a_device() {
        let cfg = SpaceConfig {
            log10_rows_min: 8.5,
            log10_rows_max: 9.0,
            ..SpaceConfig::default()
        };
        assert_eq!(cfg.validate(), Ok(()));
        let tables = many(&cfg, 300, 6);
        for t in &tables {
            check_table(&cfg, t);
        }
        // 10^8.5 rows at fp16 with row-wise state: at most dim 132 in 80 GB.
        assert!(tables.iter().all(|t| t.dim <= 132));
        assert!(tables.iter().any(|t| t.dim >= 100));
    }

    #[test]
    fn bad_ranges_are_named() {
        let bad = |f: fn(&mut SpaceConfig), needle: &str| {
            let mut cfg = SpaceConfig::default();
            f(&mut cfg);
            let Err(e) = cfg.validate() else {
                panic!("accepted where it should name {needle}")
            };
            assert!(e.to_string().contains(needle), "{e} should name {needle}");
            assert!(
                e.to_string().contains(&e.key),
                "{e} should name its key {}",
                e.key
            );
        };
        bad(|c| c.dim_min = 3, "space.dim_min = 3");
        bad(|c| c.dim_max = 1030, "space.dim_max = 1030");
        bad(
            |c| {
                c.dim_min = 64;
                c.dim_max = 32;
            },
            "space.dim_min = 64 must not exceed space.dim_max = 32",
        );
        bad(|c| c.log10_rows_max = 10.0, "space.log10_rows_max = 10");
        bad(
            |c| c.log10_rows_min = f64::NAN,
            "space.log10_rows_min = NaN",
        );
        // 10^9 rows of dim 4 need 12 GB.
        bad(
            |c| {
                c.log10_rows_min = 9.0;
                c.device_gb = 10.0;
            },
            "space.log10_rows_min = 9",
        );
        bad(|c| c.pooling_min = 0.0, "space.pooling_min = 0");
        bad(|c| c.pooling_min = 500.0, "space.pooling_min = 500");
        bad(|c| c.pooling_max = 1e6, "space.pooling_max = 1000000");
        bad(|c| c.devices_min = 1, "space.devices_min = 1");
        bad(|c| c.devices_max = 1, "space.devices_max = 1");
        bad(|c| c.per_device_min = 0, "space.per_device_min = 0");
        bad(|c| c.per_device_max = 0, "space.per_device_max = 0");
        bad(|c| c.max_tables = 1, "space.max_tables = 1");
        bad(|c| c.share_min = 0.9, "space.share_min = 0.9");
        bad(|c| c.share_max = 1.0, "space.share_max = 1");
        bad(|c| c.share_max = f64::INFINITY, "space.share_max = inf");
        bad(|c| c.roomy_share = 1.5, "space.roomy_share = 1.5");
        bad(|c| c.device_gb = 0.0, "space.device_gb = 0");
        bad(|c| c.device_gb = 1e-6, "space.device_gb = 0.000001");
        bad(|c| c.batch = 0, "space.batch = 0");
        bad(|c| c.styles.clear(), "space.styles");
        bad(
            |c| {
                c.log10_rows_max = 2.0;
                c.pooling_min = 100.0;
            },
            "space.pooling_min = 100",
        );
        assert_eq!(SpaceConfig::default().validate(), Ok(()));
        // A style list in TOML, as a config names it.
        let cfg: SpaceConfig = toml::from_str("styles = [\"trace_like\", \"cold\"]").unwrap();
        assert_eq!(cfg.styles, vec![Style::TraceLike, Style::Cold]);
        assert!(toml::from_str::<SpaceConfig>("dims = 4").is_err());
    }

    #[test]
    fn a_suite_names_each_table_once_and_its_pool_holds_them() {
        let cfg = SpaceConfig {
            max_tables: 64,
            ..SpaceConfig::default()
        };
        let all = tasks(&cfg, 6, 1, "s", &mem());
        let (pool, file) = suite(&all, "s.csv");
        assert_eq!(file.pool, "s.csv");
        let mut times: HashMap<&str, usize> = HashMap::new();
        for t in &pool {
            *times.entry(t.name.as_str()).or_default() += 1;
        }
        assert_eq!(file.tasks.len(), all.len());
        for (spec, task) in file.tasks.iter().zip(&all) {
            assert_eq!(
                (&spec.name, spec.devices, spec.memory_gb),
                (&task.name, task.devices, task.memory_gb)
            );
            assert_eq!(spec.tables.len(), task.tables.len());
            for (n, t) in spec.tables.iter().zip(&task.tables) {
                assert_eq!(times.get(n.as_str()), Some(&1), "{n}");
                assert_eq!(pool.iter().find(|p| &p.name == n), Some(t));
            }
        }
        assert_eq!(
            pool.len(),
            all.iter().map(|t| t.tables.len()).sum::<usize>()
        );
        // Written and loaded back, the suite gives the same tasks.
        let dir = tempfile::tempdir().unwrap();
        crate::pool::write(&dir.path().join("s.csv"), &pool).unwrap();
        let path = dir.path().join("s.json");
        crate::suite::write(&path, &file).unwrap();
        let loaded = Suite::load(&path, &mem()).unwrap();
        assert_eq!(loaded.tasks, all);
    }
}
