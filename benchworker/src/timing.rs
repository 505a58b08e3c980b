//! From timed repeats to a measurement: medians per phase, the repeat-to-
//! repeat spread. Shared by the backends that time real work.

use common::{DeviceCost, Measurement};

use crate::oracle::Spread;

/// One device's four phases in one repeat, ms.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Phases {
    pub fwd: f64,
    pub fwd_comm: f64,
    pub bwd_comm: f64,
    pub bwd: f64,
}

impl Phases {
    pub fn cost(&self) -> DeviceCost {
        DeviceCost::new(self.fwd, self.bwd, self.fwd_comm, self.bwd_comm)
    }
}

/// The measurement of `rounds` (one `Vec` of per-device phases per repeat):
/// each phase of each device is its median over the repeats, and the spread
/// is that of each repeat's own iteration cost (max over devices).
pub fn assemble(rounds: &[Vec<Phases>]) -> Option<(Measurement, Spread)> {
    let devices = rounds.first()?.len();
    if devices == 0 || rounds.iter().any(|r| r.len() != devices) {
        return None;
    }
    let phase = |d: usize, f: fn(&Phases) -> f64| {
        median(&rounds.iter().map(|r| f(&r[d])).collect::<Vec<_>>())
    };
    let costs: Vec<DeviceCost> = (0..devices)
        .map(|d| {
            Phases {
                fwd: phase(d, |p| p.fwd),
                fwd_comm: phase(d, |p| p.fwd_comm),
                bwd_comm: phase(d, |p| p.bwd_comm),
                bwd: phase(d, |p| p.bwd),
            }
            .cost()
        })
        .collect();
    let per_round: Vec<f64> = rounds
        .iter()
        .map(|r| Measurement::from_devices(r.iter().map(Phases::cost).collect()).cost_ms)
        .collect();
    Some((Measurement::from_devices(costs), spread(&per_round)))
}

pub fn median(xs: &[f64]) -> f64 {
    quantile(xs, 0.5)
}

/// The `q` quantile, interpolated linearly between order statistics.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

pub fn spread(costs: &[f64]) -> Spread {
    Spread {
        median_ms: median(costs),
        p25_ms: quantile(costs, 0.25),
        p75_ms: quantile(costs, 0.75),
        min_ms: costs.iter().copied().fold(f64::INFINITY, f64::min),
        max_ms: costs.iter().copied().fold(0.0, f64::max),
        repeats: costs.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let xs = [4.0, 1.0, 3.0, 2.0, 100.0];
        assert_eq!(median(&xs), 3.0);
        assert_eq!(quantile(&xs, 0.25), 2.0);
        assert_eq!(quantile(&xs, 0.75), 4.0);
        assert_eq!(median(&[1.0, 2.0]), 1.5);
        let s = spread(&xs);
        assert_eq!((s.min_ms, s.max_ms, s.repeats), (1.0, 100.0, 5));
        assert_eq!(s.relative_iqr(), 2.0 / 3.0);
    }

    fn p(fwd: f64, fwd_comm: f64, bwd_comm: f64, bwd: f64) -> Phases {
        Phases {
            fwd,
            fwd_comm,
            bwd_comm,
            bwd,
        }
    }

    #[test]
    fn each_phase_is_its_own_median_and_the_spread_is_over_repeat_costs() {
        let rounds = vec![
            vec![p(1.0, 0.5, 0.5, 2.0), p(2.0, 0.1, 0.5, 4.0)],
            vec![p(3.0, 0.5, 0.5, 2.0), p(2.0, 0.1, 0.5, 40.0)], // an outlier
            vec![p(2.0, 0.5, 0.5, 2.0), p(2.0, 0.1, 0.5, 4.0)],
        ];
        let (m, s) = assemble(&rounds).unwrap();
        assert_eq!(m.devices[0].fwd_ms, 2.0);
        assert_eq!(m.devices[1].bwd_ms, 4.0);
        assert_eq!(m.devices[0].total_ms, 2.0 + 0.5 + 0.5 + 2.0);
        assert_eq!(m.devices[1].total_ms, 2.0 + 0.1 + 0.5 + 4.0);
        assert_eq!(m.cost_ms, m.devices[1].total_ms);
        // Per repeat: 6.6, 42.6, 6.6.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert_eq!(s.repeats, 3);
        assert!(close(s.min_ms, 6.6) && close(s.median_ms, 6.6), "{s:?}");
        assert!(close(s.max_ms, 42.6), "{s:?}");
    }

    #[test]
    fn ragged_or_empty_rounds_are_refused() {
        assert!(assemble(&[]).is_none());
        assert!(assemble(&[vec![]]).is_none());
        let ragged = vec![vec![Phases::default()], vec![Phases::default(); 2]];
        assert!(assemble(&ragged).is_none());
    }
}
