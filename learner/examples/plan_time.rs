//! Times `Model::plan` (after loading and one warm-up call) for a pool CSV
//! under several `model.plan_*` settings: min and median over 15 calls.
//!
//! cargo run --release --example plan_time -- RUN_DIR TABLES_CSV DEVICES MEMORY_GB
fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, mut model) = learner::checkpoint::load_run(run)?;
    let task = common::Task {
        name: args[1].clone(),
        devices: args[2].parse()?,
        memory_gb: args[3].parse()?,
        tables: common::pool::read(std::path::Path::new(&args[1]))?,
    };
    for (k, moves, heur) in [
        (1, 0, false),
        (1, 10, true),
        (4, 10, true),
        (8, 10, true),
        (16, 10, true),
        (32, 10, true),
    ] {
        model.plan_cfg.plan_samples = k;
        model.plan_cfg.plan_moves = moves;
        model.plan_cfg.plan_heuristics = heur;
        model.plan(&task, &cfg.memory);
        let mut t: Vec<f64> = (0..15)
            .map(|_| {
                let s = std::time::Instant::now();
                model.plan(&task, &cfg.memory);
                s.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        t.sort_by(f64::total_cmp);
        println!(
            "K={k:2} moves={moves:2} heuristics={heur:5}: min {:.2} ms, median {:.2} ms",
            t[0], t[7]
        );
    }
    Ok(())
}
