//! Placements: the JSON users read and write
//! (`{"devices": D, "assignment": [{"table": "<name>", "device": d}, …]}`),
//! and [`Plan`], the same resolved to table indices of a task.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::table::{MemoryModel, Table};

/// Most devices a plan or task may name: far above any cluster's GPUs, low
/// enough that a typo cannot make us allocate per-device state for billions.
pub const MAX_DEVICES: usize = 1 << 16;

/// A plan over a task's tables: `assignment[i]` is the device of table `i`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Plan {
    pub devices: usize,
    pub assignment: Vec<usize>,
}

impl Plan {
    /// Indices of the tables on each device, in table order.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let mut g = vec![Vec::new(); self.devices];
        for (i, &d) in self.assignment.iter().enumerate() {
            g[d].push(i);
        }
        g
    }

    /// Bytes used on each device under `mem`.
    pub fn device_bytes(&self, tables: &[Table], mem: &MemoryModel) -> Vec<u64> {
        let mut used = vec![0u64; self.devices];
        for (t, &d) in tables.iter().zip(&self.assignment) {
            used[d] = used[d].saturating_add(mem.table_bytes(t));
        }
        used
    }

    /// Whether every device stays within `cap_bytes`.
    pub fn fits(&self, tables: &[Table], mem: &MemoryModel, cap_bytes: u64) -> bool {
        self.device_bytes(tables, mem)
            .iter()
            .all(|&b| b <= cap_bytes)
    }
}

/// One line of a placement file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub table: String,
    pub device: usize,
}

/// The placement JSON document. Other keys (such as the estimates `plan`
/// writes beside the assignment) are ignored when read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub devices: usize,
    pub assignment: Vec<Assignment>,
    /// Read from TorchRec's `{"world_size", "ranks"}`: errors then name
    /// those fields.
    #[serde(skip)]
    pub torchrec: bool,
}

impl Placement {
    /// Names a plan's tables.
    pub fn from_plan(plan: &Plan, tables: &[Table]) -> Self {
        Placement {
            devices: plan.devices,
            assignment: tables
                .iter()
                .zip(&plan.assignment)
                .map(|(t, &d)| Assignment {
                    table: t.name.clone(),
                    device: d,
                })
                .collect(),
            torchrec: false,
        }
    }

