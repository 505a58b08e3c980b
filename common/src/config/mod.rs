//! The configuration file (`configs/*.toml`), resolved once into validated
//! types: every section is optional, every field has a default, unknown
//! fields are refused, and an out-of-range value fails with its field name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, InvalidSetting, Result};
use crate::generate::PoolGenConfig;
use crate::table::MemoryModel;

mod data;
mod model;
mod oracles;
mod train;

pub use data::{DataConfig, EvalConfig, SuiteConfig};
pub use model::{CostLoss, CostWork, ModelConfig, OverallCost};
pub use oracles::{CpuConfig, CudaConfig, Kernel, SimConfig};
pub use train::{DecayTo, PretrainConfig, RewardScale, TrainConfig, Update};

/// The measuring backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Deterministic model of a GPU (fast; for tests, laptops and training).
    Sim,
    /// Real fused lookups on this machine's CPU: FBGEMM's table-batched
    /// kernel (`cpu.kernel`), or libtorch's `embedding_bag`.
    Cpu,
    /// Real fused lookups on this host's GPUs with NCCL all-to-all (a
    /// benchworker built with `--features cuda`; docs/gpu.md).
    Cuda,
}

impl Backend {
    /// Its name on the command line and in a run's `config.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// How the learner, actors and benchworkers work together (DESIGN §3, §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Actor threads the learner starts beside itself; with 0 actor
    /// threads, 0 benchworker threads and no remote peers (`--bind`), it
    /// runs Algorithm 1 in its own thread alone (slower, reproducible).
    pub actors: usize,
    /// Benchworker threads the learner starts beside itself.
    pub benchworkers: usize,
    /// Unrolls an actor may have in flight (credits).
    pub actor_credits: usize,
    /// Unrolls acted with weights more than this many versions old are
    /// dropped and counted. No more than this many unrolls are in flight
    /// over all actors at once (credits held, unrolls queued): more would
    /// be that old by the time the learner reached them, so actors beyond
    /// that wait their turn for a credit (0: one unroll in flight).
    pub max_policy_lag: usize,
    /// Seconds between heartbeats, both ways.
    pub heartbeat_s: f64,
    /// A peer silent this long is gone: its job goes to another one. A peer
    /// that hears nothing from the learner this long says hello again.
    pub peer_timeout_s: f64,
    /// A measurement not back after this long goes to another benchworker.
    pub job_timeout_s: f64,
    /// Without progress for this long (no measurement, cost step, policy
    /// update or unroll), with no measurement job out and no benchworker
    /// setting up within `job_timeout_s`, training stops with an error
    /// (after a checkpoint) instead of waiting for peers that will not come.
    pub stall_timeout_s: f64,
    /// The oracle that measures plans (`--backend`; absent: `sim`). A
    /// run's `config.toml` records the one it measures with: its cost
    /// buffer holds that oracle's measurements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            actors: 2,
            benchworkers: 1,
            actor_credits: 2,
            max_policy_lag: 8,
            heartbeat_s: 1.0,
            peer_timeout_s: 10.0,
            job_timeout_s: 600.0,
            stall_timeout_s: 120.0,
            backend: None,
        }
    }
}

impl ClusterConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("cluster.actor_credits", self.actor_credits as f64)?;
        seconds("cluster.heartbeat_s", self.heartbeat_s)?;
        seconds("cluster.job_timeout_s", self.job_timeout_s)?;
        seconds("cluster.peer_timeout_s", self.peer_timeout_s)?;
        seconds("cluster.stall_timeout_s", self.stall_timeout_s)?;
        if self.peer_timeout_s < 2.0 * self.heartbeat_s {
            return Err(InvalidSetting::new(
                "cluster.peer_timeout_s",
                format!(
                    "cluster.peer_timeout_s ({}) must be at least twice cluster.heartbeat_s ({})",
                    self.peer_timeout_s, self.heartbeat_s
                ),
            ));
        }
        Ok(())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub memory: MemoryModel,
    pub sim: SimConfig,
    pub cpu: CpuConfig,
    pub cuda: CudaConfig,
    pub generate: PoolGenConfig,
    pub data: DataConfig,
    pub eval: EvalConfig,
    pub model: ModelConfig,
    pub train: TrainConfig,
    /// Only `learner pretrain` reads it; left out of a file while default.
    #[serde(skip_serializing_if = "PretrainConfig::is_default")]
    pub pretrain: PretrainConfig,
}

