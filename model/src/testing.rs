//! Test data: `configs/small.toml` and its 20-table, 4-device suites, drawn
//! as `learner generate` draws them.

use std::path::Path;

use common::config::Config;
use common::generate::{generate_pool, split};
use common::suite::{self, SuiteSpec};
use common::Suite;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use crate::model::Model;

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

/// A fresh model whose weights depend on `seed` alone.
///
/// `tch::manual_seed` seeds the one generator every test thread draws
/// from, so a model drawn after it changes when tests run in parallel.
/// This one draws each weight from its own generator instead, within the
/// bound torch's linear layers start with (`1/√fan_in`). Biases that start
/// equal (the gates' biases start at 1) keep their value.
pub(crate) fn seeded_model(cfg: &Config, seed: u64) -> Model {
    let model = Model::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for vs in [&model.policy_vs, &model.cost_vs] {
        let vars = vs.variables();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| {
            for name in names {
                let mut v = vars[name].shallow_clone();
                let equal = v.numel() > 1 && (v.max() - v.min()).double_value(&[]) == 0.0;
                if equal {
                    continue;
                }
                let weight = match name.strip_suffix(".bias") {
                    Some(stem) => &vars[&format!("{stem}.weight")],
                    None => &v,
                };
                let size = weight.size();
                let fan_in = size.get(1).copied().unwrap_or(size[0]).max(1);
                let bound = 1.0 / (fan_in as f64).sqrt();
                let values: Vec<f32> = (0..v.numel())
                    .map(|_| rng.gen_range(-bound..bound) as f32)
                    .collect();
                v.copy_(&Tensor::from_slice(&values).view(v.size().as_slice()));
            }
        });
    }
    model
}
