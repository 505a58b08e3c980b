//! Task suites: `{"pool": "<csv path relative to this file>", "tasks":
//! [{"name", "devices", "memory_gb", "tables": ["<table name>", …]}]}`.
//!
//! Loading resolves every task against its pool and rejects tasks that
//! provably cannot fit memory, so later stages can trust a [`Suite`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::placement::MAX_DEVICES;
use crate::pool;
use crate::table::{MemoryModel, Table, BYTES_PER_GB};

/// A task as written in the suite file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    pub devices: usize,
    pub memory_gb: f64,
    pub tables: Vec<String>,
}

/// What a tight-memory copy's name adds to its training task's.
const TIGHT_COPY_MARK: &str = " (tight memory ";
/// What a reshaped copy's name adds to its training task's.
const RESHAPED_COPY_MARK: &str = " (reshaped ";

/// The suite file as written on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteFile {
    pub pool: String,
    pub tasks: Vec<TaskSpec>,
}

/// A placement task with its tables resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub name: String,
    pub devices: usize,
    pub memory_gb: f64,
    pub tables: Vec<Table>,
}

impl Task {
    /// The name of tight-memory copy `copy` of the training task `name`:
    /// a task that only rollouts place (`train.tight_memory`), with less
    /// memory per device.
    pub fn tight_copy_name(name: &str, copy: usize) -> String {
        format!("{name}{TIGHT_COPY_MARK}{copy})")
    }

    /// The name of reshaped copy `copy` of the training task `name`: a
    /// task that only rollouts place (`train.reshape_copies`), on another
    /// number of devices.
    pub fn reshaped_copy_name(name: &str, copy: usize) -> String {
        format!("{name}{RESHAPED_COPY_MARK}{copy})")
    }

    /// Whether this is a copy of a training task that only rollouts place
    /// (tight-memory or reshaped): no plan of it is ever measured.
    pub fn is_rollout_copy(&self) -> bool {
        self.name.contains(TIGHT_COPY_MARK) || self.name.contains(RESHAPED_COPY_MARK)
    }

    /// Whether this is a reshaped copy: a training task's tables on
    /// another number of devices, that only rollouts place.
    pub fn is_reshaped_copy(&self) -> bool {
        self.name.contains(RESHAPED_COPY_MARK)
    }

    /// The per-device memory cap in bytes.
    pub fn cap_bytes(&self) -> u64 {
        (self.memory_gb * BYTES_PER_GB) as u64
    }

    /// Necessary conditions for a memory-feasible plan: every table fits one
    /// device and all tables fit all devices. Returns the reason when not.
    pub fn infeasibility(&self, mem: &MemoryModel) -> Option<String> {
        let cap = self.cap_bytes();
        let largest = self
            .tables
            .iter()
            .max_by_key(|t| mem.table_bytes(t))
            .filter(|t| mem.table_bytes(t) > cap);
        if let Some(t) = largest {
            return Some(format!(
                "table `{}`, the largest, needs {:.3} GiB, more than the {} GiB of one device: \
                 give each device at least that",
                t.name,
                mem.table_gb(t),
                self.memory_gb
            ));
        }
        let total = self
            .tables
            .iter()
            .fold(0u64, |s, t| s.saturating_add(mem.table_bytes(t)));
        if total > cap.saturating_mul(self.devices as u64) {
            let gb = total as f64 / BYTES_PER_GB;
            return Some(format!(
                "its tables need {gb:.3} GiB in all, more than {} × {} GiB: give each device at \
                 least {:.3} GiB, or use at least {} devices",
                crate::count(self.devices, "device"),
                self.memory_gb,
                gb / self.devices as f64,
                (gb / self.memory_gb).ceil() as u64
            ));
        }
        None
    }

