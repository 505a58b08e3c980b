//! Files written so that a crash never leaves half of one behind, and
//! text files read as editors write them.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to a temp file beside `path`, fsyncs it, renames it over
/// `path` and fsyncs the folder, so a reader sees the old file or the new
/// one, never a mix, and the new one survives a power cut once this returns.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_mode(path, bytes, 0o666)
}

/// [`write_atomic`] for a secret: the file is readable by its owner only
/// (before any byte is in it).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_mode(path, bytes, 0o600)
}

fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            dir
        }
        None => Path::new("."),
    };
    // A name of its own: two writers of different files (`x.json`,
    // `x.csv`) or of a file that ends in `.tmp` never share it.
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(name);
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        // Named by the file asked for: the temp file is ours, not the user's.
        .map_err(|e| Error::io(path, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// Fsyncs a folder, so that the entries made or renamed in it last.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Creates `dir` and its missing parents so that they outlast a power
/// cut: each folder created is recorded by an fsync of the folder that
/// holds it (what is written inside later relies on that).
pub fn create_dir_durable(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
    }
    Ok(())
}

/// A text file's contents, without the byte-order mark some Windows
/// editors put first (JSON parsers refuse it as "expected value").
pub fn read_text(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// For a message about a path (from a configuration or the command line)
/// that is not there: where a relative one was looked for (`; relative
/// paths start at the folder embshard runs in, here /x …`). Empty for an
/// absolute path.
pub fn relative_hint(path: &Path) -> String {
    if path.is_absolute() {
        return String::new();
    }
    let here = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "; relative paths start at the folder embshard runs in, here {here} (run it from the \
         folder the paths were written for, such as the repository's root for the shipped \
         configs, or make them absolute)"
    )
}

/// A stable 64-bit hash (FNV-1a) for deriving seeds from names; std's hasher
/// is not stable across releases.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_relative_path_is_said_to_start_at_the_current_folder() {
        let here = std::env::current_dir().unwrap();
        let hint = relative_hint(Path::new("models/pretrained"));
        assert!(hint.contains(&here.display().to_string()), "{hint}");
        assert_eq!(relative_hint(&here.join("models")), "");
    }

    #[test]
    fn durable_folders_are_made_with_their_parents_and_a_file_in_the_way_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_durable(&deep).unwrap();
        assert!(deep.is_dir());
        // Again: nothing to make, no error.
        create_dir_durable(&deep).unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let e = create_dir_durable(&dir.path().join("file/run")).unwrap_err();
        assert!(e.to_string().contains("file/run"), "{e}");
    }

    #[test]
    fn atomic_writes_replace_whole_files_and_leave_no_temp_behind() {
        let dir = tempfile::tempdir().unwrap();
        // A file whose own name ends in `.tmp`, next to one of the same stem.
        let a = dir.path().join("plan.tmp");
        let b = dir.path().join("plan.json");
        write_atomic(&a, b"first").unwrap();
        write_atomic(&b, b"other").unwrap();
        write_atomic(&a, b"second").unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"second");
        assert_eq!(std::fs::read(&b).unwrap(), b"other");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["plan.json", "plan.tmp"]);
        // A folder in the way: an error naming the file, and no temp left.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        let e = write_atomic(&blocked, b"x").unwrap_err().to_string();
        assert!(e.contains("blocked"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }

    #[test]
    fn private_files_are_for_their_owner_only_even_over_an_open_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"secret\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