impl Config {
    /// Its file paths (`data.dir`, `data.pool`, `train.suite`,
    /// `train.extra_suites`, `train.init`) made absolute against `base`, the folder they
    /// were relative to: a run's `config.toml` written so resumes, `eval`
    /// and `plan` find them from any folder.
    pub fn with_absolute_paths(mut self, base: &Path) -> Config {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.data.dir);
        if let Some(pool) = &mut self.data.pool {
            fix(pool);
        }
        fix(&mut self.train.suite);
        self.train.extra_suites.iter_mut().for_each(fix);
        if let Some(init) = &mut self.train.init {
            fix(init);
        }
        self
    }

    /// Parses TOML text; `path` names the source in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if let Some(file) = cfg.sim.calibration.take() {
            let file = path.parent().unwrap_or(Path::new(".")).join(file);
            cfg.sim = calibrated(&file, &cfg.sim)?;
        }
        cfg.validate().map_err(|e| Error::Invalid {
            path: path.to_path_buf(),
            location: "config".into(),
            message: e.to_string(),
        })?;
        Ok(cfg)
    }

    /// Reads a config file, or the defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        match path {
            None => Ok(Config::default()),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
                Config::from_toml(&text, p)
            }
        }
    }

    /// Reads a run's resolved configuration (`RUN/config.toml`, which
    /// `learner train` writes whole) and warns about the settings it lacks:
    /// a run written by an older embshard, whose missing settings take
    /// today's built-in defaults.
    ///
    /// A setting whose default changed after it came in takes, where a run
    /// lacks it, what runs did before it existed: `train.measure_temperature`
    /// (1; the default is 1000 since), `cpu.kernel` and `cuda.kernel`
    /// (`torch`: a cost log keeps measurements of one kernel),
    /// `train.cost_decay_to` (`zero`).
    pub fn load_run(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut cfg = Config::from_toml(&text, path)?;
        let mut missing = missing_settings(&text);
        for m in &mut missing {
            if m.starts_with("train.measure_temperature =") {
                cfg.train.measure_temperature = 1.0;
                *m = "train.measure_temperature = 1.0 (how runs before the setting sampled)".into();
            }
            if m.starts_with("train.cost_decay_to =") {
                cfg.train.cost_decay_to = train::DecayTo::Zero;
                *m =
                    "train.cost_decay_to = \"zero\" (where runs before the setting decayed)".into();
            }
            for (key, kernel) in [("cpu", &mut cfg.cpu.kernel), ("cuda", &mut cfg.cuda.kernel)] {
                if m.starts_with(&format!("{key}.kernel =")) {
                    *kernel = Kernel::Torch;
                    *m = format!(
                        "{key}.kernel = \"torch\" (the kernel runs before the setting measured with)"
                    );
                }
            }
        }
        if !missing.is_empty() {
            const SHOWN: usize = 6;
            let mut named: Vec<String> = missing.iter().take(SHOWN).cloned().collect();
            if missing.len() > SHOWN {
                named.push(format!("and {} more", missing.len() - SHOWN));
            }
            tracing::warn!(
                "{} comes from an older embshard: {} settings it lacks take these values ({}); \
                 if the run was trained otherwise, write its values into the file",
                path.display(),
                missing.len(),
                named.join(", ")
            );
        }
        Ok(cfg)
    }

    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        self.cluster.validate()?;
        self.sim.validate()?;
        self.cpu.validate()?;
        self.cuda.validate()?;
        self.generate.validate()?;
        self.data.validate()?;
        self.model.validate()?;
        self.train.validate()?;
        self.pretrain.validate()?;
        // Step rewards come from the composed iteration cost; REINFORCE
        // uses neither them nor λ.
        if self.train.step_rewards && self.model.overall_cost != OverallCost::Composed {
            return Err(InvalidSetting::new(
                "train.step_rewards",
                "train.step_rewards needs model.overall_cost = \"composed\" (a step's \
                        added cost is the composed iteration cost's)",
            ));
        }
        if self.train.update == Update::Reinforce
            && (self.train.step_rewards || self.train.lambda != 1.0)
        {
            return Err(InvalidSetting::new(
                "train.step_rewards",
                "train.step_rewards and train.lambda are V-trace's: with train.update = \
                        \"reinforce\" leave them at false and 1",
            ));
        }
        Ok(())
    }
}

