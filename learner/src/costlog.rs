//! The cost buffer on disk: an append-only log of measured plans, one JSON
//! line each, `{"crc32": c, "sample": {…}}`, where `c` is the CRC-32 of the
//! sample's JSON text. Each append is flushed and fsynced before it returns,
//! so a measurement that was acknowledged survives a crash. On reading, a
//! line that does not parse or whose checksum fails (a torn last write, a
//! damaged disk) is skipped and counted, never a crash.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read as _, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use model::loss::CostSample;

#[derive(Serialize)]
struct LineOut<'a> {
    crc32: u32,
    sample: &'a serde_json::value::RawValue,
}

/// A line as read: the sample kept as its exact text, which the checksum covers.
#[derive(Deserialize)]
struct LineIn<'a> {
    crc32: u32,
    #[serde(borrow)]
    sample: &'a serde_json::value::RawValue,
}

/// An open cost-buffer log.
#[derive(Debug)]
pub struct CostLog {
    path: PathBuf,
    file: File,
}

/// What reading a log found.
#[derive(Debug, Default)]
pub struct Read {
    pub samples: Vec<CostSample>,
    /// Lines dropped for a bad checksum or bad JSON.
    pub skipped: usize,
    /// Lines dropped as a second measurement of a pick already read (a
    /// line copied twice): counted once, the pick is not measured twice
    /// nor another left out.
    pub duplicates: usize,
}

