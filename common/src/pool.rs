//! The pool CSV format: `name,rows,dim,pooling_factor,bin_0,…,bin_16`, one
//! table per line after the header. Reading validates every field and names
//! the file, line and field of the first fault.
//!
//! Columns are found by name, in any case and any order; other columns
//! (a dataframe's index, notes) are ignored with a warning. A file may give
//! only `name,rows,dim`, with or without `pooling_factor` and the bins:
//! what users know of their tables. The missing columns take defaults, with
//! one warning naming them: the pooling factor the trace's mean,
//! [`crate::generate::published::mean_pooling`] (15.8 lookups per sample),
//! and the reuse bins the trace's aggregate
//! ([`crate::generate::default_bins`]: about half the unique rows used
//! once), more reuse where a table is too small for that.
//! `scripts/pool-from-trace.py` derives both from a lookup trace. A table
//! whose `pooling_factor` cell is empty takes the same default, with a
//! warning naming it.

use std::collections::HashSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::table::{Table, NUM_BINS};

/// Tolerance on the bins' sum: they are shares of unique rows and must sum to 1,
/// but files written with a few decimals round.
pub const BIN_SUM_TOLERANCE: f64 = 0.02;
/// Largest accepted hash size (2^40 rows: terabytes of weights per table).
pub const MAX_ROWS: u64 = 1 << 40;
/// Largest accepted embedding dimension.
pub const MAX_DIM: u64 = 1 << 16;
/// Largest accepted pooling factor (lookups per sample).
pub const MAX_POOLING: f64 = 1e5;
/// Longest accepted table name, in bytes: a name of 256 MiB once took the
/// learner's memory to 1.4 GB.
pub const MAX_NAME_BYTES: usize = 1024;

/// Line numbers of positions in a text, counted as editors do (`\n`,
/// `\r\n` and a lone `\r` each end a line), incrementally: records are
/// asked for in the order they lie.
struct LineCounter<'t> {
    text: &'t [u8],
    /// Bytes counted so far, and the line ends among them.
    at: usize,
    ends: u64,
}

impl<'t> LineCounter<'t> {
    fn new(text: &'t [u8]) -> Self {
        LineCounter {
            text,
            at: 0,
            ends: 0,
        }
    }

    /// The line of the first byte at or after `p` that does not end a
    /// line (a record's position may lie before the blank lines or the
    /// `\n` that precede it); 0 without a position.
    fn line_of(&mut self, p: Option<&csv::Position>) -> u64 {
        let Some(p) = p else { return 0 };
        let text = self.text;
        let start = (p.byte() as usize).min(text.len());
        let first = text[start..]
            .iter()
            .position(|&b| b != b'\n' && b != b'\r')
            .map_or(text.len(), |k| start + k);
        if first < self.at {
            (self.at, self.ends) = (0, 0);
        }
        for i in self.at..first {
            let lone_cr = text[i] == b'\r' && text.get(i + 1) != Some(&b'\n');
            if text[i] == b'\n' || lone_cr {
                self.ends += 1;
            }
        }
        self.at = first;
        1 + self.ends
    }
}

