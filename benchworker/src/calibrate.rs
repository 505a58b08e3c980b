//! Calibrating `sim` to a backend: measure plans drawn across the table
//! space, fit `sim`'s constants to them, and score the fit on plans held
//! out. A user with one GPU host calibrates once, then trains anywhere.
//!
//! The plans: half put `k` tables on one device (the compute: fusion,
//! the widest-dim and hot-row terms, the backward), half spread `k`
//! tables over 2 to `max_devices` devices at random (the exchange too).
//!
//! The fit: the constants in [`FITTED`], each in log space, by coordinate
//! search: each is multiplied and divided by a step and kept where the
//! error falls; the step halves once none moves. The error is the mean
//! squared log ratio of `sim`'s phases to the measured ones, per device:
//! forward, backward, and the two exchanges together. `sim.batch` is set
//! to the backend's batch first: the model then speaks of the same
//! iteration.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use common::config::SimConfig;
use common::{Measurement, MemoryModel, Plan, Table};

use crate::oracle::Oracle;
use crate::sim::SimOracle;

/// The constants fitted, by their `[sim]` names.
pub const FITTED: [&str; 6] = [
    "hbm_gibps",
    "kernel_floor_ms",
    "bwd_multiplier",
    "hot_row_contention",
    "link_gibps",
    "a2a_latency_ms",
];

/// The most a constant moves from where the fit starts, either way: a
/// constant the plans do not inform stays within it rather than drifting
/// to 0 or beyond any hardware.
const MAX_MOVE: f64 = 1e4;

/// A constant's place in the configuration.
fn constant<'c>(cfg: &'c mut SimConfig, name: &str) -> &'c mut f64 {
    match name {
        "hbm_gibps" => &mut cfg.hbm_gibps,
        "kernel_floor_ms" => &mut cfg.kernel_floor_ms,
        "bwd_multiplier" => &mut cfg.bwd_multiplier,
        "hot_row_contention" => &mut cfg.hot_row_contention,
        "link_gibps" => &mut cfg.link_gibps,
        "a2a_latency_ms" => &mut cfg.a2a_latency_ms,
        _ => unreachable!("not a fitted constant: {name}"),
    }
}

/// A plan over some tables, and what a backend measured of it.
#[derive(Debug, Clone)]
pub struct Sample {
    pub tables: Vec<Table>,
    pub plan: Plan,
    pub measured: Measurement,
}

/// `n` plans over tables of `pool` (seeded): half on one device, half on
/// 2 to `max_devices` (all on one where that is 1), each of 1 to
/// `max_tables` distinct tables (at least one per device).
pub fn draw_plans(
    pool: &[Table],
    n: usize,
    max_tables: usize,
    max_devices: usize,
    seed: u64,
) -> Vec<(Vec<Table>, Plan)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let max_tables = max_tables.clamp(1, pool.len());
    (0..n)
        .map(|i| {
            let devices = match (i % 2, max_devices) {
                (0, _) | (_, 0..=1) => 1,
                _ => rng.gen_range(2..=max_devices),
            };
            let k = rng.gen_range(devices.min(max_tables)..=max_tables);
            let tables: Vec<Table> = pool.choose_multiple(&mut rng, k).cloned().collect();
            // Every device gets one table first, then the rest at random.
            let mut assignment: Vec<usize> = (0..k).map(|t| t % devices).collect();
            for d in assignment.iter_mut().skip(devices) {
                *d = rng.gen_range(0..devices);
            }
            assignment.shuffle(&mut rng);
            (
                tables,
                Plan {
                    devices,
                    assignment,
                },
            )
        })
        .collect()
}