    /// Memory per device, in GiB, at which first-fit decreasing by bytes
    /// ([`first_fit_decreasing`]) packs the tables on the task's devices:
    /// enough to place them, where no plan was found. A bisection between
    /// the larger of the largest table and an even share, and all the
    /// tables: the lowest memory it finds that packs (first-fit is not
    /// monotone in memory, so a lower one may exist).
    pub fn packed_memory_gb(&self, mem: &MemoryModel) -> f64 {
        let bytes: Vec<u64> = self.tables.iter().map(|t| mem.table_bytes(t)).collect();
        let total = bytes.iter().fold(0u64, |s, &b| s.saturating_add(b));
        let devices = self.devices.max(1) as u64;
        let largest = bytes.iter().copied().max().unwrap_or(0);
        let packs = |cap: u64| first_fit_decreasing(&self.tables, self.devices, cap, mem).is_some();
        // One device can hold all: first-fit packs at the total.
        let (mut lo, mut hi) = (largest.max(total.div_ceil(devices)), total.max(1));
        if packs(lo) {
            hi = lo;
        }
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            match packs(mid) {
                true => hi = mid,
                false => lo = mid,
            }
        }
        hi as f64 / BYTES_PER_GB
    }

    /// [`Task::packed_memory_gb`] rounded up to a thousandth of a GiB, as
    /// errors print it: a figure rounded down might not pack.
    pub fn packed_memory_gb_shown(&self, mem: &MemoryModel) -> f64 {
        (self.packed_memory_gb(mem) * 1000.0).ceil() / 1000.0
    }
}

/// A loaded, validated suite.
#[derive(Debug, Clone)]
pub struct Suite {
    pub path: PathBuf,
    pub pool_path: PathBuf,
    pub tasks: Vec<Task>,
}

impl Suite {
    /// Reads a suite and its pool; every task must name known, distinct
    /// tables and pass [`Task::infeasibility`] under `mem`.
    pub fn load(path: &Path, mem: &MemoryModel) -> Result<Suite> {
        let text = crate::fs::read_text(path)?;
        let file: SuiteFile = serde_json::from_str(&text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            message: if text.trim_start().starts_with("name,") {
                // A pool given where a suite goes.
                format!(
                    "{e}: this is a pool CSV, not a suite JSON (a suite names its pool and \
                     tasks: `learner generate` writes suites)"
                )
            } else {
                e.to_string()
            },
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let pool_path = dir.join(&file.pool);
        let pool = pool::read(&pool_path).map_err(|e| match e {
            // The pool's own path alone does not say where it came from.
            Error::Io { cause, .. } => Error::Invalid {
                path: path.to_path_buf(),
                location: "pool".into(),
                message: format!(
                    "cannot read the pool `{}` at {}: {cause}{}",
                    file.pool,
                    std::path::absolute(&pool_path)
                        .unwrap_or_else(|_| pool_path.clone())
                        .display(),
                    if Path::new(&file.pool).is_relative() {
                        "; `pool` is a path relative to the suite file's folder"
                    } else {
                        ""
                    }
                ),
            },
            e => e,
        })?;
        let tasks = resolve_tasks(&file, &pool, mem, path)?;
        Ok(Suite {
            path: path.to_path_buf(),
            pool_path,
            tasks,
        })
    }
}

fn resolve_tasks(
    file: &SuiteFile,
    pool: &[Table],
    mem: &MemoryModel,
    path: &Path,
) -> Result<Vec<Task>> {
    let invalid = |location: String, message: String| Error::Invalid {
        path: path.to_path_buf(),
        location,
        message,
    };
    if file.tasks.is_empty() {
        return Err(invalid("tasks".into(), "the suite holds no task".into()));
    }
    let by_name: HashMap<&str, &Table> = pool.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut tasks = Vec::with_capacity(file.tasks.len());
    let mut task_names = HashMap::new();
    for (i, spec) in file.tasks.iter().enumerate() {
        // Results are reported by task name: two of one name could not be
        // told apart.
        if let Some(first) = task_names.insert(spec.name.as_str(), i) {
            return Err(invalid(
                format!("tasks[{i}].name"),
                format!("`{}` is also the name of tasks[{first}]", spec.name),
            ));
        }
        if spec.devices == 0 || spec.devices > MAX_DEVICES {
            return Err(invalid(
                format!("tasks[{i}].devices"),
                format!("{} must lie in 1..={MAX_DEVICES}", spec.devices),
            ));
        }
        if !(spec.memory_gb.is_finite() && spec.memory_gb > 0.0) {
            return Err(invalid(
                format!("tasks[{i}].memory_gb"),
                format!("`{}` must be a positive number", spec.memory_gb),
            ));
        }
        if spec.tables.is_empty() {
            return Err(invalid(format!("tasks[{i}].tables"), "no table".into()));
        }
        let mut seen = HashSet::new();
        let mut tables = Vec::with_capacity(spec.tables.len());
        for (j, name) in spec.tables.iter().enumerate() {
            let Some(t) = by_name.get(name.as_str()) else {
                return Err(invalid(
                    format!("tasks[{i}].tables[{j}]"),
                    format!("table `{name}` is not in the pool"),
                ));
            };
            if !seen.insert(name.as_str()) {
                return Err(invalid(
                    format!("tasks[{i}].tables[{j}]"),
                    format!("table `{name}` appears twice"),
                ));
            }
            tables.push((*t).clone());
        }
        let task = Task {
            name: spec.name.clone(),
            devices: spec.devices,
            memory_gb: spec.memory_gb,
            tables,
        };
        if let Some(why) = task.infeasibility(mem) {
            return Err(Error::Infeasible {
                context: format!("{}: tasks[{i}] `{}`", path.display(), spec.name),
                message: format!("cannot fit memory: {why}"),
            });
        }
        tasks.push(task);
    }
    Ok(tasks)
}

/// First-fit decreasing by bytes: a cheap witness that a task has a
/// memory-feasible plan. `None` when it finds none.
pub fn first_fit_decreasing(
    tables: &[Table],
    devices: usize,
    cap_bytes: u64,
    mem: &MemoryModel,
) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..tables.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(mem.table_bytes(&tables[i])));
    let mut used = vec![0u64; devices];
    let mut assignment = vec![0; tables.len()];
    for i in order {
        let b = mem.table_bytes(&tables[i]);
        let d = (0..devices).find(|&d| used[d].saturating_add(b) <= cap_bytes)?;
        used[d] += b;
        assignment[i] = d;
    }
    Some(assignment)
}

