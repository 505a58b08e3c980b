//! Generates the default data: a DLRM-like pool (or the user's own, from
//! `data.pool`), its 50/50 train/test split, and every configured suite for
//! both halves, under one folder:
//!
//! ```text
//! DIR/pool.csv  pool.train.csv  pool.test.csv  pool.stats.txt
//! DIR/dlrm-50x4.train.json  dlrm-50x4.test.json  …
//! ```
//!
//! The same configuration and seed give byte-identical files, so running it
//! again is harmless.

use std::path::{Path, PathBuf};

use common::config::Config;
use common::generate::{generate_pool, split, stats, PoolStats};
use common::suite::{self, SuiteSpec};
use common::{pool, Result};

/// What was written.
#[derive(Debug)]
pub struct Generated {
    pub stats: PoolStats,
    pub suites: Vec<PathBuf>,
}

pub fn generate(cfg: &Config, dir: &Path) -> Result<Generated> {
    let seed = cfg.data.seed;
    let tables = match &cfg.data.pool {
        Some(path) => pool::read(path)?,
        None => generate_pool(&cfg.generate, seed).map_err(|e| common::Error::Infeasible {
            context: "generating the pool".into(),
            message: e.to_string(),
        })?,
    };
    let (train, test) = split(&tables, seed.wrapping_add(1));
    // With the user's pool, a suite that cannot be drawn says where its
    // tables came from.
    let from_pool = |e: common::Error| match (&cfg.data.pool, e) {
        (Some(path), common::Error::Infeasible { context, message }) => common::Error::Infeasible {
            context,
            message: format!(
                "{message} (data.pool = {}: {} tables, {} for training and {} for testing)",
                path.display(),
                tables.len(),
                train.len(),
                test.len()
            ),
        },
        (_, e) => e,
    };
    // Every suite is drawn before any file is written: a suite that cannot
    // be drawn leaves the folder as it was.
    let mut files = Vec::new();
    for (i, s) in cfg.data.suites.iter().enumerate() {
        let memory = s.memory(i).map_err(|e| common::Error::Infeasible {
            context: "the configuration".into(),
            message: e.to_string(),
        })?;
        for (half, tables, n) in [
            ("train", &train, cfg.data.train_tasks),
            ("test", &test, cfg.data.test_tasks),
        ] {
            let spec = SuiteSpec {
                name: format!("{}.{half}", s.name()),
                tables_per_task: s.tables,
                devices: s.devices,
                memory,
                tasks: n,
            };
            let file = suite::generate(
                &spec,
                tables,
                &format!("pool.{half}.csv"),
                &cfg.memory,
                seed,
            )
            .map_err(from_pool)?;
            files.push((dir.join(format!("{}.json", spec.name)), file));
        }
    }
    pool::write(&dir.join("pool.csv"), &tables)?;
    pool::write(&dir.join("pool.train.csv"), &train)?;
    pool::write(&dir.join("pool.test.csv"), &test)?;
    let mut stats = stats(&tables, cfg.generate.batch, &cfg.memory);
    stats.generated = cfg.data.pool.is_none();
    common::fs::write_atomic(&dir.join("pool.stats.txt"), stats.to_string().as_bytes())?;
    let mut suites = Vec::new();
    for (path, file) in files {
        suite::write(&path, &file)?;
        suites.push(path);
    }
    Ok(Generated { stats, suites })
}

/// The training tasks: `train.suite`'s, then each of `train.extra_suites`'.
/// An error names the setting that gave the suite.
pub fn train_tasks(cfg: &Config) -> anyhow::Result<Vec<common::Task>> {
    use anyhow::Context as _;
    let mut tasks = Vec::new();
    let extra = cfg.train.extra_suites.iter().enumerate();
    let suites = std::iter::once(("train.suite".to_string(), &cfg.train.suite))
        .chain(extra.map(|(i, p)| (format!("train.extra_suites[{i}]"), p)));
    for (key, path) in suites {
        let loaded = common::Suite::load(path, &cfg.memory).with_context(|| {
            let dir = cfg.data.dir.display();
            let relative = common::fs::relative_hint(path);
            let hint = if path.exists() {
                String::new()
            } else if path.starts_with(&cfg.data.dir) {
                format!(
                    " (`learner generate --config` with this configuration writes its suites \
                     into data.dir = {dir}{relative})"
                )
            } else {
                format!(
                    " (`learner generate` writes suites into data.dir = {dir}, or into its \
                     --out folder: set {key} to one of them{relative})"
                )
            };
            format!("{key} = {}{hint}", path.display())
        })?;
        tasks.extend(loaded.tasks);
    }
    Ok(tasks)
}

