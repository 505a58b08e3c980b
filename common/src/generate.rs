//! A seeded generator of a DLRM-like pool shaped like Meta's public
//! `dlrm_datasets` trace `fbgemm_t856_bs65536` (856 tables, batch 65536,
//! 887,017,990 lookups, 128,435,723 unique rows, 47.3% of unique rows used
//! once), since the trace itself cannot be downloaded here.
//!
//! Shapes, and why:
//! - pooling factor: log-normal (the trace's per-table lookup counts span four
//!   orders of magnitude), rescaled so the pool's mean matches the trace's 15.8;
//! - rows (hash size): log-normal in log10 between 100 (DreamShard's floor,
//!   `max(100, max index + 1)`) and a configured maximum;
//! - dims: the trace records none; DreamShard assigns them at random from a
//!   small set of powers of two, and so do we (weights are configuration);
//! - reuse bins: geometric in log2(access count), `bin_k ∝ (1 − r)·r^k`, with
//!   `r` per table; `r ≈ 0.5` gives about half the rows used once and about 7
//!   accesses per unique row, the trace's aggregate. Where the hash size is
//!   smaller than the unique rows that would imply, `r` is raised until the
//!   table's reuse is consistent with its size.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use serde::{Deserialize, Serialize};

use crate::error::InvalidSetting;
use crate::pool::{MAX_DIM, MAX_POOLING, MAX_ROWS};
use crate::table::{MemoryModel, Table, NUM_BINS};

/// Most tables a generated pool may have (a thousand times the trace's).
pub const MAX_TABLES: usize = 1 << 20;

/// The published figures of `fbgemm_t856_bs65536` the generator is shaped like.
pub mod published {
    pub const TABLES: usize = 856;
    pub const BATCH: u64 = 65536;
    pub const LOOKUPS: u64 = 887_017_990;
    pub const UNIQUE_ROWS: u64 = 128_435_723;
    pub const ONCE_SHARE: f64 = 0.473;
    /// `LOOKUPS / (TABLES × BATCH)`.
    pub fn mean_pooling() -> f64 {
        LOOKUPS as f64 / (TABLES as f64 * BATCH as f64)
    }
}

/// Generator settings. Defaults reproduce the trace's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolGenConfig {
    pub tables: usize,
    pub batch: u64,
    pub mean_pooling: f64,
    /// σ of ln(pooling factor).
    pub pooling_sigma: f64,
    pub max_pooling: f64,
    /// Mean and σ of log10(rows).
    pub log10_rows_mean: f64,
    pub log10_rows_sigma: f64,
    pub max_rows: u64,
    /// How log10(rows) follows log10(pooling factor / its median): heavily
    /// looked-up features tend to have large vocabularies.
    pub rows_pooling_slope: f64,
    pub dims: Vec<u32>,
    pub dim_weights: Vec<f64>,
    /// Range of the per-table reuse ratio `r` (uniform).
    pub reuse_min: f64,
    pub reuse_max: f64,
}

impl Default for PoolGenConfig {
    fn default() -> Self {
        PoolGenConfig {
            tables: published::TABLES,
            batch: published::BATCH,
            mean_pooling: published::mean_pooling(),
            pooling_sigma: 1.0,
            max_pooling: 1000.0,
            log10_rows_mean: 4.9,
            log10_rows_sigma: 1.0,
            max_rows: 20_000_000,
            rows_pooling_slope: 1.0,
            dims: vec![16, 32, 64, 128],
            dim_weights: vec![0.2, 0.3, 0.3, 0.2],
            reuse_min: 0.46,
            reuse_max: 0.56,
        }
    }
}

