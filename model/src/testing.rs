//! Test data: `configs/small.toml` and its 20-table, 4-device suites, drawn
//! as `learner generate` draws them.

use std::path::Path;

use common::config::Config;
use common::generate::{generate_pool, split};
use common::suite::{self, SuiteSpec};
use common::Suite;

/// `configs/small.toml`.
pub(crate) fn small_config() -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/small.toml");
    Config::load(Some(&path)).unwrap()
}

/// The half (`"train"` or `"test"`) of `cfg`'s first suite, its files
/// written into `dir`.
pub(crate) fn small_suite(cfg: &Config, half: &str, dir: &Path) -> Suite {
    let seed = cfg.data.seed;
    let pool = generate_pool(&cfg.generate, seed).unwrap();
    let (train, test) = split(&pool, seed.wrapping_add(1));
    let (tables, tasks) = match half {
        "train" => (train, cfg.data.train_tasks),
        _ => (test, cfg.data.test_tasks),
    };
    let s = &cfg.data.suites[0];
    let spec = SuiteSpec {
        name: format!("{}.{half}", s.name()),
        tables_per_task: s.tables,
        devices: s.devices,
        memory: s.memory(0).unwrap(),
        tasks,
    };
    let pool_file = format!("pool.{half}.csv");
    let file = suite::generate(&spec, &tables, &pool_file, &cfg.memory, seed).unwrap();
    common::pool::write(&dir.join(&pool_file), &tables).unwrap();
    let path = dir.join(format!("{}.json", spec.name));
    suite::write(&path, &file).unwrap();
    Suite::load(&path, &cfg.memory).unwrap()
}
