//! Where data goes and what suites to draw: `[data]` with its suites, and
//! `[eval]`.

use serde::{Deserialize, Serialize};

use super::positive;
use crate::error::InvalidSetting;
use std::path::PathBuf;

/// One generated suite: `name` = `dlrm-<tables>x<devices>`, or
/// `dlrm-<tables>x<devices>-share<memory_share>` when its memory is a
/// multiple of each task's own need. Exactly one of `memory_gb` and
/// `memory_share` is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteConfig {
    pub tables: usize,
    pub devices: usize,
    /// Memory per device, the same for every task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// Memory per device of each task: this multiple of an even share of
    /// its tables' memory (their sum over the devices), never under its
    /// largest table. 1.1 leaves a tenth to spare: heuristics that balance
    /// lookups then often find no plan that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_share: Option<f64>,
}

impl SuiteConfig {
    pub fn name(&self) -> String {
        match self.memory_share {
            Some(share) => format!("dlrm-{}x{}-share{share}", self.tables, self.devices),
            None => format!("dlrm-{}x{}", self.tables, self.devices),
        }
    }

    /// The memory rule of `data.suites[i]` (this one), checked.
    pub fn memory(
        &self,
        i: usize,
    ) -> std::result::Result<crate::suite::SuiteMemory, InvalidSetting> {
        use crate::suite::SuiteMemory;
        match (self.memory_gb, self.memory_share) {
            (Some(gb), None) => {
                positive(&format!("data.suites[{i}].memory_gb"), gb)?;
                Ok(SuiteMemory::Gb(gb))
            }
            (None, Some(share)) if (1.0..=self.devices as f64).contains(&share) => {
                Ok(SuiteMemory::Share(share))
            }
            (None, Some(share)) => Err(InvalidSetting::new(
                format!("data.suites[{i}].memory_share"),
                format!(
                    "data.suites[{i}].memory_share = {share} must lie in 1..={} (below an even \
                 share of its tables' memory no task fits; at the number of devices, one \
                 device holds them all)",
                    self.devices
                ),
            )),
            (Some(_), Some(_)) => Err(InvalidSetting::new(
                format!("data.suites[{i}]"),
                format!("data.suites[{i}] gives both memory_gb and memory_share: give one"),
            )),
            (None, None) => Err(InvalidSetting::new(
                format!("data.suites[{i}]"),
                format!(
                    "data.suites[{i}] needs memory_gb (memory per device) or memory_share (a \
                 multiple of an even share of each task's tables' memory)"
                ),
            )),
        }
    }
}

/// Where generated data goes and what suites to draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    pub dir: PathBuf,
    /// A pool CSV of the user's own tables: `generate` splits it and draws
    /// the suites from it instead of generating a pool (`[generate]` is
    /// then unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PathBuf>,
    pub seed: u64,
    pub train_tasks: usize,
    pub test_tasks: usize,
    pub suites: Vec<SuiteConfig>,
}

impl Default for DataConfig {
    fn default() -> Self {
        let s = |tables, devices, memory_gb| SuiteConfig {
            tables,
            devices,
            memory_gb: Some(memory_gb),
            memory_share: None,
        };
        let tight = |tables, devices, share| SuiteConfig {
            tables,
            devices,
            memory_gb: None,
            memory_share: Some(share),
        };
        DataConfig {
            dir: PathBuf::from("data/generated"),
            pool: None,
            seed: 0,
            train_tasks: 50,
            test_tasks: 20,
            suites: vec![
                s(50, 4, 5.0),
                s(100, 4, 8.0),
                s(100, 8, 4.0),
                s(200, 8, 8.0),
                tight(50, 4, 1.1),
                tight(100, 8, 1.1),
            ],
        }
    }
}

impl DataConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("data.train_tasks", self.train_tasks as f64)?;
        positive("data.test_tasks", self.test_tasks as f64)?;
        let mut names = std::collections::BTreeMap::new();
        for (i, s) in self.suites.iter().enumerate() {
            positive(&format!("data.suites[{i}].tables"), s.tables as f64)?;
            if !(1..=crate::placement::MAX_DEVICES).contains(&s.devices) {
                return Err(InvalidSetting::new(
                    format!("data.suites[{i}].devices"),
                    format!(
                        "data.suites[{i}].devices = {} must lie in 1..={}",
                        s.devices,
                        crate::placement::MAX_DEVICES
                    ),
                ));
            }
            s.memory(i)?;
            // The files are named by tables, devices and memory share: a
            // second entry of the same name would overwrite the first's.
            if let Some(j) = names.insert(s.name(), i) {
                return Err(InvalidSetting::new(
                    format!("data.suites[{j}]"),
                    format!(
                        "data.suites[{j}] and data.suites[{i}] are both {}: their files would \
                     overwrite each other (one suite per number of tables and devices, and per \
                     memory_share)",
                        s.name()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `eval` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Oracle calls the `search` reference may spend per task.
    pub search_budget: usize,
    pub seed: u64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            search_budget: 4000,
            seed: 0,
        }
    }
}
