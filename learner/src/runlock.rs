//! One learner per run directory: `learner train` holds an exclusive
//! advisory lock (flock(2)) on `RUN/lock` for as long as it trains, so a
//! second learner on the same folder stops before it writes anything there
//! (it would append the same measurements twice to the cost buffer and
//! write checkpoints over the first one's). The kernel drops the lock when
//! the process ends, however it ends (SIGKILL included): a resume after a
//! crash finds it free. The file stays, holding the pid of the learner that
//! took it last; readers (`eval`, `plan`) never look at it.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use rustix::fs::FlockOperation;

/// The lock on a run directory, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    /// The locked file: closing it releases the lock.
    _file: std::fs::File,
}

impl RunLock {
    /// Takes the lock on the run directory `run` (which must exist), or
    /// fails at once, naming the folder and the pid of the learner that
    /// holds it.
    pub fn take(run: &Path) -> anyhow::Result<RunLock> {
        let path = run.join(crate::run::RunDir::LOCK);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut text = String::new();
                // The holder may be writing its pid this very moment: the
                // message then goes without one.
                let _ = file.read_to_string(&mut text);
                let who = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("another learner (pid {pid})"),
                    Err(_) => "another learner".to_string(),
                };
                anyhow::bail!(
                    "{who} is training in {}: it holds {}; stop it first (Ctrl-C writes a \
                     checkpoint), or pick another --run-dir",
                    run.display(),
                    path.display()
                );
            }
            // A file system without locks (some network mounts): no
            // protection, but no reason to refuse the run.
            Err(e)
                if [
                    rustix::io::Errno::NOSYS,
                    rustix::io::Errno::OPNOTSUPP,
                    rustix::io::Errno::NOLCK,
                ]
                .contains(&e) =>
            {
                tracing::warn!(
                    "{} cannot be locked ({e}): nothing stops a second learner on this \
                     run directory",
                    path.display()
                );
            }
            Err(e) => {
                return Err(std::io::Error::from(e))
                    .with_context(|| format!("locking {}", path.display()))
            }
        }
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(RunLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_locked_once_until_its_lock_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let lock = RunLock::take(dir.path()).unwrap();
        let pid = std::process::id();
        let held = std::fs::read_to_string(dir.path().join("lock")).unwrap();
        assert_eq!(held, format!("{pid}\n"));
        // flock(2) locks belong to an open file, not to a process: a
        // second take in this process is refused as another's would be.
        let e = format!("{:#}", RunLock::take(dir.path()).unwrap_err());
        assert!(
            e.contains(&format!("another learner (pid {pid}) is training in"))
                && e.contains(dir.path().to_str().unwrap()),
            "{e}"
        );
        drop(lock);
        let _again = RunLock::take(dir.path()).unwrap();
        // A folder that does not exist is an error that names the file.
        let none = dir.path().join("none");
        let e = format!("{:#}", RunLock::take(&none).unwrap_err());
        assert!(e.contains(none.join("lock").to_str().unwrap()), "{e}");
    }
}