/// The settings that TOML `text` leaves out, as `section.key = default`
/// (empty when the text does not parse: parsing reports that).
pub fn missing_settings(text: &str) -> Vec<String> {
    fn walk(all: &toml::Table, given: Option<&toml::Table>, prefix: &str, out: &mut Vec<String>) {
        for (key, value) in all {
            let name = format!("{prefix}{key}");
            let there = given.and_then(|g| g.get(key));
            match value {
                toml::Value::Table(sub) => walk(
                    sub,
                    there.and_then(|t| t.as_table()),
                    &format!("{name}."),
                    out,
                ),
                _ if there.is_none() => out.push(format!("{name} = {value}")),
                _ => {}
            }
        }
    }
    let (Ok(given), Ok(all)) = (
        text.parse::<toml::Table>(),
        toml::Table::try_from(Config::default()),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&all, Some(&given), "", &mut out);
    out
}

/// Most samples a batch may have: 64 times DLRM's 65536. Costs modelled or
/// measured far beyond it teach nothing and take memory without bound (a
/// `sim.batch` of 1e18 made costs of 5e13 ms).
pub const MAX_BATCH: u64 = 1 << 22;

/// A batch size: positive, and at most [`MAX_BATCH`].
fn batch(field: &str, v: u64) -> std::result::Result<(), InvalidSetting> {
    positive(field, v as f64)?;
    if v > MAX_BATCH {
        return Err(InvalidSetting::new(
            field,
            format!("{field} = {v} is more than the {MAX_BATCH} samples a batch may have"),
        ));
    }
    Ok(())
}

fn positive(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must be a positive number"),
        ))
    }
}

/// A duration in seconds that libstd can hold and a peer can wait: from a
/// millisecond to about eleven days.
fn seconds(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if (1e-3..=1e6).contains(&v) {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must lie in [0.001, 1000000] seconds"),
        ))
    }
}

fn non_negative(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must be a non-negative number"),
        ))
    }
}

fn unit(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must lie in (0, 1]"),
        ))
    }
}

/// A share: from 0 to 1, both included.
fn share(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must lie in [0, 1]"),
        ))
    }
}

/// What `benchworker calibrate` writes: the fitted `[sim]` constants, and
/// how well they fit (for the reader).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub sim: SimConfig,
    #[serde(default)]
    pub fit: toml::Table,
}

/// `sim`'s constants from the calibration `file`, with `now`'s noise and
/// seed (the calibration fits the model, not the run).
fn calibrated(file: &Path, now: &SimConfig) -> Result<SimConfig> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    let c: Calibration = toml::from_str(&text).map_err(|e| Error::Parse {
        path: file.to_path_buf(),
        message: e.to_string(),
    })?;
    check_calibration(file, &c.sim)?;
    Ok(SimConfig {
        noise: now.noise,
        seed: now.seed,
        calibration: None,
        ..c.sim
    })
}

