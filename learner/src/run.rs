//! A run folder: every file a training run keeps, by name, and the
//! decision to start a run there, resume it, or refuse.
//!
//! ```text
//! RUN/config.toml          the run's configuration (paths absolute, backend recorded)
//! RUN/cost_buffer.jsonl    every measurement, appended before it counts
//! RUN/metrics.jsonl        one line per policy update
//! RUN/checkpoints/step-N/  networks, optimizers, counters (crate::checkpoint)
//! RUN/trained_shapes.json  the shapes of the training tasks (model::shapes)
//! RUN/lock                 one learner at a time (crate::runlock)
//! RUN/endpoint             a cluster run's bound endpoint (endpoint.last: before)
//! RUN/token                the cluster token the learner made (token.fingerprint: one given)
//! RUN/backend              the backend, in runs from before config.toml recorded it
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use common::config::{Backend, Config};

use crate::costlog::CostLog;

/// A run folder.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

/// What `learner train` does with a run folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A new run: the folder holds none.
    Fresh,
    /// The run the folder holds goes on.
    Resume,
}

impl RunDir {
    /// File names other modules reach from a bare path.
    pub const CONFIG: &'static str = "config.toml";
    pub const CHECKPOINTS: &'static str = "checkpoints";
    pub const LOCK: &'static str = "lock";