    /// Reads a placement file (shape only; see [`Placement::resolve`]):
    /// the placement JSON, or the `{"world_size": D, "ranks": {table:
    /// rank}}` of `learner plan --format torchrec`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::fs::read_text(path)?;
        let parse = |e: serde_json::Error| Error::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(parse)?;
        if value.get("devices").is_none() && value.get("ranks").is_some() {
            #[derive(Deserialize)]
            struct Ranks {
                world_size: usize,
                ranks: std::collections::BTreeMap<String, usize>,
            }
            let r: Ranks = serde_json::from_value(value).map_err(parse)?;
            return Ok(Placement {
                devices: r.world_size,
                assignment: r
                    .ranks
                    .into_iter()
                    .map(|(table, device)| Assignment { table, device })
                    .collect(),
                torchrec: true,
            });
        }
        serde_json::from_value(value).map_err(parse)
    }

    /// Resolves names to the indices of `tables`: every table must be placed
    /// exactly once, on a device below `devices`. `path` is used in messages.
    pub fn resolve(&self, tables: &[Table], path: &Path) -> Result<Plan> {
        let invalid = |location: String, message: String| Error::Invalid {
            path: path.to_path_buf(),
            location,
            message,
        };
        // Where a fault lies, in the file's own terms.
        let (devices, entry, what) = if self.torchrec {
            ("world_size", "ranks", "rank")
        } else {
            ("devices", "assignment", "device")
        };
        if self.devices == 0 || self.devices > MAX_DEVICES {
            return Err(invalid(
                devices.into(),
                format!("{} must lie in 1..={MAX_DEVICES}", self.devices),
            ));
        }
        let index: HashMap<&str, usize> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        // TorchRec's ranks are keyed by name: `ranks.NAME`.
        let at = |k: usize, a: &Assignment, field: &str| {
            if self.torchrec {
                format!("{entry}.{}", a.table)
            } else {
                format!("{entry}[{k}].{field}")
            }
        };
        let mut assignment = vec![usize::MAX; tables.len()];
        for (k, a) in self.assignment.iter().enumerate() {
            let Some(&i) = index.get(a.table.as_str()) else {
                return Err(invalid(
                    at(k, a, "table"),
                    format!("unknown table `{}`", a.table),
                ));
            };
            if a.device >= self.devices {
                return Err(invalid(
                    at(k, a, what),
                    format!(
                        "{what} {} does not exist ({what}s are 0..{})",
                        a.device,
                        self.devices - 1
                    ),
                ));
            }
            if assignment[i] != usize::MAX {
                return Err(invalid(
                    at(k, a, "table"),
                    format!("table `{}` is placed twice", a.table),
                ));
            }
            assignment[i] = a.device;
        }
        if let Some(i) = assignment.iter().position(|&d| d == usize::MAX) {
            return Err(invalid(
                entry.into(),
                format!("table `{}` is not placed", tables[i].name),
            ));
        }
        Ok(Plan {
            devices: self.devices,
            assignment,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::table;

    fn tables() -> Vec<Table> {
        vec![table("a", 10, 8, 1.0), table("b", 10, 8, 1.0)]
    }

    fn placement(pairs: &[(&str, usize)], devices: usize) -> Placement {
        Placement {
            torchrec: false,
            devices,
            assignment: pairs
                .iter()
                .map(|(t, d)| Assignment {
                    table: t.to_string(),
                    device: *d,
                })
                .collect(),
        }
    }

    #[test]
    fn resolves_names_to_indices_and_back() {
        let p = placement(&[("b", 1), ("a", 0)], 2);
        let plan = p.resolve(&tables(), Path::new("p.json")).unwrap();
        assert_eq!(plan.assignment, vec![0, 1]);
        assert_eq!(plan.groups(), vec![vec![0], vec![1]]);
        let back = Placement::from_plan(&plan, &tables());
        assert_eq!(back.assignment[1].table, "b");
    }

    #[test]
    fn rejects_unknown_tables_and_devices() {
        let e = placement(&[("a", 0), ("zzz", 1)], 2)
            .resolve(&tables(), Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.json") && e.contains("assignment[1].table") && e.contains("zzz"));
        let e = placement(&[("a", 0), ("b", 2)], 2)
            .resolve(&tables(), Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("assignment[1].device") && e.contains("device 2 does not exist"));
        let e = placement(&[("a", 0), ("b", 1)], usize::MAX)
            .resolve(&tables(), Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("devices") && e.contains("must lie in"), "{e}");
    }

    #[test]
    fn rejects_missing_and_doubled_tables() {
        let e = placement(&[("a", 0)], 2)
            .resolve(&tables(), Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b` is not placed"), "{e}");
        let e = placement(&[("a", 0), ("a", 1), ("b", 0)], 2)
            .resolve(&tables(), Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("placed twice"), "{e}");
    }

    #[test]
    fn rejects_malformed_json_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.json");
        std::fs::write(&p, "{\"devices\": 2, \"assignment\": [{\"table\": 3}]}").unwrap();
        let e = Placement::read(&p).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
    }

    #[test]
    fn plans_torchrec_format_reads_as_the_same_placement() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plan.torchrec.json");
        std::fs::write(&p, r#"{"world_size": 2, "ranks": {"b": 1, "a": 0}}"#).unwrap();
        let read = Placement::read(&p).unwrap();
        assert_eq!(read.devices, 2);
        let plan = read.resolve(&tables(), &p).unwrap();
        assert_eq!(plan.assignment, vec![0, 1]);
        // Its faults are named as well.
        std::fs::write(&p, r#"{"ranks": {"a": 0}}"#).unwrap();
        let e = Placement::read(&p).unwrap_err().to_string();
        assert!(e.contains("world_size"), "{e}");
        std::fs::write(&p, r#"{"world_size": 2, "ranks": {"a": -1}}"#).unwrap();
        assert!(Placement::read(&p).is_err());
        // A table left out, or a rank past the world: named as the file has them.
        std::fs::write(&p, r#"{"world_size": 2, "ranks": {"a": 0}}"#).unwrap();
        let e = Placement::read(&p).unwrap().resolve(&tables(), &p);
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("ranks") && e.contains("`b` is not placed"),
            "{e}"
        );
        assert!(!e.contains("assignment"), "{e}");
        std::fs::write(&p, r#"{"world_size": 2, "ranks": {"a": 0, "b": 2}}"#).unwrap();
        let e = Placement::read(&p).unwrap().resolve(&tables(), &p);
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("ranks.b") && e.contains("rank 2 does not exist"),
            "{e}"
        );
    }
}
