//! What `plan`'s guard chose on each task of a suite, and what it would have
//! measured: per task, every candidate's mean and pessimistic prediction and
//! its `sim` measurement, the candidate chosen, and the doubts. Tasks where
//! the choice measured over 1 % above the best candidate are marked `!`.
//!
//! cargo run --release --example guard_diag -- RUN_DIR SUITE

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let suite = common::Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    for task in &suite.tasks {
        let mut g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
        let chosen = g.chosen;
        model::guard::verify(&mut g, &task.tables, oracle.as_mut())?;
        let best = g.candidates[g.chosen].measured.unwrap_or(f64::NAN);
        let got = g.candidates[chosen].measured.unwrap_or(f64::NAN);
        let mark = if got > best * 1.01 { "!" } else { " " };
        println!(
            "{mark} {} ({} tables, {} devices): chose {} {:+.2} % vs the measured best",
            task.name,
            task.tables.len(),
            task.devices,
            g.candidates[chosen].method,
            (got / best - 1.0) * 100.0
        );
        for c in &g.candidates {
            println!(
                "    {:12} predicted {:9.3} (max {:9.3}) measured {:9.3} members {:?}",
                c.method,
                c.mean(),
                c.pessimistic(),
                c.measured.unwrap_or(f64::NAN),
                c.predicted
            );
        }
        for d in &g.doubts {
            println!("    doubt: {d}");
        }
    }
    Ok(())
}