impl CostLog {
    /// Opens (creating if needed) the log at `path` for appending. A log
    /// whose last line has no newline (a process killed while appending)
    /// gets one first, so that the next entry starts a line of its own: a
    /// whole entry there stays readable, a torn one stays a line to skip.
    pub fn open(path: &Path) -> anyhow::Result<CostLog> {
        let context = || format!("opening {}", path.display());
        let new = !path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .with_context(context)?;
        if new {
            // The log's entry in its folder lasts too, not only its bytes.
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            common::fs::sync_dir(dir.unwrap_or(Path::new(".")))?;
        }
        let len = file.metadata().with_context(context)?.len();
        if len > 0 {
            let mut last = [0u8];
            file.seek(SeekFrom::Start(len - 1))
                .and_then(|_| file.read_exact(&mut last))
                .with_context(context)?;
            if last[0] != b'\n' {
                tracing::warn!(
                    "{}: the last entry was cut short of its line end (a crash while \
                     appending); the next starts a new line",
                    path.display()
                );
                file.write_all(b"\n")
                    .and_then(|_| file.sync_data())
                    .with_context(context)?;
            }
        }
        Ok(CostLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends one sample durably: the entry and its newline in one write,
    /// then fsync.
    pub fn append(&mut self, sample: &CostSample) -> anyhow::Result<()> {
        let raw = serde_json::value::to_raw_value(sample)?;
        let mut line = serde_json::to_vec(&LineOut {
            crc32: crc32fast::hash(raw.get().as_bytes()),
            sample: &raw,
        })?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|_| self.file.sync_data())
            .with_context(|| format!("appending to {}", self.path.display()))
    }

    /// Reads every intact sample of the log at `path` (none if it is absent).
    pub fn read(path: &Path) -> anyhow::Result<Read> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Read::default()),
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        let mut out = Read::default();
        let mut picks = std::collections::HashSet::new();
        for (n, line) in BufReader::new(file).split(b'\n').enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            // Bytes that are not UTF-8 (a damaged disk) fail like bad JSON.
            let line = String::from_utf8(line).unwrap_or_default();
            let parsed = serde_json::from_str::<LineIn>(&line).ok().and_then(|l| {
                (crc32fast::hash(l.sample.get().as_bytes()) == l.crc32)
                    .then(|| serde_json::from_str::<CostSample>(l.sample.get()).ok())
                    .flatten()
            });
            match parsed {
                Some(s) if s.pick.is_some_and(|p| !picks.insert(p)) => {
                    tracing::warn!(
                        "{}:{}: a second entry for a pick already read, skipped",
                        path.display(),
                        n + 1
                    );
                    out.duplicates += 1;
                }
                Some(s) => out.samples.push(s),
                None => {
                    tracing::warn!(
                        "{}:{}: damaged cost-buffer entry skipped",
                        path.display(),
                        n + 1
                    );
                    out.skipped += 1;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{DeviceCost, Measurement, NUM_FEATURES};
    use model::nets::PlacedTables;

    fn sample(k: usize) -> CostSample {
        CostSample {
            placed: PlacedTables {
                // Values whose decimal forms are long, as real features are.
                features: vec![[(k as f32 + 0.1).ln() / 3.0; NUM_FEATURES]; 3],
                assignment: vec![0, 1, k % 2],
                devices: 2,
            },
            measurement: Measurement::from_devices(vec![
                DeviceCost::new(1.0 + k as f64 / 7.0, 2.0, 0.5, 9.5367431640625e-7),
                DeviceCost::new(0.5, 1.0, 0.5, 0.25),
            ]),
            // Logs from before pick numbers were kept have none.
            pick: (k % 2 == 0).then_some(model::loss::PickId {
                round: k / 3,
                place: k % 3,
            }),
        }
    }

    /// A log of samples `0..n` in a temporary folder (kept while the
    /// folder lives), closed.
    fn log_of(n: usize) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cost.jsonl");
        let mut log = CostLog::open(&p).unwrap();
        for k in 0..n {
            log.append(&sample(k)).unwrap();
        }
        (dir, p)
    }

    /// A line copied twice (a pick's measurement logged twice) is read
    /// once: the resume then measures every pick it lacks.
    #[test]
    fn a_duplicated_line_counts_once() {
        let (_dir, p) = log_of(4);
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // Sample 0 has a pick; sample 1 has none (an older log): two of it
        // are two measurements of one plan, both kept.
        let doubled = format!("{}\n{}\n{}\n{}\n", lines[0], lines[0], lines[1], lines[1]);
        std::fs::write(&p, doubled).unwrap();
        let r = CostLog::read(&p).unwrap();
        assert_eq!((r.samples.len(), r.duplicates, r.skipped), (3, 1, 0));
        assert_eq!(r.samples[0], sample(0));
    }

    #[test]
    fn appended_samples_read_back_across_reopenings() {
        let (dir, p) = log_of(2);
        CostLog::open(&p).unwrap().append(&sample(2)).unwrap();
        let r = CostLog::read(&p).unwrap();
        assert_eq!(r.skipped, 0);
        assert_eq!(r.samples, vec![sample(0), sample(1), sample(2)]);
        assert!(CostLog::read(&dir.path().join("absent"))
            .unwrap()
            .samples
            .is_empty());
    }

    #[test]
    fn torn_and_tampered_lines_are_skipped_and_counted() {
        let (_dir, p) = log_of(3);
        let text = std::fs::read_to_string(&p).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        // A changed figure fails the checksum; a torn tail fails to parse.
        lines[1] = lines[1].replacen("2.0", "9.0", 1);
        let half = lines[2].len() / 2;
        lines[2].truncate(half);
        let mut bytes = lines.join("\n").into_bytes();
        // And a line of bytes that are not UTF-8.
        bytes.extend_from_slice(b"\n\xff\xfe{\"crc32\n");
        std::fs::write(&p, bytes).unwrap();
        let r = CostLog::read(&p).unwrap();
        assert_eq!(r.samples, vec![sample(0)]);
        assert_eq!(r.skipped, 3);
    }

    /// A process killed while appending leaves its entry without the line
    /// end, whole or torn; entries appended after a reopening are not lost
    /// to it.
    #[test]
    fn entries_after_an_unterminated_one_are_kept() {
        let (_dir, p) = log_of(2);
        let whole = std::fs::read(&p).unwrap();
        // The second entry whole, without its newline.
        std::fs::write(&p, &whole[..whole.len() - 1]).unwrap();
        CostLog::open(&p).unwrap().append(&sample(2)).unwrap();
        let r = CostLog::read(&p).unwrap();
        assert_eq!(r.samples, vec![sample(0), sample(1), sample(2)]);
        assert_eq!(r.skipped, 0);
        // A torn entry: skipped alone.
        let text = std::fs::read(&p).unwrap();
        std::fs::write(&p, &text[..text.len() - 20]).unwrap();
        let mut log = CostLog::open(&p).unwrap();
        log.append(&sample(3)).unwrap();
        log.append(&sample(4)).unwrap();
        let r = CostLog::read(&p).unwrap();
        assert_eq!(r.samples, vec![sample(0), sample(1), sample(3), sample(4)]);
        assert_eq!(r.skipped, 1);
    }
}
