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

use crate::run::RunDir;
use crate::train::{Counters, Trainer};
use model::Model;

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
    run.join(RunDir::CHECKPOINTS)
}

/// Where a checkpoint folder's name puts it among the run's: `step-N` is
/// the checkpoint after `N` policy updates, `step-N.K` the `K`-th written
/// later at the same count (a stop mid-round). `None` for any other name
/// (temp folders, damaged ones set aside).
fn order(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix("step-")?;
    let (n, k) = rest.split_once('.').unwrap_or((rest, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(n) && digits(k)) {
        return None;
    }
    Some((n.parse().ok()?, k.parse().ok()?))
}

/// The run's checkpoint folders with their names (any name).
fn folders(root: &Path) -> impl Iterator<Item = (String, PathBuf)> {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
}

/// The highest `K` of the folders named for `n` updates (`step-N` is 0),
/// temp and set-aside ones included; `None` when there is none.
fn newest_at(root: &Path, n: u64) -> Option<u64> {
    folders(root)
        .filter_map(|(name, _)| {
            let name = name
                .strip_suffix(".tmp")
                .or_else(|| name.strip_suffix(".damaged"))
                .unwrap_or(&name);
            order(name).filter(|&(m, _)| m == n).map(|(_, k)| k)
        })
        .max()
}

/// Checkpoint folders of a run, newest first (by their counts, not by
/// their names' spelling).
pub fn list(run: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<((u64, u64), PathBuf)> = folders(&checkpoints(run))
        .filter_map(|(name, p)| Some((order(&name)?, p)))
        .collect();
    dirs.sort();
    dirs.into_iter().rev().map(|(_, p)| p).collect()
}

/// Writes the trainer's state as the run's newest checkpoint and prunes all
/// but the newest `keep`.
pub fn save(run: &Path, trainer: &Trainer, keep: usize) -> anyhow::Result<PathBuf> {
    let root = checkpoints(run);
    let counters = trainer.counters_now();
    let counters_json = serde_json::to_vec_pretty(&counters)?;
    // Nothing changed since the newest checkpoint (a stop right after a
    // round's): it stands for this state already (the clock aside).
    if let Some(newest) = list(run).into_iter().next() {
        let same = std::fs::read(newest.join("counters.json"))
            .ok()
            .and_then(|c| serde_json::from_slice::<Counters>(&c).ok())
            .is_some_and(|c| c.same_state(&counters));
        if same && verify(&newest).is_ok() {
            return Ok(newest);
        }
    }
    // A checkpoint already written at this count stays whole until the
    // new one is in place: the new one is named after the newest of them
    // (never a name freed by pruning, which would sort below the rest).
    let base = format!("step-{:06}", counters.policy_updates);
    let name = match newest_at(&root, counters.policy_updates as u64) {
        None => base,
        Some(k) => format!("{base}.{}", k + 1),
    };
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
    std::fs::write(tmp.join("counters.json"), &counters_json)?;
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
    common::fs::sync_dir(&tmp)?;
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming to {}", dest.display()))?;
    common::fs::sync_dir(&root)?;
    // The run's folder holds `checkpoints/` itself (new with the first).
    common::fs::sync_dir(run)?;
    for old in list(run).into_iter().skip(keep.max(1)) {
        let _ = std::fs::remove_dir_all(old);
    }
    // Folders of writes a kill cut short: the run's lock says no other
    // process writes here, so none of them is in progress.
    for (name, p) in folders(&root) {
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    Ok(dest)
}

/// A checkpoint file that could not be read for a reason other than its
/// absence (permissions, too many open files, a network file system away,
/// an I/O error): not proof of damage, so never a reason to set the
/// checkpoint aside or to go back to an older one.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read {path}: {source} (the checkpoint is left as it is: make it readable and \
         try again)"
)]
pub struct Unreadable {
    path: String,
    source: std::io::Error,
}

/// A checkpoint's file: a missing one is damage, another failure to read
/// it is [`Unreadable`].
fn read_file(dir: &Path, file: &str) -> anyhow::Result<Vec<u8>> {
    let path = dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!("{file} is missing")
        }
        Err(source) => Err(Unreadable {
            path: path.display().to_string(),
            source,
        }
        .into()),
    }
}