/// Measures every plan with `oracle`: the samples, and how many plans
/// failed (each logged). `progress` is told after each plan.
pub fn measure_all(
    oracle: &mut dyn Oracle,
    plans: Vec<(Vec<Table>, Plan)>,
    mut progress: impl FnMut(),
) -> (Vec<Sample>, usize) {
    let (mut samples, mut failed) = (Vec::new(), 0);
    for (tables, plan) in plans {
        match oracle.measure(&tables, &plan) {
            Ok(measured) => samples.push(Sample {
                tables,
                plan,
                measured,
            }),
            Err(e) => {
                failed += 1;
                tracing::warn!("a plan of {} tables was not measured: {e}", tables.len());
            }
        }
        progress();
    }
    (samples, failed)
}

/// Every fourth sample held out (one-device and spread plans alike):
/// `(fitted, held out)`.
pub fn hold_out(samples: Vec<Sample>) -> (Vec<Sample>, Vec<Sample>) {
    let (mut fitted, mut held) = (Vec::new(), Vec::new());
    for (i, s) in samples.into_iter().enumerate() {
        match i % 4 {
            3 => held.push(s),
            _ => fitted.push(s),
        }
    }
    (fitted, held)
}

/// The phases compared, per device: forward, backward, both exchanges.
fn phases(m: &Measurement) -> impl Iterator<Item = f64> + '_ {
    m.devices
        .iter()
        .flat_map(|d| [d.fwd_ms, d.bwd_ms, d.fwd_comm_ms + d.bwd_comm_ms])
}

/// Mean squared log ratio of `sim`'s phases under `cfg` to the measured
/// ones (phases under a microsecond count as one).
pub fn error(cfg: &SimConfig, mem: MemoryModel, samples: &[Sample]) -> f64 {
    let mut sim = SimOracle::new(cfg.clone(), mem);
    let (mut sum, mut n) = (0.0, 0usize);
    for s in samples {
        let Ok(model) = sim.measure(&s.tables, &s.plan) else {
            continue;
        };
        for (a, b) in phases(&model).zip(phases(&s.measured)) {
            let r = (a.max(1e-3) / b.max(1e-3)).ln();
            sum += r * r;
            n += 1;
        }
    }
    if n == 0 {
        return f64::INFINITY;
    }
    sum / n as f64
}

/// `start`'s constants fitted to `samples` by coordinate search in log
/// space (see the module's documentation).
pub fn fit(start: &SimConfig, mem: MemoryModel, samples: &[Sample]) -> SimConfig {
    let mut best = start.clone();
    let origin: Vec<f64> = FITTED.iter().map(|n| *constant(&mut best, n)).collect();
    let mut best_error = error(&best, mem, samples);
    let mut step: f64 = 2.0;
    while step > 1.01 {
        let mut moved = false;
        for (name, origin) in FITTED.into_iter().zip(&origin) {
            for factor in [step, 1.0 / step] {
                let mut tried = best.clone();
                *constant(&mut tried, name) *= factor;
                let moved_by = *constant(&mut tried, name) / origin;
                if !(1.0 / MAX_MOVE..=MAX_MOVE).contains(&moved_by) || tried.validate().is_err() {
                    continue;
                }
                let e = error(&tried, mem, samples);
                if e < best_error {
                    (best, best_error, moved) = (tried, e, true);
                    break;
                }
            }
        }
        if !moved {
            step = step.sqrt();
        }
    }
    best
}

/// How well a model predicts plans: rank correlation of the iteration
/// costs, and the median absolute error of the cost in percent.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Score {
    pub spearman: f64,
    pub median_abs_pct: f64,
}

/// `cfg`'s score on `samples`.
pub fn score(cfg: &SimConfig, mem: MemoryModel, samples: &[Sample]) -> Score {
    let mut sim = SimOracle::new(cfg.clone(), mem);
    let (mut model, mut real, mut pct) = (Vec::new(), Vec::new(), Vec::new());
    for s in samples {
        if let Ok(m) = sim.measure(&s.tables, &s.plan) {
            pct.push(100.0 * (m.cost_ms / s.measured.cost_ms - 1.0).abs());
            model.push(m.cost_ms);
            real.push(s.measured.cost_ms);
        }
    }
    Score {
        spearman: spearman(&model, &real),
        median_abs_pct: crate::timing::median(&pct),
    }
}

