//! "Measure this plan": the trait behind every backend (the benchworker's
//! `sim`, `cpu` and `cuda`), the checks a plan passes first, and a
//! measurement's spread.

use crate::{Measurement, Plan, Table};

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OracleError {
    #[error("the plan places {plan} tables but the task has {tables}")]
    PlanLength { plan: usize, tables: usize },
    #[error("table {table} is placed on device {device}, but the plan has {devices} devices")]
    DeviceOutOfRange {
        table: usize,
        device: usize,
        devices: usize,
    },
    #[error("the plan has no device")]
    NoDevice,
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}

/// Something that measures a plan's cost: per device forward, backward and
/// their all-to-all exchanges, and the overall iteration cost.
pub trait Oracle: Send {
    /// The backend's name, as written on the command line.
    fn name(&self) -> &'static str;

    /// Measures `plan` over `tables` (the task's tables, in plan order).
    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError>;

    /// The kernel that runs the lookups (`torch`, `fbgemm`), for backends
    /// that run real ones; `None` for models.
    fn kernel(&self) -> Option<&'static str> {
        None
    }

    /// Repeat-to-repeat spread of the last measurement, for backends that
    /// time real work; `None` for exact models.
    fn spread(&self) -> Option<Spread> {
        None
    }

    /// The most devices a plan may have here (a `cuda` benchworker's GPUs,
    /// or its group's); `None`: any number (a model of them, or the CPU).
    fn max_devices(&self) -> Option<usize> {
        None
    }

    /// False once the backend cannot measure any more (a multi-host group
    /// whose communicators failed): the benchworker then starts afresh.
    fn healthy(&self) -> bool {
        true
    }
}

/// How much the iteration cost varied over the repeats of one measurement.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    pub median_ms: f64,
    /// First and third quartiles: the spread without the outliers.
    pub p25_ms: f64,
    pub p75_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub repeats: usize,
}

impl Spread {
    /// `(max − min) / median`.
    pub fn relative(&self) -> f64 {
        (self.max_ms - self.min_ms) / self.median_ms
    }

    /// Interquartile range over the median.
    pub fn relative_iqr(&self) -> f64 {
        (self.p75_ms - self.p25_ms) / self.median_ms
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spread over {} repeats: median {:.3} ms, quartiles {:.3}–{:.3} ({:.1}% of the median), \
             min {:.3}, max {:.3} ({:.1}%)",
            self.repeats,
            self.median_ms,
            self.p25_ms,
            self.p75_ms,
            100.0 * self.relative_iqr(),
            self.min_ms,
            self.max_ms,
            100.0 * self.relative()
        )
    }
}

/// Checks that a plan fits its tables before a backend trusts it.
pub fn check_plan(tables: &[Table], plan: &Plan) -> Result<(), OracleError> {
    if plan.devices == 0 {
        return Err(OracleError::NoDevice);
    }
    if plan.assignment.len() != tables.len() {
        return Err(OracleError::PlanLength {
            plan: plan.assignment.len(),
            tables: tables.len(),
        });
    }
    if let Some((table, &device)) = plan
        .assignment
        .iter()
        .enumerate()
        .find(|(_, &d)| d >= plan.devices)
    {
        return Err(OracleError::DeviceOutOfRange {
            table,
            device,
            devices: plan.devices,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_plan_rejects_mismatches() {
        let t = crate::generate::generate_pool(
            &crate::generate::PoolGenConfig {
                tables: 2,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let plan = |devices, assignment| Plan {
            devices,
            assignment,
        };
        assert!(check_plan(&t, &plan(2, vec![0, 1])).is_ok());
        assert!(matches!(
            check_plan(&t, &plan(2, vec![0])),
            Err(OracleError::PlanLength { .. })
        ));
        assert!(matches!(
            check_plan(&t, &plan(2, vec![0, 2])),
            Err(OracleError::DeviceOutOfRange { device: 2, .. })
        ));
        assert!(matches!(
            check_plan(&t, &plan(0, vec![])),
            Err(OracleError::NoDevice)
        ));
    }
}