impl PoolGenConfig {
    /// Checks ranges; the message names the field.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let finite = |field: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(InvalidSetting::new(
                    format!("generate.{field}"),
                    format!("generate.{field} = {v} must be a finite number"),
                ))
            }
        };
        let non_negative = |field: &str, v: f64| {
            finite(field, v)?;
            if v >= 0.0 {
                Ok(())
            } else {
                Err(InvalidSetting::new(
                    format!("generate.{field}"),
                    format!("generate.{field} = {v} must not be negative"),
                ))
            }
        };
        if self.tables == 0 {
            return Err(InvalidSetting::new(
                "generate.tables",
                "generate.tables must be at least 1",
            ));
        }
        if self.batch == 0 || self.batch > crate::config::MAX_BATCH {
            return Err(InvalidSetting::new(
                "generate.batch",
                format!(
                    "generate.batch = {} must lie in 1..={}",
                    self.batch,
                    crate::config::MAX_BATCH
                ),
            ));
        }
        if self.tables > MAX_TABLES {
            return Err(InvalidSetting::new(
                "generate.tables",
                format!(
                    "generate.tables = {} is more than {MAX_TABLES}",
                    self.tables
                ),
            ));
        }
        finite("max_pooling", self.max_pooling)?;
        if !(1.0..=MAX_POOLING).contains(&self.max_pooling) {
            return Err(InvalidSetting::new(
                "generate.max_pooling",
                format!(
                    "generate.max_pooling = {} must lie in [1, {MAX_POOLING}]",
                    self.max_pooling
                ),
            ));
        }
        finite("mean_pooling", self.mean_pooling)?;
        if !(self.mean_pooling >= 1.0 && self.mean_pooling < self.max_pooling) {
            return Err(InvalidSetting::new(
                "generate.mean_pooling",
                format!(
                    "generate.mean_pooling = {} must lie in [1, max_pooling)",
                    self.mean_pooling
                ),
            ));
        }
        non_negative("pooling_sigma", self.pooling_sigma)?;
        // Rows are drawn on a log10 scale: beyond ±20 every draw clamps to
        // a bound, and extreme values overflow to NaN on the way.
        let log_scale = |field: &str, v: f64| {
            finite(field, v)?;
            if v.abs() <= 20.0 {
                Ok(())
            } else {
                Err(InvalidSetting::new(
                    format!("generate.{field}"),
                    format!("generate.{field} = {v} must lie in [-20, 20]"),
                ))
            }
        };
        log_scale("log10_rows_mean", self.log10_rows_mean)?;
        non_negative("log10_rows_sigma", self.log10_rows_sigma)?;
        log_scale("log10_rows_sigma", self.log10_rows_sigma)?;
        log_scale("rows_pooling_slope", self.rows_pooling_slope)?;
        if !(100..=MAX_ROWS).contains(&self.max_rows) {
            return Err(InvalidSetting::new(
                "generate.max_rows",
                format!(
                    "generate.max_rows = {} must lie in [100, {MAX_ROWS}]",
                    self.max_rows
                ),
            ));
        }
        if self.dims.is_empty() || self.dims.len() != self.dim_weights.len() {
            return Err(InvalidSetting::new(
                "generate.dims",
                "generate.dims and generate.dim_weights must be non-empty and of equal length",
            ));
        }
        if self.dims.iter().any(|&d| d == 0 || d as u64 > MAX_DIM) {
            return Err(InvalidSetting::new(
                "generate.dims",
                format!("generate.dims must lie in 1..={MAX_DIM}"),
            ));
        }
        for &w in &self.dim_weights {
            non_negative("dim_weights", w)?;
        }
        if self.dim_weights.iter().sum::<f64>() <= 0.0 {
            return Err(InvalidSetting::new(
                "generate.dim_weights",
                "generate.dim_weights must not all be 0",
            ));
        }
        if !(0.0 < self.reuse_min && self.reuse_min <= self.reuse_max && self.reuse_max < 1.0) {
            return Err(InvalidSetting::new(
                "generate.reuse_min",
                "generate.reuse_min/reuse_max must satisfy 0 < min ≤ max < 1",
            ));
        }
        Ok(())
    }
}

