//! Writes the held-out suites of docs/results.md ("Held-out shapes"): tasks
//! drawn from the table space (common::space) with a seed pre-training
//! never uses, one suite per shape, each with its own pool CSV.
//!
//! cargo run --release --example heldout_suites -- OUT_DIR [TASKS_PER_SUITE] [SEED]
use common::space::{SpaceConfig, Style};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = std::path::PathBuf::from(args.first().map_or("data/heldout", String::as_str));
    let n: usize = args.get(1).map_or(Ok(20), |s| s.parse())?;
    let seed: u64 = args.get(2).map_or(Ok(1_000_003), |s| s.parse())?;
    let mem = common::MemoryModel::default();
    let full = SpaceConfig::default();
    let devices = |d: usize| SpaceConfig {
        devices_min: d,
        devices_max: d,
        ..full.clone()
    };
    let suites: Vec<(&str, SpaceConfig)> = vec![
        ("space-2dev", devices(2)),
        ("space-3dev", devices(3)),
        ("space-6dev", devices(6)),
        ("space-16dev", devices(16)),
        (
            "space-tight1.1",
            SpaceConfig {
                share_min: 1.1,
                share_max: 1.1,
                roomy_share: 0.0,
                ..full.clone()
            },
        ),
        (
            "space-trace",
            SpaceConfig {
                styles: vec![Style::TraceLike],
                ..full.clone()
            },
        ),
    ];
    std::fs::create_dir_all(&out)?;
    for (k, (name, space)) in suites.iter().enumerate() {
        space.validate()?;
        let tasks = common::space::tasks(space, n, seed + k as u64, name, &mem);
        let pool_name = format!("{name}.csv");
        let (pool, suite) = common::space::suite(&tasks, &pool_name);
        common::pool::write(&out.join(&pool_name), &pool)?;
        let path = out.join(format!("{name}.json"));
        common::suite::write(&path, &suite)?;
        let tables: Vec<usize> = tasks.iter().map(|t| t.tables.len()).collect();
        println!(
            "wrote {} ({} tasks, {} to {} tables)",
            path.display(),
            tasks.len(),
            tables.iter().min().unwrap_or(&0),
            tables.iter().max().unwrap_or(&0)
        );
    }
    Ok(())
}