/// Ranks from 0, ties sharing their mean rank.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        for &k in &order[i..=j] {
            r[k] = (i + j) as f64 / 2.0;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation (0 for fewer than two points or no spread).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let (ra, rb) = (ranks(&a[..n]), ranks(&b[..n]));
    let mean = (n - 1) as f64 / 2.0;
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        ab += (x - mean) * (y - mean);
        aa += (x - mean) * (x - mean);
        bb += (y - mean) * (y - mean);
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    ab / (aa * bb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::generate::{generate_pool, PoolGenConfig};

    #[test]
    fn spearman_is_one_for_the_same_order_and_minus_one_reversed() {
        let a = [1.0, 5.0, 2.0, 9.0];
        assert!((spearman(&a, &[10.0, 50.0, 20.0, 90.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&a, &[4.0, 1.0, 3.0, 0.0]) + 1.0).abs() < 1e-12);
        // Ties share a rank.
        assert_eq!(ranks(&[3.0, 1.0, 3.0]), [1.5, 0.0, 1.5]);
        assert_eq!(spearman(&a[..1], &a[..1]), 0.0);
    }

    #[test]
    fn plans_cover_one_device_and_several_with_every_device_used() {
        let pool = generate_pool(&PoolGenConfig::default(), 0).unwrap();
        let plans = draw_plans(&pool, 40, 12, 4, 3);
        assert_eq!(plans.iter().filter(|(_, p)| p.devices == 1).count(), 20);
        for (tables, plan) in &plans {
            assert_eq!(tables.len(), plan.assignment.len());
            assert!((1..=12).contains(&tables.len()));
            for d in 0..plan.devices {
                assert!(plan.assignment.contains(&d), "device {d} empty");
            }
        }
        assert!(plans.iter().any(|(_, p)| p.devices == 4));
        let one = draw_plans(&pool, 10, 12, 1, 3);
        assert!(one.iter().all(|(_, p)| p.devices == 1));
    }

    /// Measurements by a `sim` with other constants: the fit from the
    /// defaults finds constants that predict plans it did not see better
    /// than the defaults do.
    #[test]
    fn the_fit_recovers_a_sims_constants_on_held_out_plans() {
        let pool = generate_pool(&PoolGenConfig::default(), 0).unwrap();
        let mem = MemoryModel::default();
        let truth = SimConfig {
            batch: 4096,
            hbm_gibps: 300.0,
            kernel_floor_ms: 0.9,
            bwd_multiplier: 3.1,
            link_gibps: 60.0,
            ..SimConfig::default()
        };
        let mut oracle = SimOracle::new(truth.clone(), mem);
        let samples: Vec<Sample> = draw_plans(&pool, 120, 16, 4, 1)
            .into_iter()
            .map(|(tables, plan)| {
                let measured = oracle.measure(&tables, &plan).unwrap();
                Sample {
                    tables,
                    plan,
                    measured,
                }
            })
            .collect();
        let (train, held) = samples.split_at(90);
        let start = SimConfig {
            batch: truth.batch,
            ..SimConfig::default()
        };
        let fitted = fit(&start, mem, train);
        let (before, after) = (score(&start, mem, held), score(&fitted, mem, held));
        assert!(
            after.median_abs_pct < before.median_abs_pct / 4.0,
            "{before:?} → {after:?}"
        );
        assert!(after.spearman > 0.95, "{after:?}");
        assert!(error(&fitted, mem, held) < error(&start, mem, held));
        let ratio = fitted.bwd_multiplier / truth.bwd_multiplier;
        assert!((0.8..1.25).contains(&ratio), "{}", fitted.bwd_multiplier);
    }
}