/// Geometric reuse bins for ratio `r`, with the tail folded into `bin_16`.
fn geometric_bins(r: f64) -> [f64; NUM_BINS] {
    let mut bins = [0.0; NUM_BINS];
    for (k, b) in bins.iter_mut().enumerate().take(NUM_BINS - 1) {
        *b = (1.0 - r) * r.powi(k as i32);
    }
    bins[NUM_BINS - 1] = r.powi(NUM_BINS as i32 - 1);
    bins
}

fn mean_reuse_of(r: f64) -> f64 {
    (0..NUM_BINS)
        .map(|k| geometric_bins(r)[k] * Table::bin_count(k))
        .sum()
}

/// `r`, raised where needed so that a table of `rows` rows looked up
/// `pooling` times per sample in batches of `batch` does not touch more
/// unique rows than it has.
fn consistent_reuse(r: f64, rows: u64, pooling: f64, batch: u64) -> f64 {
    let needed = batch as f64 * pooling / rows as f64;
    if mean_reuse_of(r) >= needed {
        return r;
    }
    let (mut lo, mut hi) = (r, 0.999);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if mean_reuse_of(mid) < needed {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The reuse ratio of the trace's aggregate: about half the unique rows
/// used once, about 7 accesses per unique row.
pub const TRACE_REUSE: f64 = 0.5;

/// Reuse bins for a table whose own are unknown: the trace's aggregate
/// ([`TRACE_REUSE`]), with more reuse where the table is too small for it
/// at the trace's batch, as the generator does.
pub fn default_bins(rows: u64, pooling: f64) -> [f64; NUM_BINS] {
    let r = consistent_reuse(TRACE_REUSE, rows, pooling, published::BATCH);
    geometric_bins(r).map(|b| (b * 1e6).round() / 1e6)
}

/// Unique rows a table touches in one batch: lookups / mean reuse, at most `rows`.
pub fn unique_rows(t: &Table, batch: u64) -> f64 {
    (batch as f64 * t.pooling_factor / t.mean_reuse()).min(t.rows as f64)
}

/// Generates a pool; the same config and seed give the same pool. Fails
/// with the field's name when the config is out of range.
pub fn generate_pool(cfg: &PoolGenConfig, seed: u64) -> Result<Vec<Table>, InvalidSetting> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pooling: Vec<f64> = {
        let ln = LogNormal::new(0.0, cfg.pooling_sigma)
            .map_err(|e| InvalidSetting::new("generate.pooling_sigma", e.to_string()))?;
        (0..cfg.tables).map(|_| ln.sample(&mut rng)).collect()
    };
    // Rescale to the target mean; clamping moves the mean, so repeat a few times.
    for _ in 0..8 {
        let mean = pooling.iter().sum::<f64>() / pooling.len() as f64;
        for p in pooling.iter_mut() {
            *p = (*p * cfg.mean_pooling / mean).clamp(1.0, cfg.max_pooling);
        }
    }
    let rows_dist = Normal::new(cfg.log10_rows_mean, cfg.log10_rows_sigma)
        .map_err(|e| InvalidSetting::new("generate.log10_rows_sigma", e.to_string()))?;
    let total_w: f64 = cfg.dim_weights.iter().sum();
    let median_pf = {
        let mut p = pooling.clone();
        p.sort_by(f64::total_cmp);
        p[p.len() / 2]
    };
    let mut tables = Vec::with_capacity(cfg.tables);
    for (i, &pf) in pooling.iter().enumerate() {
        let log10_rows =
            rows_dist.sample(&mut rng) + cfg.rows_pooling_slope * (pf / median_pf).log10();
        let rows = 10f64
            .powf(log10_rows)
            .clamp(100.0, cfg.max_rows as f64)
            .round() as u64;
        let mut pick = rng.gen::<f64>() * total_w;
        let mut dim = cfg.dims[cfg.dims.len() - 1]; // validated non-empty
        for (d, w) in cfg.dims.iter().zip(&cfg.dim_weights) {
            if pick < *w {
                dim = *d;
                break;
            }
            pick -= w;
        }
        let r = consistent_reuse(
            rng.gen_range(cfg.reuse_min..=cfg.reuse_max),
            rows,
            pf,
            cfg.batch,
        );
        tables.push(Table {
            name: format!("dlrm_{i:03}"),
            rows,
            dim,
            pooling_factor: (pf * 1e4).round() / 1e4,
            bins: geometric_bins(r).map(|b| (b * 1e6).round() / 1e6),
        });
    }
    Ok(tables)
}

/// Splits a pool at random into disjoint halves (train, test), DreamShard's 50/50.
pub fn split(tables: &[Table], seed: u64) -> (Vec<Table>, Vec<Table>) {
    let mut idx: Vec<usize> = (0..tables.len()).collect();
    idx.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let half = tables.len() / 2;
    let mut train: Vec<usize> = idx[..half].to_vec();
    let mut test: Vec<usize> = idx[half..].to_vec();
    train.sort_unstable();
    test.sort_unstable();
    (
        train.into_iter().map(|i| tables[i].clone()).collect(),
        test.into_iter().map(|i| tables[i].clone()).collect(),
    )
}

/// Aggregate statistics of a pool, comparable with the published trace.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStats {
    /// Whether the pool was generated (else read from a file): the
    /// heading of its column.
    pub generated: bool,
    pub tables: usize,
    pub batch: u64,
    pub lookups: f64,
    pub mean_pooling: f64,
    pub median_pooling: f64,
    pub max_pooling: f64,
    pub unique_rows: f64,
    pub once_share: f64,
    pub median_rows: u64,
    pub max_rows: u64,
    pub total_gb: f64,
}