/// The header every pool CSV starts with.
pub fn header() -> Vec<String> {
    let mut h: Vec<String> = ["name", "rows", "dim", "pooling_factor"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    h.extend((0..NUM_BINS).map(|k| format!("bin_{k}")));
    h
}

/// Other names of a pool CSV's columns, and the name they stand for:
/// TorchRec's `EmbeddingBagConfig` calls rows `num_embeddings` and dim
/// `embedding_dim`, so a table list written from it reads as it is.
const ALIASES: [(&str, &str); 2] = [("num_embeddings", "rows"), ("embedding_dim", "dim")];

/// Where each column of a pool CSV lies, found by name (in any case and
/// any order, or by an alias in [`ALIASES`]); columns of other names are
/// ignored.
struct Columns {
    name: usize,
    rows: usize,
    dim: usize,
    pooling: Option<usize>,
    /// All of `bin_0..bin_16`, or none.
    bins: Option<Vec<usize>>,
    /// The other columns' names, for a warning.
    ignored: Vec<String>,
}

impl Columns {
    /// Finds the columns in a header, or says what is wrong with it.
    fn find(given: &[String]) -> std::result::Result<Columns, String> {
        let got: Vec<String> = (given.iter())
            .map(|g| {
                let g = g.to_lowercase();
                match ALIASES.iter().find(|(alias, _)| *alias == g) {
                    Some((_, name)) => name.to_string(),
                    None => g,
                }
            })
            .collect();
        let known = header();
        for (i, g) in got.iter().enumerate() {
            if let Some(j) = got[..i].iter().position(|o| o == g && known.contains(g)) {
                return Err(format!(
                    "the column `{g}` appears twice (`{}` and `{}`)",
                    given[j], given[i]
                ));
            }
        }
        let at = |n: &str| got.iter().position(|g| g == n);
        let need = |n: &str| {
            at(n).ok_or_else(|| match ALIASES.iter().find(|(_, name)| *name == n) {
                Some((alias, _)) => format!("no `{n}` (or `{alias}`) column"),
                None => format!("no `{n}` column"),
            })
        };
        let (name, rows, dim) = (need("name")?, need("rows")?, need("dim")?);
        let bins: Vec<Option<usize>> = (0..NUM_BINS).map(|k| at(&format!("bin_{k}"))).collect();
        let bins = match bins.iter().position(Option::is_none) {
            None => Some(bins.into_iter().flatten().collect()),
            Some(_) if bins.iter().all(Option::is_none) => None,
            Some(k) => {
                return Err(format!(
                    "no `bin_{k}` column: give all of bin_0..bin_{} or none",
                    NUM_BINS - 1
                ))
            }
        };
        let ignored = given
            .iter()
            .zip(&got)
            .filter(|(_, g)| !known.contains(g))
            .map(|(g, _)| match g.is_empty() {
                true => "(unnamed)".to_string(),
                false => format!("`{g}`"),
            })
            .collect();
        Ok(Columns {
            name,
            rows,
            dim,
            pooling: at("pooling_factor"),
            bins,
            ignored,
        })
    }
}

/// What a file without a pooling factor or reuse bins lacks, and what its
/// tables take instead, for the warning; `None` when it lacks neither.
fn defaults_taken(pooling: bool, bins: bool) -> Option<String> {
    let reuse = "the reuse bins of the trace's aggregate, about half the unique rows used once \
                 (more reuse where a table is too small for it)";
    let mean = format!(
        "pooling_factor {:.1}, the mean of Meta's dlrm_datasets trace",
        crate::generate::published::mean_pooling()
    );
    let fix = |what: &str| format!("scripts/pool-from-trace.py derives {what} from a lookup trace");
    match (pooling, bins) {
        (true, true) => None,
        (false, false) => Some(format!(
            "no pooling_factor and no reuse bins (bin_0..bin_16): every table takes {mean}, \
             and {reuse}; {}",
            fix("both")
        )),
        (true, false) => Some(format!(
            "no reuse bins (bin_0..bin_16): every table takes {reuse}; {}",
            fix("them")
        )),
        (false, true) => Some(format!(
            "no pooling_factor: every table takes {mean}; {}",
            fix("it")
        )),
    }
}

/// Reads and validates a pool CSV.
pub fn read(path: &Path) -> Result<Vec<Table>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    read_from(file, path)
}

