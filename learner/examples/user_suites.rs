//! Writes held-out suites of tables as a user's CSV gives them: `name,
//! rows, dim, pooling_factor` and no reuse bins, so that loading takes the
//! trace's default bins (`common::generate::default_bins`), as `learner
//! plan --tables` does. Rows are log-uniform in 10³–10⁷ and pooling in
//! 1–100. The dims of a suite come from one of three sets:
//!
//! - `pow`: 16, 32, 64 and 128, the DLRM-like pool's;
//! - `odd`: the multiples of 4 from 12 to 256 that are not powers of two;
//! - `mult4`: every multiple of 4 from 12 to 256.
//!
//! A table takes the dim of its set nearest a log-uniform draw. Memory per device is `share` times an
//! even share of the task's tables (`common::suite::share_memory_gb`),
//! 1.2 or 2. One suite per set, shape and share, each with its own pool.
//!
//! `--other` draws another family, to check that what holds on the first
//! is not tuned to it: rows log-uniform in 10⁴–10^7.5, pooling in 0.5–50,
//! dims from `x8` (every multiple of 8 from 8 to 512) or `pow` (8 to 512),
//! 40 tables on 2 devices, 200 on 16 and 480 on 32, at 1.1 or 3 times an
//! even share.
//!
//! cargo run --release --example user_suites -- OUT_DIR [TASKS_PER_SUITE] [SEED] [--other]
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let other = args.iter().any(|a| a == "--other");
    args.retain(|a| a != "--other");
    let out = std::path::PathBuf::from(args.first().map_or("data/user", String::as_str));
    let n: usize = args.get(1).map_or(Ok(20), |s| s.parse())?;
    let seed: u64 = args.get(2).map_or(Ok(11_000_003), |s| s.parse())?;
    let mem = common::MemoryModel::default();
    let family = if other {
        Family::other()
    } else {
        Family::first()
    };
    std::fs::create_dir_all(&out)?;
    let mut k = 0u64;
    for (set, dims) in &family.sets {
        for &(tables, devices) in &family.shapes {
            for share in family.shares {
                k += 1;
                let name = format!("{}-{set}-{tables}x{devices}-share{share}", family.prefix);
                let mut rng = ChaCha8Rng::seed_from_u64(seed + k);
                let (csv, suite) = draw(
                    &family,
                    &name,
                    dims,
                    (tables, devices, share),
                    n,
                    &mut rng,
                    &mem,
                )?;
                let pool_name = format!("{name}.csv");
                std::fs::write(out.join(&pool_name), csv)?;
                let suite = common::suite::SuiteFile {
                    pool: pool_name,
                    tasks: suite,
                };
                common::suite::write(&out.join(format!("{name}.json")), &suite)?;
            }
        }
    }
    println!("wrote {k} suites of {n} tasks to {}", out.display());
    Ok(())
}

/// What a family of suites draws.
struct Family {
    prefix: &'static str,
    /// Named sets of dims.
    sets: Vec<(&'static str, Vec<u32>)>,
    /// Tables and devices of a task.
    shapes: Vec<(usize, usize)>,
    shares: [f64; 2],
    /// `log10` of the rows, lowest and highest.
    log10_rows: (f64, f64),
    /// `log10` of the pooling, lowest and highest.
    log10_pooling: (f64, f64),
}

impl Family {
    fn first() -> Family {
        let mult4: Vec<u32> = (12..=256).step_by(4).collect();
        let odd: Vec<u32> = mult4
            .iter()
            .copied()
            .filter(|d| !d.is_power_of_two())
            .collect();
        Family {
            prefix: "user",
            sets: vec![
                ("pow", vec![16, 32, 64, 128]),
                ("odd", odd),
                ("mult4", mult4),
            ],
            shapes: vec![(120, 8), (120, 4), (250, 16)],
            shares: [1.2, 2.0],
            log10_rows: (3.0, 7.0),
            log10_pooling: (0.0, 2.0),
        }
    }

    fn other() -> Family {
        Family {
            prefix: "other",
            sets: vec![
                ("x8", (8..=512).step_by(8).collect()),
                ("pow", vec![8, 16, 32, 64, 128, 256, 512]),
            ],
            shapes: vec![(40, 2), (200, 16), (480, 32)],
            shares: [1.1, 3.0],
            log10_rows: (4.0, 7.5),
            log10_pooling: (-0.3, 1.7),
        }
    }
}

/// One suite's pool CSV and tasks: `shape` is tables, devices and share.
fn draw(
    family: &Family,
    name: &str,
    dims: &[u32],
    (tables, devices, share): (usize, usize, f64),
    n: usize,
    rng: &mut ChaCha8Rng,
    mem: &common::MemoryModel,
) -> anyhow::Result<(String, Vec<common::suite::TaskSpec>)> {
    let mut csv = String::from("name,rows,dim,pooling_factor\n");
    let mut tasks = Vec::new();
    let (lo, hi) = ((dims[0] as f64).ln(), (dims[dims.len() - 1] as f64).ln());
    for t in 0..n {
        let task = format!("{name}-{t:04}");
        let mut drawn = Vec::new();
        for i in 0..tables {
            let rows = 10f64.powf(rng.gen_range(family.log10_rows.0..family.log10_rows.1)) as u64;
            // Log-uniform over the set: the member nearest a log-uniform draw.
            let target = rng.gen_range(lo..=hi).exp();
            let dim = *dims
                .iter()
                .min_by(|a, b| {
                    (**a as f64 - target)
                        .abs()
                        .total_cmp(&(**b as f64 - target).abs())
                })
                .expect("a dim set is not empty");
            let (lo_p, hi_p) = family.log10_pooling;
            let pooling = (10f64.powf(rng.gen_range(lo_p..hi_p)) * 100.0).round() / 100.0;
            let table = format!("{task}/t{i}");
            writeln!(csv, "{table},{rows},{dim},{pooling}")?;
            // Memory depends on rows and dim alone; loading the CSV adds the bins.
            drawn.push(common::Table::cold(table, rows, dim, pooling));
        }
        let memory_gb = common::suite::share_memory_gb(&drawn, devices, share, mem);
        tasks.push(common::suite::TaskSpec {
            name: task,
            devices,
            memory_gb,
            tables: drawn.into_iter().map(|t| t.name).collect(),
        });
    }
    Ok((csv, tasks))
}
