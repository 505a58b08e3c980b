//! What an oracle returns for one plan (DESIGN §1, §6).

use serde::{Deserialize, Serialize};

/// Why a measurement from elsewhere is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BadMeasurement {
    #[error("{got} device entries for a plan on {devices} devices")]
    Devices { got: usize, devices: usize },
    #[error("device {device}: a phase time is negative or not finite")]
    Phase { device: usize },
    #[error(
        "device {device}: a phase of {ms:e} ms, beyond {:e}",
        Measurement::MAX_PHASE_MS
    )]
    TooLong { device: usize, ms: f64 },
    #[error("device {device}: total_ms is not the sum of its phases")]
    Total { device: usize },
    #[error("cost_ms {cost_ms} is not the slowest device's total {slowest}")]
    Cost { cost_ms: f64, slowest: f64 },
}

/// One device's share of an iteration, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceCost {
    /// Fused embedding lookup (forward computation).
    pub fwd_ms: f64,
    /// Embedding backward with the optimizer update.
    pub bwd_ms: f64,
    /// Forward all-to-all of pooled outputs, including the wait for the
    /// slowest participant to arrive.
    pub fwd_comm_ms: f64,
    /// Backward all-to-all of output gradients.
    pub bwd_comm_ms: f64,
    /// `fwd + fwd_comm + bwd_comm + bwd`.
    pub total_ms: f64,
}

impl DeviceCost {
    /// Builds a device cost whose total is the sum of its four phases.
    pub fn new(fwd_ms: f64, bwd_ms: f64, fwd_comm_ms: f64, bwd_comm_ms: f64) -> Self {
        DeviceCost {
            fwd_ms,
            bwd_ms,
            fwd_comm_ms,
            bwd_comm_ms,
            total_ms: fwd_ms + fwd_comm_ms + bwd_comm_ms + bwd_ms,
        }
    }
}

/// A measured plan: per-device phases and the iteration cost, the maximum of
/// the device totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub cost_ms: f64,
    pub devices: Vec<DeviceCost>,
}

impl Measurement {
    /// Assembles a measurement; `cost_ms` is the slowest device's total.
    pub fn from_devices(devices: Vec<DeviceCost>) -> Self {
        let cost_ms = devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
        Measurement { cost_ms, devices }
    }

    /// The longest phase a measurement may report, in ms (days): far above
    /// any real iteration, far below where the cost network's squared
    /// error overflows.
    pub const MAX_PHASE_MS: f64 = 1e9;

    /// Checks a measurement that arrived from elsewhere: one entry per
    /// device, finite non-negative phases up to [`Self::MAX_PHASE_MS`],
    /// totals that are their sums, and the cost the slowest total.
    pub fn validate(&self, devices: usize) -> Result<(), BadMeasurement> {
        if self.devices.len() != devices {
            return Err(BadMeasurement::Devices {
                got: self.devices.len(),
                devices,
            });
        }
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0);
        for (i, d) in self.devices.iter().enumerate() {
            let phases = [d.fwd_ms, d.bwd_ms, d.fwd_comm_ms, d.bwd_comm_ms];
            if phases.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(BadMeasurement::Phase { device: i });
            }
            if let Some(x) = phases.iter().find(|&&x| x > Self::MAX_PHASE_MS) {
                return Err(BadMeasurement::TooLong { device: i, ms: *x });
            }
            if !close(phases.iter().sum(), d.total_ms) {
                return Err(BadMeasurement::Total { device: i });
            }
        }
        let slowest = self.devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
        if !close(slowest, self.cost_ms) {
            return Err(BadMeasurement::Cost {
                cost_ms: self.cost_ms,
                slowest,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_the_slowest_device_total() {
        let m = Measurement::from_devices(vec![
            DeviceCost::new(1.0, 2.0, 0.5, 0.5),
            DeviceCost::new(2.0, 3.0, 0.1, 0.1),
        ]);
        assert_eq!(m.devices[0].total_ms, 4.0);
        assert!((m.cost_ms - 5.2).abs() < 1e-12);
    }

    #[test]
    fn validate_finds_what_does_not_add_up() {
        let good = Measurement::from_devices(vec![
            DeviceCost::new(1.0, 2.0, 0.5, 0.5),
            DeviceCost::new(2.0, 3.0, 0.1, 0.1),
        ]);
        assert_eq!(good.validate(2), Ok(()));
        let e = good.validate(3).unwrap_err();
        assert_eq!(e, BadMeasurement::Devices { got: 2, devices: 3 });
        assert!(e.to_string().contains("3 devices"), "{e}");
        let mut bad = good.clone();
        bad.devices[1].bwd_ms = f64::NAN;
        assert_eq!(bad.validate(2), Err(BadMeasurement::Phase { device: 1 }));
        let mut bad = good.clone();
        bad.devices[1] = DeviceCost::new(1.0, 1e300, 0.0, 0.0);
        bad.cost_ms = bad.devices[1].total_ms;
        let e = bad.validate(2).unwrap_err();
        assert!(
            matches!(e, BadMeasurement::TooLong { device: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("1e300"), "{e}");
        let mut bad = good.clone();
        bad.devices[0].total_ms = 9.0;
        assert!(matches!(bad.validate(2), Err(BadMeasurement::Total { .. })));
        let mut bad = good;
        bad.cost_ms = 1.0;
        assert!(matches!(bad.validate(2), Err(BadMeasurement::Cost { .. })));
    }
}