/// Reads a pool from any reader; `path` is only used in messages.
pub fn read_from<R: std::io::Read>(mut reader: R, path: &Path) -> Result<Vec<Table>> {
    let csv_err = |line: u64, field: &str, message: String| Error::Csv {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        message,
    };
    let mut text = Vec::new();
    reader
        .read_to_end(&mut text)
        .map_err(|e| Error::io(path, e))?;
    if text.trim_ascii().is_empty() {
        return Err(csv_err(
            1,
            "",
            "the file is empty; a pool CSV starts with the header `name,rows,dim`, then one \
             line per table"
                .into(),
        ));
    }
    // UTF-16, as spreadsheets save "Unicode text": its byte-order mark.
    if text.starts_with(&[0xff, 0xfe]) || text.starts_with(&[0xfe, 0xff]) {
        return Err(csv_err(
            1,
            "",
            "this file is UTF-16 text; save it as UTF-8 (a spreadsheet's \"CSV UTF-8\"), as a \
             pool CSV must be"
                .into(),
        ));
    }
    // A suite or a placement given where a pool goes.
    if text.trim_ascii_start().starts_with(b"{") {
        return Err(csv_err(
            1,
            "",
            "this is a JSON file, not a pool CSV (a pool CSV starts `name,rows,dim`; a suite \
             JSON goes to `learner eval --suite`, and its tables are the pool CSV it names)"
                .into(),
        ));
    }
    // The csv crate's line numbers skip blank lines and count a CRLF
    // file's one short: a record's line is counted here, from where its
    // first byte lies, so that errors name the line an editor shows.
    let mut lines = LineCounter::new(&text);
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(true)
        .from_reader(text.as_slice());
    let got = rdr
        .headers()
        .map_err(|e| csv_err(1, "", format!("header: {e}")))?
        .clone();
    let got: Vec<String> = got.iter().map(|s| s.to_string()).collect();
    let cols = Columns::find(&got).map_err(|why| {
        csv_err(
            lines
                .line_of(rdr.headers().ok().and_then(|h| h.position()))
                .max(1),
            "",
            format!(
                "header: {why}, in `{}`; a pool CSV has the columns `name,rows,dim`, and may \
                 add `pooling_factor` and `bin_0` to `bin_16`, in any order \
                 (scripts/pool-from-trace.py writes every column from a lookup trace)",
                got.join(",")
            ),
        )
    })?;
    let mut tables = Vec::new();
    let mut names = HashSet::new();
    let mut no_pooling: Vec<String> = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| csv_err(lines.line_of(e.position()), "", e.to_string()))?;
        let line = lines.line_of(rec.position());
        if rec.len() != got.len() {
            return Err(csv_err(
                line,
                "",
                format!(
                    "expected {} fields, found {} (the header has {})",
                    got.len(),
                    rec.len(),
                    if got == header() {
                        "name,rows,dim,pooling_factor,bin_0,…,bin_16".to_string()
                    } else if got.len() <= 6 {
                        got.join(",")
                    } else {
                        format!("{} columns", got.len())
                    }
                ),
            ));
        }
        let name = rec[cols.name].to_string();
        if name.is_empty() {
            return Err(csv_err(line, "name", "empty table name".into()));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(csv_err(
                line,
                "name",
                format!(
                    "a name of {} bytes, more than the {MAX_NAME_BYTES} a table name may have",
                    name.len()
                ),
            ));
        }
        let (rows, dim) = (&rec[cols.rows], &rec[cols.dim]);
        let rows: u64 = parse_positive_int(rows, MAX_ROWS)
            .map_err(|m| csv_err(line, "rows", format!("`{rows}`: {m}")))?;
        let dim = parse_positive_int(dim, MAX_DIM)
            .map_err(|m| csv_err(line, "dim", format!("`{dim}`: {m}")))? as u32;
        let pooling = match cols.pooling.map(|k| &rec[k]) {
            None => crate::generate::published::mean_pooling(),
            // Unknown for this table: the default, as for a file without
            // the column, and a warning names it.
            Some("") => {
                no_pooling.push(name.clone());
                crate::generate::published::mean_pooling()
            }
            Some(field) => parse_finite(field)
                .and_then(|v| {
                    if v > 0.0 && v <= MAX_POOLING {
                        Ok(v)
                    } else {
                        Err(BadNumber::OutOfRange(format!("(0, {MAX_POOLING}]")))
                    }
                })
                .map_err(|m| csv_err(line, "pooling_factor", format!("`{field}`: {m}")))?,
        };
        let mut bins = crate::generate::default_bins(rows, pooling);
        if let Some(at) = &cols.bins {
            for (k, bin) in bins.iter_mut().enumerate() {
                let field = &rec[at[k]];
                *bin = parse_finite(field)
                    .and_then(|v| {
                        if (0.0..=1.0).contains(&v) {
                            Ok(v)
                        } else {
                            Err(BadNumber::OutOfRange("[0, 1]".into()))
                        }
                    })
                    .map_err(|m| csv_err(line, &format!("bin_{k}"), format!("`{field}`: {m}")))?;
            }
        }
        let sum: f64 = bins.iter().sum();
        if (sum - 1.0).abs() > BIN_SUM_TOLERANCE {
            return Err(csv_err(
                line,
                "bin_0..bin_16",
                format!("bins sum to {sum:.4}, expected 1 ± {BIN_SUM_TOLERANCE}"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(csv_err(
                line,
                "name",
                format!("duplicate table name `{name}`"),
            ));
        }
        tables.push(Table {
            name,
            rows,
            dim,
            pooling_factor: pooling,
            bins,
        });
    }
    if tables.is_empty() {
        return Err(csv_err(1, "", "the pool holds no table".into()));
    }
    if let Some(why) = defaults_taken(cols.pooling.is_some(), cols.bins.is_some()) {
        tracing::warn!("{}: {why}", path.display());
    }
    if !no_pooling.is_empty() {
        const SHOWN: usize = 3;
        let named: Vec<String> = (no_pooling.iter().take(SHOWN))
            .map(|n| format!("`{n}`"))
            .collect();
        let more = match no_pooling.len() > SHOWN {
            true => format!(" and {} more", no_pooling.len() - SHOWN),
            false => String::new(),
        };
        tracing::warn!(
            "{}: {} with an empty pooling_factor ({}{more}) {} {:.1}, the mean of Meta's \
             dlrm_datasets trace",
            path.display(),
            crate::count(no_pooling.len(), "table"),
            named.join(", "),
            if no_pooling.len() == 1 {
                "takes"
            } else {
                "take"
            },
            crate::generate::published::mean_pooling()
        );
    }
    if let Some(why) = not_multiples_of_4(&tables) {
        tracing::warn!("{}: {why}", path.display());
    }
    if !cols.ignored.is_empty() {
        tracing::warn!(
            "{}: ignoring the columns {} (a pool CSV reads name, rows, dim, pooling_factor \
             and bin_0..bin_16)",
            path.display(),
            cols.ignored.join(", ")
        );
    }
    Ok(tables)
}

/// The tables whose dim is not a multiple of 4, for a warning: FBGEMM's
/// CUDA kernel refuses them (`benchworker`'s `cuda` backend), so a plan
/// of them cannot be measured there as it is. `None` when there are none.
fn not_multiples_of_4(tables: &[Table]) -> Option<String> {
    const SHOWN: usize = 3;
    let odd: Vec<String> = (tables.iter())
        .filter(|t| t.dim % 4 != 0)
        .map(|t| format!("`{}` (dim {})", t.name, t.dim))
        .collect();
    if odd.is_empty() {
        return None;
    }
    let more = match odd.len() > SHOWN {
        true => format!(" and {} more", odd.len() - SHOWN),
        false => String::new(),
    };
    Some(format!(
        "{}{more} {} a dim that is not a multiple of 4; FBGEMM's CUDA kernel refuses such \
         tables (pad the dim, or measure with kernel = \"torch\")",
        odd[..odd.len().min(SHOWN)].join(", "),
        if odd.len() == 1 { "has" } else { "have" }
    ))
}

/// Why a CSV field is not the number it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum BadNumber {
    #[error("not a number")]
    NotANumber,
    #[error("must be finite")]
    NotFinite,
    #[error("not an integer")]
    NotAnInteger,
    #[error("must be a positive integer")]
    NotPositive,
    #[error("is larger than the maximum {0}")]
    TooLarge(u64),
    #[error("must lie in {0}")]
    OutOfRange(String),
}

