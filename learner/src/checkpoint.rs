//! Checkpoints of a training run (DESIGN §9): `RUN/checkpoints/step-NNNNNN/`
//! holds both networks, both optimizers' state and the counters (RNG
//! position included), with a manifest of CRC-32s. A checkpoint is written
//! into a temp folder, fsynced and renamed, so it is whole or absent; the
//! newest `keep` are kept; loading takes the newest whose files all match
//! their manifest and falls back to older ones otherwise. The cost buffer is
//! not copied into checkpoints: it lives in its own append-only log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use common::config::Config;
use tch::Tensor;

use crate::train::{Counters, Model, Trainer};

const FILES: [&str; 4] = ["policy.ot", "cost.ot", "optimizer.ot", "counters.json"];

/// Named tensors, as `Tensor::save_multi` writes them.
pub type NamedTensors = Vec<(String, Tensor)>;

/// What a checkpoint restores.
pub struct Loaded {
    pub model: Model,
    pub optimizer: NamedTensors,
    pub counters: Counters,
    pub path: PathBuf,
}

fn checkpoints(run: &Path) -> PathBuf {
    run.join("checkpoints")
}

/// Checkpoint folders of a run, newest first.
pub fn list(run: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(checkpoints(run))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("step-") && !n.ends_with(".tmp"))
        })
        .collect();
    dirs.sort();
    dirs.reverse();
    dirs
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Writes the trainer's state as the run's newest checkpoint and prunes all
/// but the newest `keep`.
pub fn save(run: &Path, trainer: &Trainer, keep: usize) -> anyhow::Result<PathBuf> {
    let root = checkpoints(run);
    let counters = trainer.counters_now();
    let name = format!("step-{:06}", counters.policy_updates);
    let tmp = root.join(format!("{name}.tmp"));
    let dest = root.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    trainer.model.save(&tmp)?;
    let mut state: NamedTensors = Vec::new();
    for (prefix, opt) in [("cost", &trainer.cost_opt), ("policy", &trainer.policy_opt)] {
        state.extend(
            opt.state()
                .into_iter()
                .map(|(n, t)| (format!("{prefix}.{n}"), t)),
        );
    }
    Tensor::save_multi(&state, tmp.join("optimizer.ot")).context("writing optimizer.ot")?;
    std::fs::write(
        tmp.join("counters.json"),
        serde_json::to_vec_pretty(&counters)?,
    )?;
    let mut manifest = BTreeMap::new();
    for f in FILES {
        let path = tmp.join(f);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        manifest.insert(f, crc32fast::hash(&bytes));
        std::fs::File::open(&path)?.sync_all()?;
    }
    common::fs::write_atomic(
        &tmp.join("manifest.json"),
        &serde_json::to_vec_pretty(&manifest)?,
    )?;
    sync_dir(&tmp)?;
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming to {}", dest.display()))?;
    sync_dir(&root)?;
    for old in list(run).into_iter().skip(keep.max(1)) {
        let _ = std::fs::remove_dir_all(old);
    }
    Ok(dest)
}

fn verify(dir: &Path) -> anyhow::Result<()> {
    let manifest: BTreeMap<String, u32> = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json")).context("reading manifest.json")?,
    )
    .context("parsing manifest.json")?;
    for f in FILES {
        let want = manifest
            .get(f)
            .with_context(|| format!("manifest lacks {f}"))?;
        let bytes = std::fs::read(dir.join(f)).with_context(|| format!("reading {f}"))?;
        anyhow::ensure!(
            crc32fast::hash(&bytes) == *want,
            "{f} does not match its checksum"
        );
    }
    Ok(())
}

/// Loads a checkpoint; the optimizer's state only when `optimizer` (a
/// trained model's users need the networks alone).
fn load_one(cfg: &Config, dir: &Path, optimizer: bool) -> anyhow::Result<Loaded> {
    verify(dir)?;
    let model = Model::load(cfg, dir)?;
    let optimizer = if optimizer {
        Tensor::load_multi(dir.join("optimizer.ot")).context("loading optimizer.ot")?
    } else {
        Vec::new()
    };
    let counters: Counters = serde_json::from_slice(&std::fs::read(dir.join("counters.json"))?)
        .context("parsing counters.json")?;
    Ok(Loaded {
        model,
        optimizer,
        counters,
        path: dir.to_path_buf(),
    })
}

/// The newest intact checkpoint of a run; damaged ones are skipped with a
/// warning. `None` when the run has none.
pub fn load_latest(cfg: &Config, run: &Path) -> Option<Loaded> {
    latest(cfg, run, true)
}

/// A run directory's configuration and its newest intact model.
pub fn load_run(run: &Path) -> anyhow::Result<(Config, Model)> {
    let cfg = Config::load_run(&run.join("config.toml"))?;
    let loaded = load_latest_model(&cfg, run)
        .with_context(|| format!("no intact checkpoint in {}", run.display()))?;
    Ok((cfg, loaded.model))
}

/// [`load_latest`] without the optimizer's state (its `optimizer` is empty):
/// for `plan` and `eval`.
pub fn load_latest_model(cfg: &Config, run: &Path) -> Option<Loaded> {
    latest(cfg, run, false)
}

fn latest(cfg: &Config, run: &Path, optimizer: bool) -> Option<Loaded> {
    for dir in list(run) {
        match load_one(cfg, &dir, optimizer) {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(
                "checkpoint {} is damaged, trying an older one: {e:#}",
                dir.display()
            ),
        }
    }
    None
}

/// Splits a saved optimizer state into the cost and policy parts.
pub fn split_optimizer(state: Vec<(String, Tensor)>) -> (NamedTensors, NamedTensors) {
    let mut cost = Vec::new();
    let mut policy = Vec::new();
    for (name, t) in state {
        if let Some(rest) = name.strip_prefix("cost.") {
            cost.push((rest.to_string(), t));
        } else if let Some(rest) = name.strip_prefix("policy.") {
            policy.push((rest.to_string(), t));
        }
    }
    (cost, policy)
}
