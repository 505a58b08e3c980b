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
//! cargo run --release --example user_suites -- OUT_DIR [TASKS_PER_SUITE] [SEED]
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = std::path::PathBuf::from(args.first().map_or("data/user", String::as_str));
    let n: usize = args.get(1).map_or(Ok(20), |s| s.parse())?;
    let seed: u64 = args.get(2).map_or(Ok(11_000_003), |s| s.parse())?;
    let mem = common::MemoryModel::default();
    let mult4: Vec<u32> = (12..=256).step_by(4).collect();
    let odd: Vec<u32> = mult4
        .iter()
        .copied()
        .filter(|d| !d.is_power_of_two())
        .collect();
    let sets: [(&str, Vec<u32>); 3] = [
        ("pow", vec![16, 32, 64, 128]),
        ("odd", odd),
        ("mult4", mult4),
    ];
    let shapes = [(120, 8), (120, 4), (250, 16)];
    std::fs::create_dir_all(&out)?;
    let mut k = 0u64;
    for (set, dims) in &sets {
        for &(tables, devices) in &shapes {
            for share in [1.2, 2.0] {
                k += 1;
                let name = format!("user-{set}-{tables}x{devices}-share{share}");
                let mut rng = ChaCha8Rng::seed_from_u64(seed + k);
                let (csv, suite) = draw(&name, dims, tables, devices, share, n, &mut rng, &mem)?;
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

/// One suite's pool CSV and tasks.
#[allow(clippy::too_many_arguments)]
fn draw(
    name: &str,
    dims: &[u32],
    tables: usize,
    devices: usize,
    share: f64,
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
            let rows = 10f64.powf(rng.gen_range(3.0..7.0)) as u64;
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
            let pooling = (10f64.powf(rng.gen_range(0.0..2.0)) * 100.0).round() / 100.0;
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