/// The tasks rollouts place: the training tasks, then
/// `train.tight_memory` tight copies of each (less memory per device, see
/// [`tight_copy`]), then `train.reshape_copies` reshaped copies of each
/// (another device count, see [`reshaped_copy`]). Measured plans are of
/// the training tasks alone.
pub fn rollout_tasks(tasks: &[common::Task], cfg: &Config) -> Vec<common::Task> {
    type MakeCopy = fn(&common::Task, usize, usize, &Config) -> Option<common::Task>;
    let kinds: [(usize, MakeCopy); 2] = [
        (cfg.train.tight_memory, tight_copy),
        (cfg.train.reshape_copies, reshaped_copy),
    ];
    let mut all = tasks.to_vec();
    for (copies, make) in kinds {
        for copy in 0..copies {
            all.extend(
                tasks
                    .iter()
                    .enumerate()
                    .filter_map(|(k, task)| make(task, k, copy, cfg)),
            );
        }
    }
    all
}

/// A number drawn from `[low, high]` for copy `copy` of training task
/// `k`, uniformly or log-uniformly: seeded by `train.seed`, `k`, `copy`
/// and what the copy is for (`kind`).
fn copy_draw(
    cfg: &Config,
    (k, copy, kind): (usize, usize, &[u8]),
    [low, high]: [f64; 2],
    log_uniform: bool,
) -> f64 {
    use rand::{Rng, SeedableRng};
    if high <= low {
        return low;
    }
    let mut seed = Vec::with_capacity(24 + kind.len());
    for n in [cfg.train.seed, k as u64, copy as u64] {
        seed.extend_from_slice(&n.to_le_bytes());
    }
    seed.extend_from_slice(kind);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(common::fs::fnv1a(&seed));
    if log_uniform {
        rng.gen_range(low.ln()..=high.ln()).exp()
    } else {
        rng.gen_range(low..=high)
    }
}

/// Copy `copy` of training task `k` on another number of devices: its
/// tables per device at a multiple of the task's drawn log-uniformly from
/// `train.reshape_density`, rounded to a device count of at least 2 and at
/// most one per table. Memory per device stays the same multiple of an
/// even share of the tables' memory. `None` when the count comes out as
/// the task's own, or the task has a single table.
pub fn reshaped_copy(
    task: &common::Task,
    k: usize,
    copy: usize,
    cfg: &Config,
) -> Option<common::Task> {
    let factor = copy_draw(cfg, (k, copy, b"reshape"), cfg.train.reshape_density, true);
    let most = task.tables.len();
    if most < 2 {
        return None;
    }
    let devices = ((task.devices as f64 / factor).round() as usize).clamp(2, most);
    if devices == task.devices {
        return None;
    }
    let bytes: u64 = task.tables.iter().map(|t| cfg.memory.table_bytes(t)).sum();
    let even = bytes as f64 / task.devices.max(1) as f64;
    let slack = (task.cap_bytes() as f64 / even.max(1.0)).max(1.0);
    Some(common::Task {
        name: common::Task::reshaped_copy_name(&task.name, copy),
        devices,
        memory_gb: common::suite::share_memory_gb(&task.tables, devices, slack, &cfg.memory),
        tables: task.tables.clone(),
    })
}

