//! What an oracle returns for one plan (DESIGN §1, §6).

use serde::{Deserialize, Serialize};

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
}