/// Computes the statistics of a pool at `batch`.
pub fn stats(tables: &[Table], batch: u64, mem: &MemoryModel) -> PoolStats {
    let mut pooling: Vec<f64> = tables.iter().map(|t| t.pooling_factor).collect();
    pooling.sort_by(f64::total_cmp);
    let mut rows: Vec<u64> = tables.iter().map(|t| t.rows).collect();
    rows.sort_unstable();
    let uniq: Vec<f64> = tables.iter().map(|t| unique_rows(t, batch)).collect();
    let unique_total: f64 = uniq.iter().sum();
    let once: f64 = tables
        .iter()
        .zip(&uniq)
        .map(|(t, u)| u * t.bins[0] / t.bins.iter().sum::<f64>())
        .sum();
    let lookups: f64 = pooling.iter().sum::<f64>() * batch as f64;
    PoolStats {
        generated: true,
        tables: tables.len(),
        batch,
        lookups,
        mean_pooling: lookups / (batch as f64 * tables.len().max(1) as f64),
        median_pooling: pooling.get(pooling.len() / 2).copied().unwrap_or(0.0),
        max_pooling: pooling.last().copied().unwrap_or(0.0),
        unique_rows: unique_total,
        once_share: if unique_total > 0.0 {
            once / unique_total
        } else {
            0.0
        },
        median_rows: rows.get(rows.len() / 2).copied().unwrap_or(0),
        max_rows: rows.last().copied().unwrap_or(0),
        total_gb: tables.iter().map(|t| mem.table_gb(t)).sum(),
    }
}