/// Checks a checkpoint's files against its manifest's checksums: an error
/// when one is missing or differs (damage), or is [`Unreadable`].
fn verify(dir: &Path) -> anyhow::Result<()> {
    let manifest: BTreeMap<String, u32> = serde_json::from_slice(&read_file(dir, "manifest.json")?)
        .context("parsing manifest.json")?;
    for f in FILES {
        let want = manifest
            .get(f)
            .with_context(|| format!("manifest lacks {f}"))?;
        let bytes = read_file(dir, f)?;
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
    let model = Model::load(cfg, dir).context(
        "its networks do not fit the run's [model] settings: trained with other settings, or \
         by another version of embshard (train again, or use the version that trained it)",
    )?;
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

/// The newest intact checkpoint of a run, for training on from it (`None`
/// when it has none). A checkpoint whose files fail their checksums is set
/// aside (renamed `….damaged`, with a warning), so that it neither holds
/// one of the kept places nor, readable again some day (a network file
/// system), passes for newer than what the run goes on from; the one
/// before is tried. An intact checkpoint that does not load (a
/// configuration edited since, a newer format), or one whose files cannot
/// be read now (see [`Unreadable`]), is an error: nothing is set aside.
pub fn load_latest(cfg: &Config, run: &Path) -> anyhow::Result<Option<Loaded>> {
    for dir in list(run) {
        if let Err(e) = verify(&dir) {
            if e.is::<Unreadable>() {
                return Err(e.context(format!("checking checkpoint {}", dir.display())));
            }
            let mut aside = dir.clone().into_os_string();
            aside.push(".damaged");
            let aside = PathBuf::from(aside);
            tracing::warn!(
                "checkpoint {} is damaged ({e:#}): set aside as {}, trying an older one",
                dir.display(),
                aside.display()
            );
            std::fs::rename(&dir, &aside)
                .with_context(|| format!("setting {} aside", dir.display()))?;
            continue;
        }
        return load_one(cfg, &dir, true)
            .map(Some)
            .with_context(|| format!("checkpoint {} is intact but does not load", dir.display()));
    }
    Ok(None)
}

/// A run directory's configuration and its newest intact model.
pub fn load_run(run: &Path) -> anyhow::Result<(Config, Model)> {
    RunDir::ensure_folder(run, &run.display().to_string())?;
    let config = run.join(RunDir::CONFIG);
    anyhow::ensure!(
        config.exists() || !run.join("manifest.json").exists(),
        "{} is one checkpoint of a run; give the run's folder (the one holding \
         config.toml and checkpoints/)",
        run.display()
    );
    anyhow::ensure!(
        config.exists(),
        "{} is not a training run's folder: it holds no config.toml (`learner train \
         --run-dir` writes one)",
        run.display()
    );
    let cfg = Config::load_run(&config)?;
    let loaded = load_latest_model(&cfg, run)?
        .with_context(|| format!("no intact checkpoint in {}", run.display()))?;
    let c = &loaded.counters;
    if c.policy_updates == 0 || c.cost_steps == 0 {
        tracing::warn!(
            "checkpoint {} holds an untrained model ({} policy updates, {} cost network \
             steps): its plans and estimates are those of networks that learned nothing yet \
             (train the run on: --resume)",
            loaded.path.display(),
            c.policy_updates,
            c.cost_steps
        );
    }
    Ok((cfg, loaded.model))
}

/// The runs `plan` and `eval` place with: one, or several trained apart
/// (`--run A --run B`), whose choices [`model::guard::plan_jointly`]
/// judges with all their cost networks.
pub struct Runs {
    /// The first run's configuration: memory, oracle and batch are the
    /// same for every run ([`Runs::load`] checks).
    pub cfg: Config,
    pub dirs: Vec<PathBuf>,
    pub models: Vec<Model>,
    pub shapes: Vec<Option<model::shapes::TrainedShapes>>,
    /// Each run's second opinion ([`Runs::SECOND_OPINION`]), where it
    /// ships one and it was not declined.
    pub seconds: Vec<Option<Model>>,
}

impl Runs {
    /// The folder, inside a run's, of the run whose cost network vetoes
    /// the run's learned plans ([`model::guard::second_opinion`]). The
    /// shipped model has one; runs that `train` writes do not.
    pub const SECOND_OPINION: &'static str = "second-opinion";

    /// Loads each run's newest intact model ([`load_run`]), and with
    /// `second_opinions` the second opinion it ships. Runs placed together
    /// must price the same thing: the same `[memory]`, oracle and batch,
    /// as must a run and its second opinion. A run given twice is refused.
    pub fn load(dirs: &[PathBuf], second_opinions: bool) -> anyhow::Result<Runs> {
        let (first, _) = dirs
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("no run to place with"))?;
        let mut seen = Vec::new();
        let (mut cfg, mut models, mut shapes) = (None, Vec::new(), Vec::new());
        let mut seconds = Vec::new();
        for dir in dirs {
            let same = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            if let Some(j) = seen.iter().position(|s| *s == same) {
                anyhow::bail!(
                    "--run {} is given twice (as --run {}): a run placed with itself adds \
                     nothing; give runs trained apart (another train.seed)",
                    dir.display(),
                    dirs[j].display()
                );
            }
            seen.push(same);
            let (this, model) = load_run(dir)?;
            let second = dir.join(Self::SECOND_OPINION);
            seconds.push(match second_opinions && second.is_dir() {
                true => Some(Self::load_second(&this, dir, &second)?),
                false => None,
            });
            match &cfg {
                None => cfg = Some(this),
                Some(first_cfg) => {
                    Self::check_alike(first_cfg, first, &this, dir)?;
                    if let Some(note) = Self::margin_note(first_cfg, first, &this, dir) {
                        tracing::warn!("{note}");
                    }
                }
            }
            shapes.push(model::shapes::TrainedShapes::read(dir));
            models.push(model);
        }
        Ok(Runs {
            cfg: cfg.expect("one run at least"),
            dirs: dirs.to_vec(),
            models,
            shapes,
            seconds,
        })
    }

    /// The second opinion in folder `second` of run `dir` (configuration
    /// `cfg`): it must price what the run prices.
    fn load_second(cfg: &Config, dir: &Path, second: &Path) -> anyhow::Result<Model> {
        let (its, model) = load_run(second)
            .with_context(|| format!("the second opinion {} does not load", second.display()))?;
        Self::check_alike(cfg, dir, &its, second).with_context(|| {
            format!(
                "{} cannot be {}'s second opinion (--no-second-opinion places without it)",
                second.display(),
                dir.display()
            )
        })?;
        tracing::info!(
            "the learned plans of {} are vetoed unless {}'s cost network agrees \
             (--no-second-opinion: without)",
            dir.display(),
            second.display()
        );
        Ok(model)
    }

    /// Refuses a run that learned its costs of another thing than the
    /// first run: another memory count, oracle, kernel or batch, or whose
    /// cost network has another number of members (each member weighs
    /// alike in the joint mean).
    fn check_alike(first: &Config, a: &Path, cfg: &Config, b: &Path) -> anyhow::Result<()> {
        use common::config::Backend;
        // What a run's costs were measured with: the oracle, its kernel
        // and its batch.
        let oracle = |c: &Config| match c.cluster.backend {
            Some(Backend::Cpu) => format!("the cpu backend, {} kernel", c.cpu.kernel.name()),
            Some(Backend::Cuda) => format!("the cuda backend, {} kernel", c.cuda.kernel.name()),
            _ => "the sim backend".to_string(),
        };
        let batch = |c: &Config| match c.cluster.backend {
            Some(Backend::Cpu) => c.cpu.batch,
            Some(Backend::Cuda) => c.cuda.batch,
            _ => c.sim.batch,
        };
        let differs = if first.memory != cfg.memory {
            Some(format!(
                "memory ({} weights, {} state against {}, {})",
                cfg.memory.precision.name(),
                cfg.memory.optimizer.name(),
                first.memory.precision.name(),
                first.memory.optimizer.name()
            ))
        } else if oracle(first) != oracle(cfg) {
            Some(format!(
                "oracle ({} against {})",
                oracle(cfg),
                oracle(first)
            ))
        } else if batch(first) != batch(cfg) {
            Some(format!("batch ({} against {})", batch(cfg), batch(first)))
        } else if first.model.cost_members != cfg.model.cost_members {
            Some(format!(
                "cost network ({} members against {})",
                cfg.model.cost_members, first.model.cost_members
            ))
        } else {
            None
        };
        match differs {
            Some(what) => anyhow::bail!(
                "--run {} learned its costs with another {what} than --run {}: runs placed \
                 together must share [memory], the oracle, its batch and the number of cost \
                 network members",
                b.display(),
                a.display()
            ),
            None => Ok(()),
        }
    }

    /// Where a later run's `model.plan_margin` differs from the first
    /// run's, what each margin still decides: each run's guard applies its
    /// own to its learned plan; out of the trained range, where every run
    /// falls back, the first run's decides whether another heuristic beats
    /// `torchrec`'s plan ([`model::guard::judge_runs`]).
    fn margin_note(first: &Config, a: &Path, cfg: &Config, b: &Path) -> Option<String> {
        let (m0, m) = (first.model.plan_margin, cfg.model.plan_margin);
        (m0 != m).then(|| {
            format!(
                "--run {} sets model.plan_margin = {m} ({:.1} %), --run {} {m0} ({:.1} %): each \
                 run's guard applies its own margin to its learned plan; out of the trained \
                 range, where every run falls back to a heuristic, the first --run's margin \
                 decides whether another heuristic beats torchrec's plan",
                b.display(),
                100.0 * m,
                a.display(),
                100.0 * m0
            )
        })
    }

    /// Each run with what it was trained on, for the guard.
    pub fn trained(&self) -> Vec<model::guard::Trained<'_>> {
        (self.models.iter().zip(&self.shapes).zip(&self.seconds))
            .map(|((model, shapes), second)| model::guard::Trained {
                model,
                shapes: shapes.as_ref(),
                second: second.as_ref(),
            })
            .collect()
    }

    /// Sets every run's `model.plan_search`: the predicted plans each of
    /// `plan`'s searches may spend (0 or 1: no search). Returns each
    /// run's own, in order.
    pub fn set_plan_search(&mut self, plans: usize) -> Vec<usize> {
        (self.models.iter_mut())
            .map(|m| std::mem::replace(&mut m.plan_cfg.plan_search, plans))
            .collect()
    }

    /// `plan`'s choice with every run, as [`model::guard::plan_jointly`]
    /// makes it, but each run's guard on a thread of its own: a model may
    /// move to another thread, not be shared by two, and these are owned
    /// here.
    pub fn plan(
        &mut self,
        task: &common::Task,
        mem: &common::MemoryModel,
    ) -> anyhow::Result<model::guard::Guarded> {
        if self.models.len() == 1 {
            return self.trained()[0].plan(task, mem);
        }
        let guards = std::thread::scope(|s| {
            let handles: Vec<_> = (self.models.iter_mut().zip(&self.shapes))
                .zip(self.seconds.iter_mut())
                .map(|((model, shapes), second)| {
                    s.spawn(move || {
                        // One episode's tensors are tiny: no thread pool.
                        tch::set_num_threads(1);
                        let run = model::guard::Trained {
                            model,
                            shapes: shapes.as_ref(),
                            second: second.as_ref(),
                        };
                        run.plan(task, mem)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        Ok(model::guard::judge_runs(&guards, &self.trained(), task))
    }

    /// The cost networks' per-device `[fwd, bwd, comm]` and iteration
    /// cost of `plan`, averaged over the runs, each seeing the tables as
    /// its guard does ([`model::guard::seen_tables`]).
    pub fn estimate(&self, tables: &[common::Table], plan: &common::Plan) -> (Vec<[f64; 3]>, f64) {
        let n = self.models.len() as f64;
        let mut devices = vec![[0.0; 3]; plan.devices];
        let mut cost = 0.0;
        for (m, shapes) in self.models.iter().zip(&self.shapes) {
            let seen = model::guard::seen_tables(shapes.as_ref(), tables);
            let (d, c) = m.estimate(&seen, plan);
            for (sum, x) in devices.iter_mut().zip(d) {
                for (s, v) in sum.iter_mut().zip(x) {
                    *s += v / n;
                }
            }
            cost += c / n;
        }
        (devices, cost)
    }
}

/// The configuration and newest model of the run `train.init` names, to
/// fine-tune. Unlike [`load_run`] it accepts a run whose policy never
/// learned (pre-training's stage 1 fits only the cost network), but not one
/// whose cost network never did.
pub fn load_init(run: &Path) -> anyhow::Result<(Config, Model)> {
    let what = || format!("train.init = {}", run.display());
    RunDir::ensure_folder(run, &what())?;
    let config = run.join(RunDir::CONFIG);
    anyhow::ensure!(
        config.exists(),
        "{}: not a training run's folder (it holds no config.toml)",
        what()
    );
    let cfg = Config::load_run(&config).with_context(what)?;
    let loaded = load_latest_model(&cfg, run)
        .with_context(what)?
        .with_context(|| format!("{}: no intact checkpoint", what()))?;
    anyhow::ensure!(
        loaded.counters.cost_steps > 0,
        "{}: its checkpoint {} holds an untrained cost network",
        what(),
        loaded.path.display()
    );
    Ok((cfg, loaded.model))
}

/// The newest intact model of a run, without the optimizer's state (its
/// `optimizer` is empty), for `plan` and `eval`: damaged checkpoints (files
/// that fail their checksums) are skipped with a warning and left as they
/// are; an intact one that does not load is an error (a configuration
/// edited since, or a checkpoint of another version of embshard), not a
/// reason to fall back to an older one.
pub fn load_latest_model(cfg: &Config, run: &Path) -> anyhow::Result<Option<Loaded>> {
    for dir in list(run) {
        if let Err(e) = verify(&dir) {
            if e.is::<Unreadable>() {
                return Err(e.context(format!("checking checkpoint {}", dir.display())));
            }
            tracing::warn!(
                "checkpoint {} is damaged, trying an older one: {e:#}",
                dir.display()
            );
            continue;
        }
        return load_one(cfg, &dir, false).map(Some).with_context(|| {
            format!(
                "checkpoint {} is intact but does not load with {}",
                dir.display(),
                run.join(RunDir::CONFIG).display()
            )
        });
    }
    Ok(None)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `Runs::plan`, a thread per run, chooses as `plan_jointly` does in
    /// turn.
    #[test]
    fn runs_on_threads_choose_as_runs_in_turn() {
        let cfg = Config::default();
        let pool = common::generate::generate_pool(&cfg.generate, 7).unwrap();
        let task = common::Task {
            name: "t".into(),
            devices: 4,
            memory_gb: 100.0,
            tables: pool[..24].to_vec(),
        };
        let mut runs = Runs {
            cfg: cfg.clone(),
            dirs: vec!["a".into(), "b".into()],
            models: (1..=2).map(|seed| Model::seeded(&cfg, seed)).collect(),
            shapes: vec![None, None],
            seconds: vec![Some(Model::seeded(&cfg, 3)), None],
        };
        let in_turn = model::guard::plan_jointly(&runs.trained(), &task, &cfg.memory).unwrap();
        let threaded = runs.plan(&task, &cfg.memory).unwrap();
        assert_eq!(threaded.plan(), in_turn.plan());
        assert_eq!(threaded.basins, in_turn.basins);
        assert_eq!(threaded.doubts, in_turn.doubts);
        assert_eq!(threaded.candidates.len(), in_turn.candidates.len());
        for (t, i) in threaded.candidates.iter().zip(&in_turn.candidates) {
            assert_eq!((t.method, t.run, &t.plan), (i.method, i.run, &i.plan));
            assert_eq!(t.predicted, i.predicted);
        }
        assert!(
            threaded.candidates.iter().any(|c| c.run == 1),
            "both runs propose"
        );
    }

    /// Runs placed together must have learned the same costs: each way
    /// one can differ is named.
    #[test]
    fn runs_that_learned_other_costs_are_not_placed_together() {
        let first = Config::default();
        let (a, b) = (Path::new("a"), Path::new("b"));
        assert!(Runs::check_alike(&first, a, &first.clone(), b).is_ok());
        // Another margin is no error, but it is said which one holds.
        let mut wider = first.clone();
        wider.model.plan_margin = 0.05;
        assert!(Runs::check_alike(&first, a, &wider, b).is_ok());
        assert_eq!(Runs::margin_note(&first, a, &first.clone(), b), None);
        let note = Runs::margin_note(&first, a, &wider, b).unwrap();
        assert!(
            note.contains("--run b sets model.plan_margin = 0.05 (5.0 %), --run a 0.02 (2.0 %)")
                && note.contains("the first --run's margin decides"),
            "{note}"
        );
        let differ = |edit: &dyn Fn(&mut Config)| {
            let mut cfg = first.clone();
            edit(&mut cfg);
            Runs::check_alike(&first, a, &cfg, b)
                .unwrap_err()
                .to_string()
        };
        let e = differ(&|c| c.memory.precision = common::Precision::Fp32);
        assert!(
            e.contains("--run b learned its costs with another memory (fp32"),
            "{e}"
        );
        let e = differ(&|c| c.cluster.backend = Some(common::config::Backend::Cpu));
        assert!(e.contains("oracle (the cpu backend"), "{e}");
        let e = differ(&|c| c.sim.batch *= 2);
        assert!(e.contains("another batch"), "{e}");
        let e = differ(&|c| c.model.cost_members += 1);
        assert!(e.contains("cost network (2 members against 1)"), "{e}");
        // The cpu batch counts on the cpu backend, the sim's does not.
        let cpu = |c: &mut Config| c.cluster.backend = Some(common::config::Backend::Cpu);
        let mut on_cpu = first.clone();
        cpu(&mut on_cpu);
        let mut other = on_cpu.clone();
        other.sim.batch *= 2;
        assert!(Runs::check_alike(&on_cpu, a, &other, b).is_ok());
        other.cpu.batch *= 2;
        assert!(Runs::check_alike(&on_cpu, a, &other, b).is_err());
    }

    #[test]
    fn checkpoints_are_listed_by_their_counts_newest_first() {
        let run = tempfile::tempdir().unwrap();
        for name in [
            "step-999975",
            "step-1000000",
            "step-000025",
            "step-000025.1",
            "step-000025.2.tmp",
            "step-000050.damaged",
            "step-x",
            "step-",
            "notes",
        ] {
            std::fs::create_dir_all(checkpoints(run.path()).join(name)).unwrap();
        }
        let names: Vec<String> = list(run.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "step-1000000",
                "step-999975",
                "step-000025.1",
                "step-000025"
            ]
        );
        // The next at a count follows the newest there, set-aside and
        // unfinished ones included; a freed lower name is never reused.
        let root = checkpoints(run.path());
        assert_eq!(newest_at(&root, 25), Some(2));
        assert_eq!(newest_at(&root, 50), Some(0));
        assert_eq!(newest_at(&root, 999975), Some(0));
        assert_eq!(newest_at(&root, 7), None);
        std::fs::remove_dir(root.join("step-000025")).unwrap();
        assert_eq!(newest_at(&root, 25), Some(2));
    }

    #[test]
    fn a_checkpoint_file_that_cannot_be_read_is_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        // A folder where the manifest should be: reading it fails, and not
        // for its absence.
        std::fs::create_dir(dir.path().join("manifest.json")).unwrap();
        let e = verify(dir.path()).unwrap_err();
        assert!(e.is::<Unreadable>(), "{e:#}");
        assert!(format!("{e:#}").contains("manifest.json"), "{e:#}");
        // Missing or different files are damage.
        std::fs::remove_dir(dir.path().join("manifest.json")).unwrap();
        let e = verify(dir.path()).unwrap_err();
        assert!(
            !e.is::<Unreadable>() && e.to_string().contains("missing"),
            "{e:#}"
        );
        let manifest: BTreeMap<&str, u32> = FILES.iter().map(|f| (*f, 0)).collect();
        std::fs::write(
            dir.path().join("manifest.json"),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        for f in FILES {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let e = verify(dir.path()).unwrap_err();
        assert!(
            !e.is::<Unreadable>() && e.to_string().contains("checksum"),
            "{e:#}"
        );
    }

    #[test]
    fn resuming_stops_at_an_unreadable_checkpoint_and_sets_nothing_aside() {
        let run = tempfile::tempdir().unwrap();
        let newest = checkpoints(run.path()).join("step-000050");
        let older = checkpoints(run.path()).join("step-000025");
        for d in [&newest, &older] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::create_dir(newest.join("manifest.json")).unwrap();
        let cfg = Config::default();
        let e = load_latest(&cfg, run.path()).err().expect("an error");
        let text = format!("{e:#}");
        assert!(
            text.contains("step-000050") && text.contains("cannot read"),
            "{text}"
        );
        assert!(newest.exists() && older.exists(), "nothing set aside");
        let e = load_latest_model(&cfg, run.path()).err().expect("an error");
        assert!(format!("{e:#}").contains("cannot read"), "{e:#}");
    }
}