    /// Refuses a run folder (`what`: how the user named it) that is not
    /// there, is a file or cannot be listed, naming which.
    pub fn ensure_folder(dir: &Path, what: &str) -> anyhow::Result<()> {
        use std::io::ErrorKind;
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                anyhow::bail!("{what}: no such folder{}", common::fs::relative_hint(dir))
            }
            Ok(m) if !m.is_dir() => anyhow::bail!(
                "{what} is a file; give a training run's folder (the one `learner train \
                 --run-dir` wrote, holding {} and {}/)",
                Self::CONFIG,
                Self::CHECKPOINTS
            ),
            _ => {}
        }
        // Listing it needs the folder's own read permission, which its
        // metadata does not.
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("{what}: cannot be read ({e})"))?;
        Ok(())
    }

    /// Fails unless `dir` holds a run (its config.toml), naming the
    /// folder a user should give instead.
    pub fn ensure_holds_run(dir: &Path) -> anyhow::Result<()> {
        Self::ensure_folder(dir, &dir.display().to_string())?;
        anyhow::ensure!(
            dir.join(Self::CONFIG).is_file(),
            "{} holds no run (no {}): give the folder `learner train --run-dir` wrote",
            dir.display(),
            Self::CONFIG
        );
        Ok(())
    }

    pub fn new(path: impl Into<PathBuf>) -> RunDir {
        RunDir { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> PathBuf {
        self.path.join(Self::CONFIG)
    }

    pub fn cost_log(&self) -> PathBuf {
        self.path.join("cost_buffer.jsonl")
    }

    pub fn metrics(&self) -> PathBuf {
        self.path.join("metrics.jsonl")
    }

    /// The endpoint a cluster run's learner bound.
    pub fn endpoint(&self) -> PathBuf {
        self.path.join("endpoint")
    }

    /// The cluster token the learner made for its peers.
    pub fn token(&self) -> PathBuf {
        self.path.join("token")
    }

    /// The fingerprint of a cluster token that was given.
    pub fn token_fingerprint(&self) -> PathBuf {
        self.path.join("token.fingerprint")
    }

    /// The backend record of runs from before `config.toml` held it.
    fn legacy_backend(&self) -> PathBuf {
        self.path.join("backend")
    }

    /// Whether the run has a checkpoint (intact or not).
    pub fn has_checkpoint(&self) -> bool {
        !crate::checkpoint::list(&self.path).is_empty()
    }

    /// Whether the run's learner listened for peer processes before.
    pub fn was_bound(&self) -> bool {
        ["endpoint", "endpoint.last"]
            .iter()
            .any(|f| self.path.join(f).exists())
    }

    /// Decides whether `learner train` may start here: with `resume`, the
    /// folder must hold a run (its `config.toml`); without, it must hold
    /// none: no checkpoint and no logged measurement (a run stopped before
    /// its first checkpoint is never thrown away unasked).
    pub fn start(&self, resume: bool) -> anyhow::Result<Start> {
        let dir = self.path.display();
        if resume {
            anyhow::ensure!(
                self.config().exists(),
                "no run to resume in {dir}: it holds no config.toml (`learner train --config C \
                 --run-dir {dir}` starts one)"
            );
            return Ok(Start::Resume);
        }
        anyhow::ensure!(
            !self.has_checkpoint(),
            "{dir} already holds a run: add --resume to continue it, or pick another --run-dir"
        );
        let logged = CostLog::read(&self.cost_log())?.samples.len();
        anyhow::ensure!(
            logged == 0,
            "{} holds {logged} measurements of a run that stopped before its first \
             checkpoint: add --resume to train on with them, or pick another --run-dir",
            self.cost_log().display()
        );
        Ok(Start::Fresh)
    }

    /// The backend the run measures with: its cost buffer holds one
    /// oracle's measurements, so a resumed run keeps the one it started
    /// with (`cfg`'s, read from its `config.toml`; a run from before that
    /// record has it in `RUN/backend`). A new run, and a resumed one with
    /// no record at all (from before either), takes the one `asked`, else
    /// its configuration's, else `sim`; the latter is written to
    /// `RUN/backend`, so that its next resume keeps it.
    pub fn backend(
        &self,
        cfg: &Config,
        asked: Option<Backend>,
        start: Start,
    ) -> anyhow::Result<Backend> {
        let recorded = match start {
            Start::Fresh => None,
            Start::Resume => match cfg.cluster.backend {
                Some(b) => Some(b),
                None => self.read_legacy_backend()?,
            },
        };
        match (recorded, asked) {
            (Some(r), Some(a)) if r != a => anyhow::bail!(
                "the run in {} measures with the {} backend (its cost buffer holds {} \
                 measurements), not {}: go on without --backend, or start another --run-dir",
                self.path.display(),
                r.name(),
                r.name(),
                a.name()
            ),
            (Some(r), _) => Ok(r),
            (None, a) => {
                let b = a.or(cfg.cluster.backend).unwrap_or(Backend::Sim);
                if start == Start::Resume {
                    let path = self.legacy_backend();
                    common::fs::write_atomic(&path, format!("{}\n", b.name()).as_bytes())?;
                }
                Ok(b)
            }
        }
    }

    fn read_legacy_backend(&self) -> anyhow::Result<Option<Backend>> {
        use clap::ValueEnum;
        let path = self.legacy_backend();
        match std::fs::read_to_string(&path) {
            Ok(text) => Backend::from_str(text.trim(), true).map(Some).map_err(|_| {
                anyhow::anyhow!(
                    "{}: `{}` is no backend (sim, cpu or cuda)",
                    path.display(),
                    text.trim()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes a new run's configuration, its paths made absolute (so a
    /// resume, `eval` and `plan` find its data from any folder), and an
    /// empty metrics file.
    pub fn write_new(&self, cfg: &Config) -> anyhow::Result<()> {
        let here = std::env::current_dir().context("the current folder")?;
        let written = cfg.clone().with_absolute_paths(&here);
        common::fs::write_atomic(&self.config(), toml::to_string_pretty(&written)?.as_bytes())?;
        common::fs::write_atomic(&self.metrics(), b"")?;
        Ok(())
    }

    /// Keeps the lines of the run's `metrics.jsonl` up to update `step` (a
    /// resumed run's curves continue from its checkpoint); returns the
    /// training clock of the last line kept.
    pub fn keep_metrics_until(&self, step: usize) -> anyhow::Result<f64> {
        let path = self.metrics();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let kept: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| {
                let v = serde_json::from_str::<serde_json::Value>(l).ok()?;
                let s = v["step"].as_u64()?;
                (s as usize <= step)
                    .then(|| (format!("{l}\n"), v["elapsed_s"].as_f64().unwrap_or(0.0)))
            })
            .collect();
        let text: String = kept.iter().map(|(l, _)| l.as_str()).collect();
        common::fs::write_atomic(&path, text.as_bytes())?;
        Ok(kept.last().map_or(0.0, |(_, e)| *e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folder_is_started_resumed_or_refused_as_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path().join("run"));
        // Nothing there: a new run may start, none resumes.
        assert_eq!(run.start(false).unwrap(), Start::Fresh);
        let e = run.start(true).unwrap_err().to_string();
        assert!(e.starts_with("no run to resume in"), "{e}");
        // A configuration: it resumes.
        std::fs::create_dir_all(run.path()).unwrap();
        run.write_new(&Config::default()).unwrap();
        assert_eq!(run.start(true).unwrap(), Start::Resume);
        // A checkpoint: a new run there is refused.
        std::fs::create_dir_all(run.path().join("checkpoints/step-000001")).unwrap();
        let e = run.start(false).unwrap_err().to_string();
        assert!(e.contains("already holds a run"), "{e}");
    }

    #[test]
    fn the_backend_is_recorded_in_the_config_and_old_runs_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut cfg = Config::default();
        // A new run: asked, else configured, else sim.
        assert_eq!(run.backend(&cfg, None, Start::Fresh).unwrap(), Backend::Sim);
        cfg.cluster.backend = Some(Backend::Cpu);
        assert_eq!(run.backend(&cfg, None, Start::Fresh).unwrap(), Backend::Cpu);
        let asked = run.backend(&cfg, Some(Backend::Cuda), Start::Fresh);
        assert_eq!(asked.unwrap(), Backend::Cuda);
        // A resumed run keeps its own; another asked for is refused.
        assert_eq!(
            run.backend(&cfg, None, Start::Resume).unwrap(),
            Backend::Cpu
        );
        let e = run.backend(&cfg, Some(Backend::Sim), Start::Resume);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("measures with the cpu backend"));
        // A run from before either record: the one asked for, kept in its
        // side file for the next resume.
        cfg.cluster.backend = None;
        let asked = run.backend(&cfg, Some(Backend::Cpu), Start::Resume);
        assert_eq!(asked.unwrap(), Backend::Cpu);
        let next = run.backend(&cfg, None, Start::Resume);
        assert_eq!(next.unwrap(), Backend::Cpu);
        let e = run.backend(&cfg, Some(Backend::Sim), Start::Resume);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("measures with the cpu backend"));
        // A run from before the record in config.toml: its side file.
        std::fs::write(dir.path().join("backend"), "cuda\n").unwrap();
        let side = run.backend(&cfg, None, Start::Resume);
        assert_eq!(side.unwrap(), Backend::Cuda);
        std::fs::write(dir.path().join("backend"), "tpu\n").unwrap();
        let e = run
            .backend(&cfg, None, Start::Resume)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tpu` is no backend"), "{e}");
    }

    #[test]
    fn a_resumed_runs_metrics_keep_their_lines_and_give_the_last_ones_clock() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        // No file yet: nothing kept, the clock at zero.
        assert_eq!(run.keep_metrics_until(5).unwrap(), 0.0);
        let lines = [
            r#"{"step":1,"elapsed_s":0.5}"#,
            r#"{"step":2,"elapsed_s":1.25}"#,
            "torn",
            r#"{"step":3,"elapsed_s":2.0}"#,
        ];
        std::fs::write(run.metrics(), lines.join("\n")).unwrap();
        assert_eq!(run.keep_metrics_until(2).unwrap(), 1.25);
        let kept = std::fs::read_to_string(run.metrics()).unwrap();
        assert_eq!(kept, format!("{}\n{}\n", lines[0], lines[1]));
        assert_eq!(run.keep_metrics_until(0).unwrap(), 0.0);
        assert_eq!(std::fs::read_to_string(run.metrics()).unwrap(), "");
    }
}