fn parse_finite(s: &str) -> std::result::Result<f64, BadNumber> {
    let v: f64 = s.parse().map_err(|_| BadNumber::NotANumber)?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(BadNumber::NotFinite)
    }
}

/// A positive integer up to `max`, written out (`500000000`), with a
/// decimal point (`1000.0`, as a column of floats writes it) or in
/// scientific notation (`5e8`, as hash sizes often are) when that is a
/// whole number.
fn parse_positive_int(s: &str, max: u64) -> std::result::Result<u64, BadNumber> {
    let v: i128 = match s.parse() {
        Ok(v) => v,
        Err(_) if s.contains(['e', 'E', '.']) => {
            let f: f64 = s.parse().map_err(|_| BadNumber::NotAnInteger)?;
            if f.is_infinite() || f >= 1e30 {
                return Err(BadNumber::TooLarge(max));
            }
            if !(f.is_finite() && f.fract() == 0.0) {
                return Err(BadNumber::NotAnInteger);
            }
            f as i128
        }
        Err(_) => return Err(BadNumber::NotAnInteger),
    };
    if v <= 0 {
        return Err(BadNumber::NotPositive);
    }
    if v > max as i128 {
        return Err(BadNumber::TooLarge(max));
    }
    Ok(v as u64)
}

/// Writes a pool CSV (atomically: a temp file renamed over the target).
pub fn write(path: &Path, tables: &[Table]) -> Result<()> {
    let mut buf = Vec::new();
    {
        let mut w = csv::Writer::from_writer(&mut buf);
        let io = |e: csv::Error| Error::io(path, std::io::Error::other(e));
        w.write_record(header()).map_err(io)?;
        for t in tables {
            let mut rec = vec![
                t.name.clone(),
                t.rows.to_string(),
                t.dim.to_string(),
                t.pooling_factor.to_string(),
            ];
            rec.extend(t.bins.iter().map(|b| b.to_string()));
            w.write_record(&rec).map_err(io)?;
        }
        w.flush().map_err(|e| Error::io(path, e))?;
    }
    crate::fs::write_atomic(path, &buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::table;

    fn csv_text(body: &str) -> String {
        format!("{}\n{body}", header().join(","))
    }

    fn row(name: &str, rows: &str, dim: &str, pooling: &str, bins: &[&str]) -> String {
        let mut r = vec![name, rows, dim, pooling];
        r.extend_from_slice(bins);
        r.join(",")
    }

    const GOOD_BINS: [&str; 17] = [
        "0.5", "0.5", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0",
    ];

    fn parse(body: &str) -> Result<Vec<Table>> {
        read_from(csv_text(body).as_bytes(), Path::new("pool.csv"))
    }

    fn err_of(body: &str) -> String {
        parse(body).unwrap_err().to_string()
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.csv");
        let tables = vec![table("a", 100, 16, 3.25), table("b", 5000, 128, 1.0)];
        write(&p, &tables).unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back, tables);
    }

    #[test]
    fn accepts_a_valid_line() {
        let t = parse(&row("t0", "100", "8", "2.5", &GOOD_BINS)).unwrap();
        assert_eq!(t[0].rows, 100);
        assert_eq!(t[0].dim, 8);
    }

    #[test]
    fn rejects_zero_or_negative_rows_and_dim() {
        let e = err_of(&row("t0", "0", "8", "1", &GOOD_BINS));
        assert!(e.contains("pool.csv:2") && e.contains("`rows`"), "{e}");
        let e = err_of(&row("t0", "-5", "8", "1", &GOOD_BINS));
        assert!(e.contains("`rows`") && e.contains("positive"), "{e}");
        let e = err_of(&row("t0", "10", "0", "1", &GOOD_BINS));
        assert!(e.contains("`dim`"), "{e}");
        let e = err_of(&row("t0", "10", "-1", "1", &GOOD_BINS));
        assert!(e.contains("`dim`"), "{e}");
        let e = err_of(&row("t0", "10", "abc", "1", &GOOD_BINS));
        assert!(e.contains("`dim`") && e.contains("not an integer"), "{e}");
        let e = err_of(&row("t0", "99999999999999999999", "8", "1", &GOOD_BINS));
        assert!(e.contains("`rows`") && e.contains("maximum"), "{e}");
        let e = err_of(&row("t0", "10", "70000", "1", &GOOD_BINS));
        assert!(e.contains("`dim`") && e.contains("maximum"), "{e}");
        let e = err_of(&row("t0", "10", "8", "1e15", &GOOD_BINS));
        assert!(e.contains("`pooling_factor`"), "{e}");
    }

    #[test]
    fn rejects_nan_and_infinite_values() {
        let e = err_of(&row("t0", "10", "8", "NaN", &GOOD_BINS));
        assert!(
            e.contains("`pooling_factor`") && e.contains("finite"),
            "{e}"
        );
        let mut bins = GOOD_BINS;
        bins[3] = "nan";
        let e = err_of(&row("t0", "10", "8", "1", &bins));
        assert!(e.contains("`bin_3`"), "{e}");
        let e = err_of(&row("t0", "10", "8", "inf", &GOOD_BINS));
        assert!(e.contains("`pooling_factor`"), "{e}");
    }

    #[test]
    fn rejects_bins_that_do_not_sum_to_one() {
        let mut bins = GOOD_BINS;
        bins[1] = "0.2";
        let body = format!(
            "{}\n{}",
            row("ok", "10", "8", "1", &GOOD_BINS),
            row("bad", "10", "8", "1", &bins)
        );
        let e = err_of(&body);
        assert!(e.contains("pool.csv:3") && e.contains("sum to 0.7"), "{e}");
    }

    #[test]
    fn rejects_duplicate_names_with_the_second_line() {
        let body = format!(
            "{}\n{}",
            row("dup", "10", "8", "1", &GOOD_BINS),
            row("dup", "20", "8", "1", &GOOD_BINS)
        );
        let e = err_of(&body);
        assert!(e.contains("pool.csv:3") && e.contains("duplicate"), "{e}");
    }

    #[test]
    fn windows_line_ends_are_read_and_errors_name_the_line_an_editor_shows() {
        let good = row("a", "10", "8", "1", &GOOD_BINS);
        let text = csv_text(&format!("{good}\n{good}\n")).replace('\n', "\r\n");
        let e = read_from(text.as_bytes(), Path::new("w.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.csv:3") && e.contains("duplicate"), "{e}");
        let short = row("b", "10", "8", "1", &GOOD_BINS[1..]);
        let text = csv_text(&format!("{good}\n\n{short}\n")).replace('\n', "\r\n");
        let e = read_from(text.as_bytes(), Path::new("w.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.csv:4") && e.contains("fields"), "{e}");
        let e = err_of(&format!("{good}\n\n\n{short}\n"));
        assert!(e.contains("pool.csv:5") && e.contains("fields"), "{e}");
        // Old Mac line ends (a lone `\r`), a name quoted across two lines,
        // blank lines before a bad header.
        let text = csv_text(&format!("{good}\n\"x\ny\",1,8,1\n")).replace('\n', "\r");
        let e = read_from(text.as_bytes(), Path::new("w.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.csv:3") && e.contains("fields"), "{e}");
        let e = read_from("\n\nname,rows\nx,1\n".as_bytes(), Path::new("w.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.csv:3") && e.contains("header"), "{e}");
        // A BOM before a CRLF header, and a last line without its end.
        let text = format!("\u{feff}{}", csv_text(&good).replace('\n', "\r\n"));
        let pool = read_from(text.as_bytes(), Path::new("w.csv")).unwrap();
        assert_eq!(pool.len(), 1);
        assert_eq!(pool[0].rows, 10);
    }

    #[test]
    fn rows_may_be_written_in_scientific_notation() {
        assert_eq!(parse_positive_int("5e8", u64::MAX), Ok(500_000_000));
        assert_eq!(parse_positive_int("2.5E3", u64::MAX), Ok(2500));
        assert_eq!(parse_positive_int("1200", u64::MAX), Ok(1200));
        assert_eq!(parse_positive_int("1000.0", u64::MAX), Ok(1000));
        for bad in ["2.5e0", "1e-3", "-1e3", "x1e3", "12.5", "1e3.5", "nan", "."] {
            assert!(parse_positive_int(bad, u64::MAX).is_err(), "{bad}");
        }
        for huge in ["1e30", "1e400"] {
            assert_eq!(
                parse_positive_int(huge, 9),
                Err(BadNumber::TooLarge(9)),
                "{huge}"
            );
        }
        assert_eq!(
            parse_positive_int("1e4", 5000),
            Err(BadNumber::TooLarge(5000))
        );
    }

    #[test]
    fn rejects_bad_header_short_records_and_empty_pools() {
        let e = read_from("name,rows\nx,1\n".as_bytes(), Path::new("p.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.csv:1") && e.contains("header"), "{e}");
        assert!(
            e.contains("no `dim` (or `embedding_dim`) column, in `name,rows`"),
            "{e}"
        );
        assert!(e.contains("the columns `name,rows,dim`"), "{e}");
        let e = read_from(" {\"pool\": \"pool.csv\"}".as_bytes(), Path::new("s.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.json:1") && e.contains("JSON file, not a pool CSV"),
            "{e}"
        );
        let e = err_of("t0,10,8");
        assert!(e.contains("expected 21 fields, found 3"), "{e}");
        let e = err_of("");
        assert!(e.contains("no table"), "{e}");
        for empty in ["", " \n\n"] {
            let e = read_from(empty.as_bytes(), Path::new("e.csv"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("e.csv:1") && e.contains("the file is empty"),
                "{e}"
            );
        }
        // "name,rows,dim" saved as UTF-16 (little-endian, with its mark).
        let utf16: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain("name,rows,dim\n".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let e = read_from(utf16.as_slice(), Path::new("u.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("UTF-16") && e.contains("UTF-8"), "{e}");
    }

    /// `name,rows,dim` and `name,rows,dim,pooling_factor` are enough: the
    /// rest take the trace's defaults, which a small table's bins bend.
    #[test]
    fn short_headers_take_the_trace_defaults() {
        let p = Path::new("mine.csv");
        let t = read_from(
            "name,rows,dim\nuser,5000000,64\nitem,200,16\n".as_bytes(),
            p,
        )
        .unwrap();
        let mean = crate::generate::published::mean_pooling();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].rows, t[0].dim, t[0].pooling_factor),
            (5_000_000, 64, mean)
        );
        assert_eq!(t[0].bins, crate::generate::default_bins(5_000_000, mean));
        // The trace's aggregate: about half the unique rows used once.
        assert!((t[0].bins[0] - 0.5).abs() < 0.01, "{:?}", t[0].bins);
        // 200 rows cannot hold 65536 × 15.8 lookups at that reuse.
        assert!(t[1].bins[0] < 0.2, "{:?}", t[1].bins);
        assert!(t[1].mean_reuse() > 10.0 * t[0].mean_reuse());
        for table in &t {
            let sum: f64 = table.bins.iter().sum();
            assert!((sum - 1.0).abs() < 1e-4, "{sum}");
        }
        let t = read_from("name,rows,dim,pooling_factor\nu,1000,8,2.5\n".as_bytes(), p).unwrap();
        assert_eq!(t[0].pooling_factor, 2.5);
        assert_eq!(t[0].bins, crate::generate::default_bins(1000, 2.5));
        // One table's pooling left empty: that table takes the default.
        let text = "name,rows,dim,pooling_factor\nu,1000,8,2.5\nv,1000,8,\n";
        let t = read_from(text.as_bytes(), p).unwrap();
        assert_eq!((t[0].pooling_factor, t[1].pooling_factor), (2.5, mean));
        assert_eq!(t[1].bins, crate::generate::default_bins(1000, mean));
        // A bin missing, a column twice, a line too short.
        for (text, words) in [
            ("name,rows,dim,bin_0\na,1,2,1\n", "no `bin_1` column"),
            ("name,rows,dim,bin_0\na,1,2,1\n", "pool-from-trace.py"),
            (
                "name,rows,dim,Rows\na,1,2,1\n",
                "the column `rows` appears twice (`rows` and `Rows`)",
            ),
            (
                "name,rows,dim\na,10\n",
                "expected 3 fields, found 2 (the header has name,rows,dim)",
            ),
        ] {
            let e = read_from(text.as_bytes(), p).unwrap_err().to_string();
            assert!(e.contains(words), "{words:?} not in {e}");
        }
        assert!(defaults_taken(false, false)
            .unwrap()
            .contains("pooling_factor 15.8"));
        assert!(defaults_taken(false, true)
            .unwrap()
            .starts_with("no pooling_factor:"));
        assert_eq!(defaults_taken(true, true), None);
        // A name too long to be one.
        let long = format!("name,rows,dim\n{},10,8\n", "x".repeat(MAX_NAME_BYTES + 1));
        let e = read_from(long.as_bytes(), p).unwrap_err().to_string();
        assert!(
            e.contains("mine.csv:2") && e.contains("more than the 1024"),
            "{e}"
        );
        assert!(!defaults_taken(true, false)
            .unwrap()
            .contains("pooling_factor"));
    }

    /// Dims that FBGEMM's CUDA kernel refuses are named, three at most.
    #[test]
    fn dims_not_multiples_of_4_are_named() {
        let t = |name: &str, dim| Table::cold(name, 1000, dim, 2.0);
        assert_eq!(not_multiples_of_4(&[t("a", 16), t("b", 1024)]), None);
        let one = not_multiples_of_4(&[t("a", 16), t("b", 18)]).unwrap();
        assert!(one.starts_with("`b` (dim 18) has"), "{one}");
        let many: Vec<Table> = (0..5).map(|i| t(&format!("t{i}"), 6 + i)).collect();
        let why = not_multiples_of_4(&many).unwrap();
        // Dims 6, 7, 9 and 10 are not multiples of 4; 8 is.
        assert!(
            why.contains("`t0` (dim 6), `t1` (dim 7), `t3` (dim 9) and 1 more have"),
            "{why}"
        );
    }

    /// TorchRec's names for rows and dim read as ours; one column under
    /// both names is one too many.
    #[test]
    fn torchrec_column_names_read_as_rows_and_dim() {
        let cols =
            Columns::find(&["name", "Num_Embeddings", "embedding_dim"].map(String::from)).unwrap();
        assert_eq!((cols.name, cols.rows, cols.dim), (0, 1, 2));
        assert!(cols.ignored.is_empty(), "{:?}", cols.ignored);
        let twice = Columns::find(&["name", "rows", "num_embeddings", "dim"].map(String::from));
        let err = twice.err().expect("rows given twice");
        assert!(err.contains("appears twice"), "{err}");
        let none = Columns::find(&["name", "dim"].map(String::from))
            .err()
            .expect("no rows");
        assert!(none.contains("`num_embeddings`"), "{none}");
    }

    /// Columns are found by name, in any case and order; others (an
    /// index a dataframe wrote, notes) are ignored.
    #[test]
    fn columns_in_any_order_and_others_ignored() {
        let good = row("a", "10", "8", "2", &GOOD_BINS);
        let want = parse(&good).unwrap();
        let mut cols = header();
        cols.reverse();
        let mut fields: Vec<&str> = good.split(',').collect();
        fields.reverse();
        let text = format!(",{},notes\n0,{},x\n", cols.join(","), fields.join(","));
        let got = read_from(text.as_bytes(), Path::new("df.csv")).unwrap();
        assert_eq!(got, want);
        let t = read_from(
            "Dim,note,NAME,Rows\n16,x,user,5000\n".as_bytes(),
            Path::new("m.csv"),
        )
        .unwrap();
        assert_eq!(
            (t[0].name.as_str(), t[0].rows, t[0].dim),
            ("user", 5000, 16)
        );
        let cols =
            Columns::find(&["", "name", "rows", "dim", "Note", "Note"].map(String::from)).unwrap();
        assert_eq!(cols.ignored, ["(unnamed)", "`Note`", "`Note`"]);
        assert_eq!(
            (cols.name, cols.rows, cols.dim, cols.pooling),
            (1, 2, 3, None)
        );
    }
}
