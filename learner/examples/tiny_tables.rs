//! Copies suites with one to three tables of a few rows added to each
//! task, as a DLRM model's day of the week or hour: 2 to 31 rows, dims 4
//! to 32, and either the default pooling of a CSV without that column
//! (15.8) or 1 to 5. Each table takes the reuse bins a CSV without bin
//! columns gives it (`common::generate::default_bins`). Memory per device
//! is unchanged: the tables need a few KiB. Each suite gets a pool of its
//! own, `tiny-NAME.csv`, beside `tiny-NAME.json` in OUT_DIR.
//!
//! cargo run --release --example tiny_tables -- OUT_DIR SEED SUITE...
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 3, "usage: tiny_tables OUT_DIR SEED SUITE...");
    let out = std::path::Path::new(&args[0]);
    let seed: u64 = args[1].parse()?;
    let mem = common::MemoryModel::default();
    std::fs::create_dir_all(out)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for path in &args[2..] {
        let path = std::path::Path::new(path);
        let suite = common::Suite::load(path, &mem)?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| anyhow::anyhow!("{}: no file name", path.display()))?;
        let mut csv = String::from("name,rows,dim,pooling_factor");
        for k in 0..common::NUM_BINS {
            write!(csv, ",bin_{k}")?;
        }
        csv.push('\n');
        let mut tasks = Vec::new();
        let mut written = std::collections::HashSet::new();
        for task in &suite.tasks {
            let mut tables = task.tables.clone();
            for i in 0..rng.gen_range(1..=3) {
                let rows = [2, 3, 4, 7, 7, 12, 24, 31][rng.gen_range(0..8)];
                let dim = [4, 8, 8, 16, 32][rng.gen_range(0..5)];
                let pooling = match rng.gen_bool(0.5) {
                    true => common::generate::published::mean_pooling(),
                    false => [1.0, 1.0, 2.0, 5.0][rng.gen_range(0..4)],
                };
                let mut t =
                    common::Table::cold(format!("{}/tiny{i}", task.name), rows, dim, pooling);
                t.bins = common::generate::default_bins(rows, pooling);
                tables.push(t);
            }
            for t in &tables {
                // Tasks may share tables: each once in the pool.
                if written.insert(t.name.clone()) {
                    write!(csv, "{},{},{},{}", t.name, t.rows, t.dim, t.pooling_factor)?;
                    for b in t.bins {
                        write!(csv, ",{b}")?;
                    }
                    csv.push('\n');
                }
            }
            tasks.push(common::suite::TaskSpec {
                name: task.name.clone(),
                devices: task.devices,
                memory_gb: task.memory_gb,
                tables: tables.iter().map(|t| t.name.clone()).collect(),
            });
        }
        let pool = format!("tiny-{stem}.csv");
        std::fs::write(out.join(&pool), csv)?;
        let file = common::suite::SuiteFile { pool, tasks };
        common::suite::write(&out.join(format!("tiny-{stem}.json")), &file)?;
    }
    println!("wrote {} suites to {}", args.len() - 2, out.display());
    Ok(())
}