/// Copy `copy` of training task `k` with memory per device at a multiple
/// of an even share of its tables' memory, drawn from
/// `train.tight_memory_slack` (seeded by `train.seed`, `k` and `copy`), and
/// never under its largest table; `None` when that is not below the
/// task's own memory.
pub fn tight_copy(
    task: &common::Task,
    k: usize,
    copy: usize,
    cfg: &Config,
) -> Option<common::Task> {
    let slack = copy_draw(cfg, (k, copy, b""), cfg.train.tight_memory_slack, false);
    let tight = common::Task {
        name: common::Task::tight_copy_name(&task.name, copy),
        devices: task.devices,
        memory_gb: common::suite::share_memory_gb(&task.tables, task.devices, slack, &cfg.memory),
        tables: task.tables.clone(),
    };
    (tight.cap_bytes() < task.cap_bytes()).then_some(tight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::config::SuiteConfig;

    #[test]
    fn tight_copies_have_less_memory_but_room_for_every_table() {
        let pool = generate_pool(&Config::default().generate, 3).unwrap();
        let mem = common::MemoryModel::default();
        let task = |k: usize, memory_gb: f64| common::Task {
            name: format!("t{k}"),
            devices: 4,
            memory_gb,
            tables: pool[k * 40..(k + 1) * 40].to_vec(),
        };
        let tasks: Vec<_> = (0..6).map(|k| task(k, 1000.0)).collect();
        let mut cfg = Config::default();
        assert_eq!(rollout_tasks(&tasks, &cfg), tasks, "none by default");
        cfg.train.tight_memory = 2;
        let all = rollout_tasks(&tasks, &cfg);
        assert_eq!(all.len(), 18);
        assert_eq!(all[..6], tasks[..], "the training tasks come first");
        let [low, high] = cfg.train.tight_memory_slack;
        let mut slacks = Vec::new();
        for (i, copy) in all[6..].iter().enumerate() {
            let of = &tasks[i % 6];
            assert_eq!((&copy.tables, copy.devices), (&of.tables, of.devices));
            assert!(copy.is_rollout_copy() && !of.is_rollout_copy());
            assert!(copy.memory_gb < of.memory_gb);
            let bytes: Vec<u64> = of.tables.iter().map(|t| mem.table_bytes(t)).collect();
            let largest = *bytes.iter().max().unwrap();
            assert!(
                copy.cap_bytes() >= largest,
                "{}: the largest table fits",
                copy.name
            );
            assert_eq!(copy.infeasibility(&mem), None, "{}", copy.name);
            let share = bytes.iter().sum::<u64>() as f64 / 4.0;
            let slack = copy.cap_bytes() as f64 / share;
            // Drawn from the slack's range, unless the largest table
            // needs more.
            let at_largest = copy.cap_bytes() <= largest + 1;
            assert!(
                at_largest || (low - 1e-6..=high + 1e-6).contains(&slack),
                "{}: {slack}",
                copy.name
            );
            slacks.push(slack);
        }
        // Drawn, not one value; the same seed draws the same copies.
        assert!(slacks.iter().any(|&s| (s - slacks[0]).abs() > 1e-3));
        assert_eq!(rollout_tasks(&tasks, &cfg), all);
        cfg.train.seed = 1;
        assert_ne!(rollout_tasks(&tasks, &cfg), all);
        // A task already tighter than any copy gets none.
        let tight = vec![task(0, 1e-3)];
        assert_eq!(rollout_tasks(&tight, &cfg), tight);
    }

    #[test]
    fn reshaped_copies_place_the_same_tables_at_other_densities() {
        let pool = generate_pool(&Config::default().generate, 5).unwrap();
        let mem = common::MemoryModel::default();
        let tasks: Vec<_> = (0..8)
            .map(|k| {
                let tables = pool[k * 48..(k + 1) * 48].to_vec();
                common::Task {
                    name: format!("t{k}"),
                    devices: 6,
                    memory_gb: suite::share_memory_gb(&tables, 6, 1.3, &mem),
                    tables,
                }
            })
            .collect();
        let mut cfg = Config::default();
        cfg.train.reshape_copies = 2;
        cfg.train.reshape_density = [0.5, 3.0];
        let all = rollout_tasks(&tasks, &cfg);
        assert_eq!(all[..8], tasks[..], "the training tasks come first");
        assert!(all.len() > 8);
        let mut counts = std::collections::BTreeSet::new();
        let mut slacks = Vec::new();
        for copy in &all[8..] {
            let of = tasks
                .iter()
                .find(|t| copy.name.starts_with(&t.name))
                .unwrap();
            assert!(copy.is_rollout_copy() && !of.is_rollout_copy());
            assert_eq!(copy.tables, of.tables);
            assert_ne!(copy.devices, of.devices, "{}", copy.name);
            // 48 tables on 6 devices at 0.5 to 3 times 8 per device: 2 to
            // 12 devices.
            assert!((2..=12).contains(&copy.devices), "{}", copy.devices);
            counts.insert(copy.devices);
            // The task's multiple of an even share of memory per device,
            // unless the largest table needs more.
            let bytes: Vec<u64> = copy.tables.iter().map(|t| mem.table_bytes(t)).collect();
            let largest = *bytes.iter().max().unwrap();
            let total = bytes.iter().sum::<u64>() as f64;
            let slack = |t: &common::Task| t.cap_bytes() as f64 * t.devices as f64 / total;
            let at_largest = copy.cap_bytes() <= largest + 1;
            assert!(
                at_largest || (slack(copy) / slack(of) - 1.0).abs() < 1e-3,
                "{}: {} against {}",
                copy.name,
                slack(copy),
                slack(of)
            );
            slacks.push(slack(of));
            assert!(copy.cap_bytes() >= largest, "{}", copy.name);
            assert_eq!(copy.infeasibility(&mem), None, "{}", copy.name);
        }
        assert!(counts.len() > 2, "drawn, not one count: {counts:?}");
        // The tasks' own multiples differ (some set by a large table).
        assert!(
            slacks.iter().any(|&s| (s - slacks[0]).abs() > 0.1),
            "{slacks:?}"
        );
        assert_eq!(
            rollout_tasks(&tasks, &cfg),
            all,
            "the same seed, the same copies"
        );
        cfg.train.seed = 1;
        assert_ne!(rollout_tasks(&tasks, &cfg), all);
        // Never one device, nor more devices than tables.
        cfg.train.reshape_density = [0.01, 100.0];
        for copy in &rollout_tasks(&tasks, &cfg)[8..] {
            assert!((2..=48).contains(&copy.devices), "{}", copy.devices);
        }
        // A single table has no other device count to go to.
        let single = vec![common::Task {
            tables: tasks[0].tables[..1].to_vec(),
            ..tasks[0].clone()
        }];
        assert_eq!(rollout_tasks(&single, &cfg), single);
    }

    #[test]
    fn generates_loadable_disjoint_suites_reproducibly() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.generate.tables = 120;
        cfg.data.train_tasks = 3;
        cfg.data.test_tasks = 2;
        cfg.data.suites = vec![
            SuiteConfig {
                tables: 10,
                devices: 2,
                memory_gb: Some(50.0),
                memory_share: None,
            },
            SuiteConfig {
                tables: 10,
                devices: 2,
                memory_gb: None,
                memory_share: Some(1.2),
            },
        ];
        let g = generate(&cfg, dir.path()).unwrap();
        assert_eq!(g.suites.len(), 4);
        // The second suite's tasks each get memory of their own: a fifth
        // above an even share of their tables', or their largest table.
        assert!(g.suites[2].ends_with("dlrm-10x2-share1.2.train.json"));
        let tight = common::Suite::load(&g.suites[3], &cfg.memory).unwrap();
        for t in &tight.tasks {
            let bytes: Vec<u64> = t.tables.iter().map(|x| cfg.memory.table_bytes(x)).collect();
            let want = (1.2 * bytes.iter().sum::<u64>() as f64 / 2.0)
                .max(*bytes.iter().max().unwrap() as f64);
            let cap = t.cap_bytes() as f64;
            assert!(
                cap >= want && cap < want + 2.0,
                "{}: {cap} against {want}",
                t.name
            );
        }
        let train = common::Suite::load(&g.suites[0], &cfg.memory).unwrap();
        let test = common::Suite::load(&g.suites[1], &cfg.memory).unwrap();
        assert_eq!((train.tasks.len(), test.tasks.len()), (3, 2));
        let train_pool = pool::read(&dir.path().join("pool.train.csv")).unwrap();
        for t in test.tasks.iter().flat_map(|t| &t.tables) {
            assert!(!train_pool.iter().any(|u| u.name == t.name));
        }
        let before = std::fs::read(&g.suites[1]).unwrap();
        generate(&cfg, dir.path()).unwrap();
        assert_eq!(before, std::fs::read(&g.suites[1]).unwrap());
    }

    #[test]
    fn a_suite_that_cannot_be_drawn_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.generate.tables = 120;
        cfg.data.suites = vec![SuiteConfig {
            tables: 10,
            devices: 2,
            memory_gb: Some(1e-6),
            memory_share: None,
        }];
        let e = generate(&cfg, dir.path()).unwrap_err().to_string();
        assert!(e.contains("dlrm-10x2.train") && e.contains("draws"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Every shipped configuration parses, and trains on suites that its
    /// own data section generates (in its data folder).
    #[test]
    fn the_shipped_configs_train_on_suites_they_generate() {
        let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&configs).unwrap() {
            let path = entry.unwrap().path();
            let cfg = Config::load(Some(&path)).unwrap();
            let generated: Vec<PathBuf> = cfg
                .data
                .suites
                .iter()
                .map(|s| cfg.data.dir.join(format!("{}.train.json", s.name())))
                .collect();
            for suite in std::iter::once(&cfg.train.suite).chain(&cfg.train.extra_suites) {
                assert!(
                    generated.contains(suite),
                    "{}: {} is not among the suites it generates ({generated:?})",
                    path.display(),
                    suite.display()
                );
            }
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "default.toml",
                "mixed.toml",
                "pretrain-second-opinion.toml",
                "pretrain.toml",
                "small.toml"
            ]
        );
    }
}