/// A calibration names no further file and holds valid constants.
fn check_calibration(file: &Path, sim: &SimConfig) -> Result<()> {
    let invalid = |message: String| Error::Invalid {
        path: file.to_path_buf(),
        location: "calibration".into(),
        message,
    };
    if sim.calibration.is_some() {
        return Err(invalid(
            "a calibration cannot name another calibration".into(),
        ));
    }
    sim.validate().map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config's `[sim] calibration` replaces its constants (not its noise
    /// and seed) with the file's, found beside the config; the config read
    /// names no file any more. A missing or bad file is an error naming it.
    #[test]
    fn a_calibration_replaces_sims_constants() {
        let dir = tempfile::tempdir().unwrap();
        let fitted = SimConfig {
            batch: 2048,
            hbm_gibps: 12.5,
            noise: 0.3,
            ..SimConfig::default()
        };
        let file = Calibration {
            sim: fitted.clone(),
            fit: toml::Table::new(),
        };
        std::fs::write(dir.path().join("cal.toml"), toml::to_string(&file).unwrap()).unwrap();
        let cfg_path = dir.path().join("c.toml");
        let text = "[sim]\ncalibration = \"cal.toml\"\nnoise = 0.1\nseed = 4\n";
        let cfg = Config::from_toml(text, &cfg_path).unwrap();
        assert_eq!((cfg.sim.batch, cfg.sim.hbm_gibps), (2048, 12.5));
        assert_eq!((cfg.sim.noise, cfg.sim.seed), (0.1, 4));
        assert_eq!(cfg.sim.calibration, None);
        assert!(!toml::to_string(&cfg).unwrap().contains("calibration"));
        let missing = "[sim]\ncalibration = \"nope.toml\"\n";
        let e = Config::from_toml(missing, &cfg_path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.toml"), "{e}");
        let bad = Calibration {
            sim: SimConfig {
                hbm_gibps: -1.0,
                ..fitted
            },
            fit: toml::Table::new(),
        };
        std::fs::write(dir.path().join("cal.toml"), toml::to_string(&bad).unwrap()).unwrap();
        let e = Config::from_toml(text, &cfg_path).unwrap_err().to_string();
        assert!(e.contains("cal.toml") && e.contains("sim.hbm_gibps"), "{e}");
    }

    #[test]
    fn a_setting_that_cannot_work_is_named_by_its_key() {
        let mut cfg = Config::default();
        cfg.train.lambda = 0.0;
        let e = cfg.validate().unwrap_err();
        assert_eq!(e.key, "train.lambda");
        assert!(e.to_string().starts_with("train.lambda = 0 "), "{e}");
        let mut cfg = Config::default();
        cfg.data.suites[1].devices = 0;
        assert_eq!(cfg.validate().unwrap_err().key, "data.suites[1].devices");
        let mut cfg = Config::default();
        cfg.cluster.heartbeat_s = 0.0;
        assert_eq!(cfg.validate().unwrap_err().key, "cluster.heartbeat_s");
    }

    #[test]
    fn a_runs_paths_are_made_absolute_and_others_kept() {
        let mut cfg = Config::default();
        cfg.data.pool = Some(PathBuf::from("mine.csv"));
        cfg.train.extra_suites = vec![PathBuf::from("/abs/s.json"), PathBuf::from("x/s.json")];
        let cfg = cfg.with_absolute_paths(Path::new("/work/here"));
        assert_eq!(cfg.data.dir, Path::new("/work/here/data/generated"));
        assert_eq!(
            cfg.data.pool.as_deref(),
            Some(Path::new("/work/here/mine.csv"))
        );
        assert_eq!(
            cfg.train.suite,
            Path::new("/work/here/data/generated/dlrm-50x4.train.json")
        );
        assert_eq!(
            cfg.train.extra_suites,
            [
                PathBuf::from("/abs/s.json"),
                PathBuf::from("/work/here/x/s.json")
            ]
        );
    }

    #[test]
    fn the_shipped_default_config_spells_out_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/default.toml");
        let mut c = Config::load(Some(&path)).unwrap();
        // The four fields the main job sets: it also trains on 8-device
        // tasks, fine-tunes the shipped model, updates with REINFORCE, and
        // rolls out on reshaped copies of its tasks.
        assert_eq!(
            c.train.extra_suites,
            [PathBuf::from("data/generated/dlrm-100x8.train.json")]
        );
        assert_eq!(c.train.init, Some(PathBuf::from("models/pretrained")));
        assert_eq!(c.train.update, train::Update::Reinforce);
        assert_eq!(c.train.reshape_copies, 1);
        c.train.extra_suites.clear();
        c.train.init = None;
        c.train.update = train::Update::Vtrace;
        c.train.reshape_copies = 0;
        assert_eq!(c, Config::default());
    }

    #[test]
    fn the_mixed_config_is_the_main_job_with_denser_tasks_added() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let main = Config::load(Some(&dir.join("default.toml"))).unwrap();
        let mut mixed = Config::load(Some(&dir.join("mixed.toml"))).unwrap();
        let mut want = main.train.extra_suites.clone();
        want.push(PathBuf::from("data/generated/dlrm-100x4.train.json"));
        assert_eq!(mixed.train.extra_suites, want);
        mixed.train.extra_suites.pop();
        assert_eq!(
            mixed, main,
            "mixed.toml differs from the main job elsewhere"
        );
    }

    /// Batches and pools without bound are refused, naming the setting.
    #[test]
    fn batches_and_pools_have_upper_bounds() {
        let path = Path::new("c.toml");
        for (text, words) in [
            (
                "[sim]\nbatch = 1000000000000000000\n",
                "sim.batch = 1000000000000000000 is more",
            ),
            ("[cpu]\nbatch = 8388608\n", "cpu.batch"),
            ("[cuda]\nbatch = 8388608\n", "cuda.batch"),
            ("[generate]\nbatch = 8388608\n", "generate.batch"),
            ("[generate]\ntables = 100000000\n", "generate.tables"),
            (
                "[model]\ncost_head_gates = 257\n",
                "model.cost_head_gates = 257 must lie in 0..=256",
            ),
            (
                "[train]\nmeasure_per_iteration = 1000001\n",
                "train.measure_per_iteration = 1000001 must lie in 1..=1000000",
            ),
        ] {
            let e = Config::from_toml(text, path).unwrap_err().to_string();
            assert!(e.contains(words), "{words:?} not in {e}");
        }
        assert!(Config::from_toml("[sim]\nbatch = 4194304\n", path).is_ok());
        assert!(Config::from_toml("[model]\ncost_head_gates = 256\n", path).is_ok());
        assert!(Config::from_toml("[train]\nmeasure_per_iteration = 1000000\n", path).is_ok());
    }

    #[test]
    fn a_run_from_before_measure_temperature_keeps_sampling_as_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let whole = toml::to_string(&Config::default()).unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(
            Config::load_run(&path).unwrap().train.measure_temperature,
            1000.0
        );
        // The whole config but the lines that start with `key =`.
        let without = |key: &str| -> String {
            let lines = whole
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} =")));
            lines.map(|l| format!("{l}\n")).collect()
        };
        let older = without("measure_temperature");
        std::fs::write(&path, older).unwrap();
        assert_eq!(
            Config::load_run(&path).unwrap().train.measure_temperature,
            1.0
        );
        // A run from before cpu.kernel measured with libtorch's kernel, and
        // goes on so; one that names its kernel keeps it.
        let run = Config::load_run(&path).unwrap();
        assert_eq!(
            (run.cpu.kernel, run.cuda.kernel),
            (Kernel::Fbgemm, Kernel::Fbgemm)
        );
        let older = without("kernel");
        std::fs::write(&path, older).unwrap();
        let run = Config::load_run(&path).unwrap();
        assert_eq!(
            (run.cpu.kernel, run.cuda.kernel),
            (Kernel::Torch, Kernel::Torch)
        );
        // A default config written out reads back the same, suites with a
        // memory share included.
        assert_eq!(Config::from_toml(&whole, &path).unwrap(), Config::default());
    }

    #[test]
    fn the_settings_a_run_config_lacks_are_named_with_their_defaults() {
        let whole = toml::to_string(&Config::default()).unwrap();
        assert_eq!(missing_settings(&whole), Vec::<String>::new());
        // The shipped default spells out every setting.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/default.toml");
        let shipped = std::fs::read_to_string(path).unwrap();
        assert_eq!(missing_settings(&shipped), Vec::<String>::new());
        // So does the shipped model's: `plan` warns of no missing setting.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/pretrained/config.toml");
        let model = std::fs::read_to_string(path).unwrap();
        assert_eq!(missing_settings(&model), Vec::<String>::new());
        // Two settings of a run written before they existed.
        let older: String = whole
            .lines()
            .filter(|l| !l.starts_with("plan_search =") && !l.starts_with("measure_planned ="))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            missing_settings(&older),
            ["model.plan_search = 2000", "train.measure_planned = true"]
        );
        // A whole section left out: each of its settings.
        let missing = missing_settings("[sim]\nbatch = 1024\n");
        assert!(missing.iter().any(|m| m.starts_with("train.iterations = ")));
        assert!(!missing.iter().any(|m| m.starts_with("sim.batch")));
        assert!(missing.iter().any(|m| m.starts_with("sim.")));
    }

    #[test]
    fn empty_text_gives_the_defaults() {
        let c = Config::from_toml("", Path::new("c.toml")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn fields_override_and_bad_values_name_their_field() {
        let c = Config::from_toml("[sim]\nbatch = 1024\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.sim.batch, 1024);
        let e = Config::from_toml("[sim]\ngather_efficiency = 1.5\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.toml") && e.contains("sim.gather_efficiency"),
            "{e}"
        );
        let e = Config::from_toml("[sim]\nbogus = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = Config::from_toml("[memory]\nprecision = \"fp8\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fp8"), "{e}");
        for bad in [0, 17] {
            let e = Config::from_toml(
                &format!("[model]\ncost_members = {bad}\n"),
                Path::new("c.toml"),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("model.cost_members"), "{e}");
        }
        // Widest-table dims: ascending, in range, few, and not beside the
        // exchange's context.
        for (bad, why) in [
            ("cost_wide_dims = [64, 32]", "ascending"),
            ("cost_wide_dims = [64, 64]", "ascending"),
            ("cost_wide_dims = [0, 64]", "1..=65536"),
            ("cost_wide_dims = [1, 2, 3, 4, 5, 6, 7, 8, 9]", "at most 8"),
            ("cost_wide_dims = [64]\ncost_context = true", "together"),
        ] {
            refused(&format!("[model]\n{bad}\n"), "model.cost_wide_dims");
            refused(&format!("[model]\n{bad}\n"), why);
        }
        let c =
            Config::from_toml("[model]\ncost_wide_dims = [32, 64]\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.model.cost_wide_dims, [32, 64]);
        // `plan`'s near-tie share: [0, 0.1].
        for bad in ["-0.01", "0.2", "nan", "inf"] {
            refused(&format!("[model]\nplan_tie = {bad}\n"), "model.plan_tie");
        }
        let c = Config::from_toml("[model]\nplan_tie = 0\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.model.plan_tie, 0.0);
        assert_eq!(Config::default().model.plan_tie, 0.01);
        for bad in [
            "cost_weight_decay = -0.1",
            "cost_lr = 0.5\ncost_weight_decay = 2.0",
        ] {
            let e = Config::from_toml(&format!("[train]\n{bad}\n"), Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("train.cost_weight_decay"), "{e}");
        }
    }

    /// Asserts that `text` is refused naming `field`.
    fn refused(text: &str, field: &str) {
        let e = Config::from_toml(text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{text}: {e}");
    }

    #[test]
    fn training_values_that_pass_as_numbers_but_cannot_work_are_refused() {
        // V-trace's λ, and step rewards only where they mean something.
        for v in ["0.0", "-0.5", "1.5", "nan"] {
            refused(&format!("[train]\nlambda = {v}\n"), "train.lambda");
        }
        refused(
            "[train]\nstep_rewards = true\nreward = \"raw\"\n",
            "train.reward",
        );
        refused(
            "[train]\nstep_rewards = true\n[model]\noverall_cost = \"head\"\n",
            "model.overall_cost",
        );
        refused(
            "[train]\nlambda = 0.9\nupdate = \"reinforce\"\n",
            "train.update",
        );
        // Tight copies: multiples of an even share, at least 1, ordered.
        for v in ["[0.9, 1.2]", "[1.5, 1.2]", "[1.1, inf]", "[nan, 1.2]"] {
            refused(
                &format!("[train]\ntight_memory_slack = {v}\n"),
                "train.tight_memory_slack",
            );
        }
        refused("[train]\ntight_memory = 9\n", "train.tight_memory");
        // Reshaped copies: positive multiples of a task's density, ordered.
        for v in ["[0.0, 2.0]", "[2.0, 0.5]", "[0.5, inf]", "[nan, 2.0]"] {
            refused(
                &format!("[train]\nreshape_density = {v}\n"),
                "train.reshape_density",
            );
        }
        refused("[train]\nreshape_copies = 9\n", "train.reshape_copies");
        for v in ["0.0", "-1.0", "nan", "inf"] {
            refused(
                &format!("[train]\nmeasure_temperature = {v}\n"),
                "train.measure_temperature",
            );
        }
        for v in ["-1.0", "nan", "inf"] {
            refused(
                &format!("[train]\ninfeasible_penalty = {v}\n"),
                "train.infeasible_penalty",
            );
        }
        let tight = "[train]\ntight_memory = 2\ntight_memory_slack = [1.1, 1.1]\n\
                     infeasible_penalty = 0.5\n";
        assert!(Config::from_toml(tight, Path::new("c.toml")).is_ok());
        let ok =
            "[train]\nstep_rewards = true\nlambda = 0.9\n[model]\noverall_cost = \"composed\"\n";
        assert!(Config::from_toml(ok, Path::new("c.toml")).is_ok());
    }

    #[test]
    fn durations_suites_and_ranges_that_cannot_work_are_refused() {
        // Durations libstd cannot hold, or that would never end.
        for v in ["nan", "inf", "1e20", "0.0", "-1.0", "1e-300"] {
            refused(
                &format!("[cluster]\nheartbeat_s = {v}\n"),
                "cluster.heartbeat_s",
            );
            refused(
                &format!("[cluster]\njob_timeout_s = {v}\n"),
                "cluster.job_timeout_s",
            );
            refused(
                &format!("[cluster]\nstall_timeout_s = {v}\n"),
                "cluster.stall_timeout_s",
            );
            refused(
                &format!("[cuda]\njoin_timeout_s = {v}\n"),
                "cuda.join_timeout_s",
            );
        }
        for v in ["nan", "inf", "1e20"] {
            refused(
                &format!("[cluster]\npeer_timeout_s = {v}\n"),
                "cluster.peer_timeout_s",
            );
        }
        refused(
            "[cluster]\npeer_timeout_s = 1.5\n",
            "cluster.peer_timeout_s",
        );
        for v in ["nan", "inf", "-0.5"] {
            refused(
                &format!("[train]\ncost_pair_weight = {v}\n"),
                "train.cost_pair_weight",
            );
        }
        for v in ["nan", "inf", "-0.5", "1e9"] {
            refused(
                &format!("[model]\nplan_temperature = {v}\n"),
                "model.plan_temperature",
            );
        }
        refused("[train]\nepisodes = 70000\n", "train.episodes");
        for v in ["nan", "-0.1", "1.5"] {
            refused(
                &format!("[pretrain]\nfound_share = {v}\n"),
                "pretrain.found_share",
            );
            refused(
                &format!("[pretrain]\nsearch_share = {v}\n"),
                "pretrain.search_share",
            );
            for field in ["measure_greedy_share", "measure_basins_share"] {
                refused(
                    &format!("[train]\n{field} = {v}\n"),
                    &format!("train.{field}"),
                );
            }
        }
        refused(
            "[data]\nsuites = [{ tables = 10, devices = 100000, memory_gb = 1.0 }]\n",
            "data.suites[0].devices",
        );
        refused(
            "[data]\nsuites = [{ tables = 10, devices = 2, memory_gb = 1.0 }, \
             { tables = 10, devices = 2, memory_gb = 8.0 }]\n",
            "dlrm-10x2",
        );
        for (suite, field) in [
            ("tables = 10, devices = 2", "needs memory_gb"),
            (
                "tables = 10, devices = 2, memory_gb = 1.0, memory_share = 1.1",
                "both",
            ),
            (
                "tables = 10, devices = 2, memory_share = 0.9",
                "data.suites[0].memory_share",
            ),
            (
                "tables = 10, devices = 2, memory_share = nan",
                "data.suites[0].memory_share",
            ),
            (
                "tables = 10, devices = 2, memory_share = 2.5",
                "must lie in 1..=2",
            ),
            (
                "tables = 10, devices = 2, memory_gb = -1.0",
                "data.suites[0].memory_gb",
            ),
        ] {
            refused(&format!("[data]\nsuites = [{{ {suite} }}]\n"), field);
        }
        // A suite whose memory is a share has a name of its own.
        let c = Config::from_toml(
            "[data]\nsuites = [{ tables = 10, devices = 2, memory_gb = 1.0 }, \
             { tables = 10, devices = 2, memory_share = 1.1 }]\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let names: Vec<String> = c.data.suites.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["dlrm-10x2", "dlrm-10x2-share1.1"]);
        refused(
            "[generate]\nlog10_rows_sigma = 1e308\n",
            "generate.log10_rows_sigma",
        );
        refused(
            "[generate]\nrows_pooling_slope = -1e308\n",
            "generate.rows_pooling_slope",
        );
        // The edges that work stay accepted.
        let c = Config::from_toml(
            "[cluster]\nheartbeat_s = 0.001\npeer_timeout_s = 1000000\n[model]\nplan_temperature = 0\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.cluster.peer_timeout_s, 1e6);
    }
}