impl std::fmt::Display for PoolStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<28} {:>16} {:>16}",
            "statistic",
            if self.generated {
                "generated"
            } else {
                "this pool"
            },
            "fbgemm_t856_bs65536"
        )?;
        let rows = [
            (
                "tables",
                format!("{}", self.tables),
                format!("{}", published::TABLES),
            ),
            (
                "batch",
                format!("{}", self.batch),
                format!("{}", published::BATCH),
            ),
            (
                "lookups per batch",
                format!("{:.0}", self.lookups),
                format!("{}", published::LOOKUPS),
            ),
            (
                "mean pooling factor",
                format!("{:.2}", self.mean_pooling),
                format!("{:.2}", published::mean_pooling()),
            ),
            (
                "unique rows per batch",
                format!("{:.0}", self.unique_rows),
                format!("{}", published::UNIQUE_ROWS),
            ),
            (
                "unique rows used once",
                format!("{:.1}%", 100.0 * self.once_share),
                format!("{:.1}%", 100.0 * published::ONCE_SHARE),
            ),
            (
                "median / max pooling",
                format!("{:.2} / {:.0}", self.median_pooling, self.max_pooling),
                "n/a".into(),
            ),
            (
                "median / max rows",
                format!("{} / {}", self.median_rows, self.max_rows),
                "n/a".into(),
            ),
            (
                "memory of all tables (GiB)",
                format!("{:.1}", self.total_gb),
                "n/a".into(),
            ),
        ];
        for (k, a, b) in rows {
            writeln!(f, "{k:<28} {a:>16} {b:>16}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_pool_other_seed_other_pool() {
        let cfg = PoolGenConfig {
            tables: 50,
            ..Default::default()
        };
        assert_eq!(generate_pool(&cfg, 1), generate_pool(&cfg, 1));
        assert!(generate_pool(&cfg, 1).is_ok());
        assert_ne!(generate_pool(&cfg, 1), generate_pool(&cfg, 2));
    }

    #[test]
    fn default_pool_is_shaped_like_the_trace() {
        let cfg = PoolGenConfig::default();
        let pool = generate_pool(&cfg, 0).unwrap();
        let s = stats(&pool, cfg.batch, &MemoryModel::default());
        eprintln!("{s}");
        assert_eq!(s.tables, published::TABLES);
        assert!(
            (s.mean_pooling - published::mean_pooling()).abs() < 0.5,
            "{s}"
        );
        assert!((s.once_share - published::ONCE_SHARE).abs() < 0.1, "{s}");
        let ratio = s.unique_rows / published::UNIQUE_ROWS as f64;
        assert!((0.5..2.0).contains(&ratio), "{s}");
        for t in &pool {
            assert!(t.rows >= 100 && t.pooling_factor >= 1.0);
            let sum: f64 = t.bins.iter().sum();
            assert!((sum - 1.0).abs() < 1e-3, "{} bins sum {sum}", t.name);
            // Unique rows implied by the reuse never exceed the hash size much.
            let implied = cfg.batch as f64 * t.pooling_factor / t.mean_reuse();
            assert!(implied <= t.rows as f64 * 1.05, "{}", t.name);
        }
    }

    #[test]
    fn out_of_range_settings_are_errors_naming_the_field() {
        for (cfg, field) in [
            (
                PoolGenConfig {
                    pooling_sigma: -1.0,
                    ..Default::default()
                },
                "pooling_sigma",
            ),
            (
                PoolGenConfig {
                    log10_rows_mean: f64::NAN,
                    ..Default::default()
                },
                "log10_rows_mean",
            ),
            (
                PoolGenConfig {
                    max_rows: 1 << 50,
                    ..Default::default()
                },
                "max_rows",
            ),
            (
                PoolGenConfig {
                    dim_weights: vec![0.0; 4],
                    ..Default::default()
                },
                "dim_weights",
            ),
            (
                PoolGenConfig {
                    max_pooling: f64::INFINITY,
                    ..Default::default()
                },
                "max_pooling",
            ),
        ] {
            let e = generate_pool(&cfg, 0).unwrap_err();
            assert!(e.to_string().contains(field), "{e}");
            assert!(e.key.starts_with("generate."), "{}", e.key);
        }
    }

    #[test]
    fn split_is_disjoint_and_complete() {
        let pool = generate_pool(
            &PoolGenConfig {
                tables: 101,
                ..Default::default()
            },
            3,
        )
        .unwrap();
        let (train, test) = split(&pool, 9);
        assert_eq!(train.len() + test.len(), 101);
        for t in &train {
            assert!(!test.iter().any(|u| u.name == t.name));
        }
    }

    #[test]
    fn geometric_bins_sum_to_one_and_reuse_is_monotone() {
        for r in [0.1, 0.5, 0.9] {
            let s: f64 = geometric_bins(r).iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert!(mean_reuse_of(0.3) < mean_reuse_of(0.5));
        assert!(mean_reuse_of(0.5) < mean_reuse_of(0.9));
    }
}