/// The memory per device a suite's tasks get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SuiteMemory {
    /// The same for every task, in GB.
    Gb(f64),
    /// This multiple of an even share of each task's tables' memory, never
    /// under its largest table ([`share_memory_gb`]).
    Share(f64),
}

/// Memory per device, in GB, at `share` times an even share of `tables`'
/// memory over `devices` (their bytes summed, divided by the devices), or
/// the largest table's bytes where that is more. Rounded up by a byte, so
/// that a task's cap ([`Task::cap_bytes`]) still holds what it was
/// computed from.
pub fn share_memory_gb(tables: &[Table], devices: usize, share: f64, mem: &MemoryModel) -> f64 {
    let bytes: Vec<u64> = tables.iter().map(|t| mem.table_bytes(t)).collect();
    let even = bytes.iter().sum::<u64>() as f64 / devices.max(1) as f64;
    let largest = bytes.iter().copied().max().unwrap_or(0) as f64;
    ((share * even).max(largest) + 1.0) / BYTES_PER_GB
}

/// What to draw for one suite.
#[derive(Debug, Clone)]
pub struct SuiteSpec {
    pub name: String,
    pub tables_per_task: usize,
    pub devices: usize,
    pub memory: SuiteMemory,
    pub tasks: usize,
}

/// Draws `spec.tasks` tasks of distinct tables from `pool`; every task has a
/// memory-feasible plan (first-fit decreasing finds one). `pool_ref` is
/// written as the suite's pool path.
pub fn generate(
    spec: &SuiteSpec,
    pool: &[Table],
    pool_ref: &str,
    mem: &MemoryModel,
    seed: u64,
) -> Result<SuiteFile> {
    let context = || format!("suite `{}`", spec.name);
    if spec.tables_per_task > pool.len() {
        return Err(Error::Infeasible {
            context: context(),
            message: format!(
                "{} tables per task, but its pool (`{pool_ref}`) holds {}",
                spec.tables_per_task,
                pool.len()
            ),
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ crate::fs::fnv1a(spec.name.as_bytes()));
    const MAX_DRAWS: usize = 1000;
    let mut tasks = Vec::with_capacity(spec.tasks);
    for k in 0..spec.tasks {
        let mut drawn = None;
        for _ in 0..MAX_DRAWS {
            let idx = sample(&mut rng, pool.len(), spec.tables_per_task).into_vec();
            let tables: Vec<Table> = idx.iter().map(|&i| pool[i].clone()).collect();
            let memory_gb = match spec.memory {
                SuiteMemory::Gb(gb) => gb,
                SuiteMemory::Share(share) => share_memory_gb(&tables, spec.devices, share, mem),
            };
            let cap = (memory_gb * BYTES_PER_GB) as u64;
            if first_fit_decreasing(&tables, spec.devices, cap, mem).is_some() {
                drawn = Some((tables, memory_gb));
                break;
            }
        }
        let (tables, memory_gb) = drawn.ok_or_else(|| Error::Infeasible {
            context: context(),
            message: match spec.memory {
                SuiteMemory::Gb(gb) => format!(
                    "none of {MAX_DRAWS} draws of {} tables fits {} devices × {gb} GiB",
                    spec.tables_per_task, spec.devices
                ),
                SuiteMemory::Share(share) => format!(
                    "none of {MAX_DRAWS} draws of {} tables fits {} devices at {share} times \
                     an even share of its memory (first-fit decreasing): raise memory_share",
                    spec.tables_per_task, spec.devices
                ),
            },
        })?;
        tasks.push(TaskSpec {
            name: format!("{}-{k:03}", spec.name),
            devices: spec.devices,
            memory_gb,
            tables: tables.into_iter().map(|t| t.name).collect(),
        });
    }
    Ok(SuiteFile {
        pool: pool_ref.to_string(),
        tasks,
    })
}

/// Writes a suite file atomically, pretty-printed.
pub fn write(path: &Path, suite: &SuiteFile) -> Result<()> {
    let text = serde_json::to_string_pretty(suite).map_err(|e| Error::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    crate::fs::write_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::table;

    fn mem() -> MemoryModel {
        MemoryModel::default()
    }

    /// Three equal tables on two devices fit in all, but two must share
    /// a device: first-fit packs them at twice one table, not at an even
    /// share.
    #[test]
    fn the_packed_memory_is_where_first_fit_decreasing_first_packs() {
        let big = |name: &str| Table::cold(name, 20_000_000, 128, 1.0);
        let task = Task {
            name: "t".into(),
            devices: 2,
            memory_gb: 8.0,
            tables: vec![big("a"), big("b"), big("c")],
        };
        let one = mem().table_bytes(&task.tables[0]);
        assert_eq!(task.infeasibility(&mem()), None, "fits in all");
        let gb = task.packed_memory_gb(&mem());
        assert!((gb * BYTES_PER_GB - 2.0 * one as f64).abs() <= 1.0, "{gb}");
        let cap = (gb * BYTES_PER_GB).round() as u64;
        assert!(first_fit_decreasing(&task.tables, 2, cap, &mem()).is_some());
        assert!(first_fit_decreasing(&task.tables, 2, cap - 1, &mem()).is_none());
        // Where an even share packs, that is the answer.
        let three = Task {
            devices: 3,
            ..task.clone()
        };
        assert!((three.packed_memory_gb(&mem()) * BYTES_PER_GB - one as f64).abs() <= 1.0);
    }

    fn write_pool(dir: &Path, tables: &[Table]) {
        pool::write(&dir.join("pool.csv"), tables).unwrap();
    }

    fn small_pool() -> Vec<Table> {
        (0..20)
            .map(|i| table(&format!("t{i}"), 1000 * (i + 1), 16, 1.0))
            .collect()
    }

    /// The largest table that does not fit is named, and what would fit
    /// is said: the memory per device, or the devices.
    #[test]
    fn infeasibility_names_the_largest_table_and_what_fits() {
        let gb = |t: &Table| mem().table_gb(t);
        let big = table("big", 50_000_000, 64, 1.0);
        let bigger = table("bigger", 90_000_000, 64, 1.0);
        let task = |tables: Vec<Table>, devices, memory_gb| Task {
            name: "t".into(),
            devices,
            memory_gb,
            tables,
        };
        let cap = gb(&big) * 0.9;
        let e = task(vec![big.clone(), bigger.clone()], 4, cap)
            .infeasibility(&mem())
            .unwrap();
        assert!(
            e.contains("`bigger`, the largest") && e.contains(&format!("{:.3} GiB", gb(&bigger))),
            "{e}"
        );
        let small: Vec<Table> = (0..10)
            .map(|i| table(&format!("s{i}"), 1_000_000, 64, 1.0))
            .collect();
        let each = gb(&small[0]);
        let e = task(small, 2, each * 2.0).infeasibility(&mem()).unwrap();
        assert!(
            e.contains("more than 2 devices ×") && e.contains("at least 5 devices"),
            "{e}"
        );
        assert_eq!(crate::count(1, "task"), "1 task");
        assert_eq!(crate::count(3, "device"), "3 devices");
    }

    #[test]
    fn generated_suites_load_and_are_reproducible() {
        let dir = tempfile::tempdir().unwrap();
        let pool = small_pool();
        write_pool(dir.path(), &pool);
        let spec = SuiteSpec {
            name: "s".into(),
            tables_per_task: 5,
            devices: 2,
            memory: SuiteMemory::Gb(1.0),
            tasks: 4,
        };
        let a = generate(&spec, &pool, "pool.csv", &mem(), 7).unwrap();
        let b = generate(&spec, &pool, "pool.csv", &mem(), 7).unwrap();
        let c = generate(&spec, &pool, "pool.csv", &mem(), 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let p = dir.path().join("s.json");
        write(&p, &a).unwrap();
        let suite = Suite::load(&p, &mem()).unwrap();
        assert_eq!(suite.tasks.len(), 4);
        for t in &suite.tasks {
            let names: HashSet<_> = t.tables.iter().map(|t| &t.name).collect();
            assert_eq!(names.len(), 5);
        }
        // The pool given where the suite goes: said so.
        let e = Suite::load(&dir.path().join("pool.csv"), &mem())
            .unwrap_err()
            .to_string();
        assert!(e.contains("pool CSV, not a suite JSON"), "{e}");
    }

    #[test]
    fn a_share_suite_gives_each_task_its_multiple_of_an_even_share() {
        // Tables of very different sizes: the largest alone is more than
        // an even share over 8 devices.
        let pool: Vec<Table> = (0..20)
            .map(|i| table(&format!("t{i}"), 1000 * (i + 1) * (i + 1), 16, 1.0))
            .collect();
        let spec = |devices, share| SuiteSpec {
            name: "s".into(),
            tables_per_task: 6,
            devices,
            memory: SuiteMemory::Share(share),
            tasks: 10,
        };
        for (devices, share) in [(2, 1.1), (3, 1.5), (8, 1.0)] {
            let file = generate(&spec(devices, share), &pool, "pool.csv", &mem(), 3).unwrap();
            for t in &file.tasks {
                let bytes: Vec<u64> = t
                    .tables
                    .iter()
                    .map(|n| mem().table_bytes(pool.iter().find(|p| &p.name == n).unwrap()))
                    .collect();
                let even = bytes.iter().sum::<u64>() as f64 / devices as f64;
                let largest = *bytes.iter().max().unwrap() as f64;
                let cap = t.memory_gb * BYTES_PER_GB;
                let want = (share * even).max(largest);
                assert!(cap >= want && cap <= want + 2.0, "{cap} against {want}");
                // Each task has a plan that fits.
                let tables: Vec<Table> = t
                    .tables
                    .iter()
                    .map(|n| pool.iter().find(|p| &p.name == n).unwrap().clone())
                    .collect();
                assert!(first_fit_decreasing(&tables, devices, cap as u64, &mem()).is_some());
            }
        }
        // Three equal tables on two devices at exactly an even share (1.5
        // tables a device) never fit: the error says what to raise.
        let equal: Vec<Table> = (0..6)
            .map(|i| table(&format!("e{i}"), 5000, 16, 1.0))
            .collect();
        let three = SuiteSpec {
            tables_per_task: 3,
            ..spec(2, 1.0)
        };
        let e = generate(&three, &equal, "pool.csv", &mem(), 3).unwrap_err();
        assert!(e.to_string().contains("raise memory_share"), "{e}");
        let three = SuiteSpec {
            memory: SuiteMemory::Share(1.34),
            ..three
        };
        assert!(generate(&three, &equal, "pool.csv", &mem(), 3).is_ok());
    }

    fn suite_with(dir: &Path, task: TaskSpec) -> PathBuf {
        write_pool(dir, &small_pool());
        let p = dir.join("s.json");
        write(
            &p,
            &SuiteFile {
                pool: "pool.csv".into(),
                tasks: vec![task],
            },
        )
        .unwrap();
        p
    }

    fn spec(tables: &[&str], devices: usize, memory_gb: f64) -> TaskSpec {
        TaskSpec {
            name: "x".into(),
            devices,
            memory_gb,
            tables: tables.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn rejects_unknown_and_repeated_tables() {
        let dir = tempfile::tempdir().unwrap();
        let p = suite_with(dir.path(), spec(&["t1", "nope"], 2, 1.0));
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(
            e.contains("tasks[0].tables[1]") && e.contains("nope"),
            "{e}"
        );
        let p = suite_with(dir.path(), spec(&["t1", "t1"], 2, 1.0));
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(e.contains("appears twice"), "{e}");
        // Two tasks of one name: their results could not be told apart.
        let p = dir.path().join("two.json");
        let file = SuiteFile {
            pool: "pool.csv".into(),
            tasks: vec![spec(&["t1"], 2, 1.0), spec(&["t2"], 2, 1.0)],
        };
        write(&p, &file).unwrap();
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(e.contains("tasks[1].name") && e.contains("tasks[0]"), "{e}");
        // A byte-order mark before the JSON is read past.
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"t2\"", "\"t3\"");
        let renamed = text.replacen("\"name\": \"x\"", "\"name\": \"y\"", 1);
        std::fs::write(&p, format!("\u{feff}{renamed}")).unwrap();
        assert_eq!(Suite::load(&p, &mem()).unwrap().tasks.len(), 2);
    }

    #[test]
    fn rejects_tasks_that_cannot_fit_memory() {
        let dir = tempfile::tempdir().unwrap();
        // t19 holds 20000 rows × 16 × 2 B + 4 B/row = 720 KB.
        let tiny = 0.0005;
        let p = suite_with(dir.path(), spec(&["t19"], 4, tiny));
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(
            e.contains("cannot fit memory") && e.contains("`t19`"),
            "{e}"
        );
        let p = suite_with(dir.path(), spec(&["t17", "t18", "t19"], 2, 0.0007));
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(e.contains("in all"), "{e}");
    }

    #[test]
    fn rejects_bad_devices_memory_and_missing_pool() {
        let dir = tempfile::tempdir().unwrap();
        let p = suite_with(dir.path(), spec(&["t1"], 0, 1.0));
        assert!(Suite::load(&p, &mem())
            .unwrap_err()
            .to_string()
            .contains("tasks[0].devices"));
        let p = suite_with(dir.path(), spec(&["t1"], 1 << 40, 1.0));
        assert!(Suite::load(&p, &mem())
            .unwrap_err()
            .to_string()
            .contains("tasks[0].devices"));
        let p = suite_with(dir.path(), spec(&["t1"], 2, -1.0));
        assert!(Suite::load(&p, &mem())
            .unwrap_err()
            .to_string()
            .contains("tasks[0].memory_gb"));
        std::fs::remove_file(dir.path().join("pool.csv")).unwrap();
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        assert!(e.contains("pool.csv"), "{e}");
    }

    #[test]
    fn a_missing_pool_names_the_suite_and_where_the_pool_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("suites");
        std::fs::create_dir(&sub).unwrap();
        let p = sub.join("s.json");
        write(
            &p,
            &SuiteFile {
                pool: "nothere.csv".into(),
                tasks: vec![spec(&["t1"], 2, 1.0)],
            },
        )
        .unwrap();
        let e = Suite::load(&p, &mem()).unwrap_err().to_string();
        let resolved = sub.join("nothere.csv");
        assert!(
            e.starts_with(&format!("{}: pool: ", p.display())),
            "the suite file first: {e}"
        );
        assert!(
            e.contains("`nothere.csv`") && e.contains(&resolved.display().to_string()),
            "the pool as written and where it was looked for: {e}"
        );
        assert!(e.contains("relative to the suite file's folder"), "{e}");
    }

    #[test]
    fn first_fit_decreasing_respects_the_cap() {
        let pool = small_pool();
        let cap = mem().table_bytes(&pool[19]) + 10;
        let a = first_fit_decreasing(&pool[15..], 5, cap, &mem()).unwrap();
        let plan = crate::Plan {
            devices: 5,
            assignment: a,
        };
        assert!(plan.fits(&pool[15..], &mem(), cap));
        assert!(first_fit_decreasing(&pool[15..], 2, cap, &mem()).is_none());
    }
}
