//! Generates the default data: a DLRM-like pool, its 50/50 train/test split,
//! and every configured suite for both halves, under one folder:
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
    let tables =
        generate_pool(&cfg.generate, seed).map_err(|message| common::Error::Infeasible {
            context: "generating the pool".into(),
            message,
        })?;
    let (train, test) = split(&tables, seed.wrapping_add(1));
    pool::write(&dir.join("pool.csv"), &tables)?;
    pool::write(&dir.join("pool.train.csv"), &train)?;
    pool::write(&dir.join("pool.test.csv"), &test)?;
    let stats = stats(&tables, cfg.generate.batch, &cfg.memory);
    common::fs::write_atomic(&dir.join("pool.stats.txt"), stats.to_string().as_bytes())?;
    let mut suites = Vec::new();
    for s in &cfg.data.suites {
        for (half, tables, n) in [
            ("train", &train, cfg.data.train_tasks),
            ("test", &test, cfg.data.test_tasks),
        ] {
            let spec = SuiteSpec {
                name: format!("{}.{half}", s.name()),
                tables_per_task: s.tables,
                devices: s.devices,
                memory_gb: s.memory_gb,
                tasks: n,
            };
            let file = suite::generate(
                &spec,
                tables,
                &format!("pool.{half}.csv"),
                &cfg.memory,
                seed,
            )?;
            let path = dir.join(format!("{}.json", spec.name));
            suite::write(&path, &file)?;
            suites.push(path);
        }
    }
    Ok(Generated { stats, suites })
}

/// The training tasks: `train.suite`'s, then each of `train.extra_suites`'.
pub fn train_tasks(cfg: &Config) -> Result<Vec<common::Task>> {
    let mut tasks = Vec::new();
    for path in std::iter::once(&cfg.train.suite).chain(&cfg.train.extra_suites) {
        tasks.extend(common::Suite::load(path, &cfg.memory)?.tasks);
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::config::SuiteConfig;

    #[test]
    fn generates_loadable_disjoint_suites_reproducibly() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.generate.tables = 120;
        cfg.data.train_tasks = 3;
        cfg.data.test_tasks = 2;
        cfg.data.suites = vec![SuiteConfig {
            tables: 10,
            devices: 2,
            memory_gb: 50.0,
        }];
        let g = generate(&cfg, dir.path()).unwrap();
        assert_eq!(g.suites.len(), 2);
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
        assert_eq!(names, ["default.toml", "mixed.toml", "small.toml"]);
    }
}
