//! Writes the held-out suites of docs/results.md ("Held-out shapes"): tasks
//! drawn from the table space (common::space) with a seed pre-training
//! never uses, one suite per shape, each with its own pool CSV. With
//! `--more`, nine other shapes instead ("Fresh draws and other shapes"):
//! 4, 8 and 32 to 64 devices, 32 to 64 tables per device on 4 to 8
//! devices, 1 to 4 tables per device, hot, cold and wide tables only, and
//! memory at 1.05 times an even share.
//!
//! cargo run --release --example heldout_suites -- OUT_DIR [TASKS_PER_SUITE] [SEED] [--more]
use common::space::{SpaceConfig, Style};

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let more = args.iter().any(|a| a == "--more");
    args.retain(|a| a != "--more");
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
    let suites: Vec<(&str, SpaceConfig)> = if more {
        other_shapes(&full)
    } else {
        vec![
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
        ]
    };
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

/// The shapes of `--more`: each a part of the space the six above leave
/// out or mix with the rest.
fn other_shapes(full: &SpaceConfig) -> Vec<(&'static str, SpaceConfig)> {
    let devices = |lo: usize, hi: usize| SpaceConfig {
        devices_min: lo,
        devices_max: hi,
        ..full.clone()
    };
    let style = |s: Style| SpaceConfig {
        styles: vec![s],
        ..full.clone()
    };
    vec![
        ("space-4dev", devices(4, 4)),
        ("space-8dev", devices(8, 8)),
        ("space-32to64dev", devices(32, 64)),
        (
            "space-dense",
            SpaceConfig {
                per_device_min: 32,
                per_device_max: 64,
                ..devices(4, 8)
            },
        ),
        (
            "space-sparse",
            SpaceConfig {
                per_device_min: 1,
                per_device_max: 4,
                ..full.clone()
            },
        ),
        ("space-hot", style(Style::Hot)),
        ("space-cold", style(Style::Cold)),
        ("space-wide", style(Style::Wide)),
        (
            "space-tight1.05",
            SpaceConfig {
                share_min: 1.05,
                share_max: 1.05,
                roomy_share: 0.0,
                ..full.clone()
            },
        ),
    ]
}
